"""Streaming claim verification (docs/methods.md §Claim verification).

Pure logic: ``sentences`` / ``segment`` (atomic claims with spans, mid-stream),
``context`` (the claims a claim opening with a pronoun leans on),
``evidence`` (best trusted sentences per claim), ``rules`` (numbers and dates),
``calibration`` (temperature + uncertain band), ``scores`` (reliability and
hallucination rate), ``checker`` (the processor's ``ClaimChecker``).
Adapters: ``verifier`` (onnxruntime + tokenizers), ``judge`` (optional LLM over
HTTP). The verifier's data, training and evaluation are the lab's
(:mod:`sidecar.lab.verifier`). Nothing here is imported by this ``__init__``.
"""
