"""Retrieval adapters: NQ-open-format corpora, the MiniLM embedder, the Qdrant index.

These modules do I/O (files, Qdrant, torch); the conformal maths they feed lives
in :mod:`sidecar.conformal` and never imports them. torch and transformers are
imported only inside :class:`sidecar.lab.retrieval.embedder.MiniLMEmbedder`.
"""
