"""Lookback-ratio factuality: features, training, serving.

The method and its source: docs/methods.md §Lookback-ratio factuality.

- :mod:`~sidecar.lookback.features` -- select trusted chunks, zero-pad to L x H x K,
  per-sample [0, 1] scaling (pure numpy);
- :mod:`~sidecar.lookback.labels` -- NQ-open answer normalisation and correctness;
- :mod:`~sidecar.lookback.metrics` -- AUROC without scikit-learn;
- :mod:`~sidecar.lookback.dataset` -- the resumable on-disk dataset and the fit / eval
  question split;
- :mod:`~sidecar.lookback.artifact` -- ``metadata.json`` of a model directory;
- :mod:`~sidecar.lookback.training` -- logistic regression, ONNX export, parity check
  (scikit-learn and skl2onnx: the ``train`` extra; not imported here);
- :mod:`~sidecar.lookback.serving` -- ``OnnxLookbackScorer``, the sidecar's
  ``LookbackScorer`` (onnxruntime, imported when a scorer is built);
- :mod:`~sidecar.lookback.evaluation` -- held-out AUROC through the serving path.

The attention summaries themselves are computed on the generator side
(:mod:`sidecar.generator.lookback`); nothing here imports torch.
"""

from sidecar.lookback.artifact import LookbackModelMetadata, load_metadata
from sidecar.lookback.features import SCALING, feature_matrix, feature_vector
from sidecar.lookback.serving import LookbackRequest, OnnxLookbackScorer

__all__ = [
    "SCALING",
    "LookbackModelMetadata",
    "LookbackRequest",
    "OnnxLookbackScorer",
    "feature_matrix",
    "feature_vector",
    "load_metadata",
]
