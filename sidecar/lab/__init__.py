"""The lab: what fits and measures the serving artifacts; `guardrail run` never imports it.

One folder per learned artifact, each the fit side of a serving module (fit -> artifact -> serve):

- :mod:`sidecar.lab.conformal` -- ground truth and the calibration recipe of
  :mod:`sidecar.conformal`;
- :mod:`sidecar.lab.lookback` -- the lookback dataset, training and evaluation of
  :mod:`sidecar.lookback`;
- :mod:`sidecar.lab.verifier` -- data, training, calibration fitting and evaluation of the
  claim verifier served by :mod:`sidecar.claims`;
- :mod:`sidecar.lab.confidence` -- the fit of :mod:`sidecar.confidence`'s model.

Beside them the tools that feed and exercise those fits: ``retrieval`` (corpus, embedder,
Qdrant), ``generator`` (SmolLM2 and the attention summariser), ``report`` (outcome rows, the
evaluation report, the leakage probe), ``bench``, ``chaos``, ``localkafka`` (the real broker),
``demo`` and ``replay``.
"""
