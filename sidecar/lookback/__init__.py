"""Lookback-ratio factuality: features, artifact, serving.

The method and its source: docs/methods.md §Lookback-ratio factuality.

- :mod:`~sidecar.lookback.features` -- select trusted chunks, zero-pad to L x H x K,
  per-sample [0, 1] scaling (pure numpy);
- :mod:`~sidecar.lookback.metrics` -- AUROC without scikit-learn;
- :mod:`~sidecar.lookback.artifact` -- ``metadata.json`` of a model directory;
- :mod:`~sidecar.lookback.serving` -- ``OnnxLookbackScorer``, the sidecar's
  ``LookbackScorer`` (onnxruntime, imported when a scorer is built).

The dataset, training (logistic regression, ONNX export, parity check) and evaluation are
the lab's (:mod:`sidecar.lab.lookback`); the attention summaries themselves are computed on
the generator side (:mod:`sidecar.lab.generator.lookback`); nothing here imports torch.
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
