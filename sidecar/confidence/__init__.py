"""Calibrated answer confidence and the retrieval-coverage hallucination bound.

- :mod:`~sidecar.confidence.logistic` -- logistic regression by Newton/IRLS in numpy;
- :mod:`~sidecar.confidence.calibration` -- Platt and isotonic calibrators, chosen by
  cross-validated NLL;
- :mod:`~sidecar.confidence.model` -- the served forecaster ``ConfidenceModel``
  (file format ``confidence-model/1``) and its ``FeatureSpec`` (answer-level by default);
- :mod:`~sidecar.confidence.bound` -- ``H <= c * eps + (1 - c) * delta`` (seed 003) with
  Wilson intervals, and the rolling per-key ``CoverageTracker``.

The model's fit (fit, then calibrate on a disjoint part) is the lab's
(:mod:`sidecar.lab.confidence`). ECE, Brier, NLL and reliability bins (CalibRAG A.3.1)
are :mod:`sidecar.stats.metrics`'s, re-exported here. Serving needs numpy and pydantic
only: no scikit-learn, scipy or torch.
"""

from sidecar.confidence.bound import BoundReport, CoverageCounts, CoverageTracker, coverage_bound
from sidecar.confidence.calibration import (
    CalibratorChoice,
    IsotonicCalibrator,
    PlattCalibrator,
    calibrator_from_dict,
    choose_calibrator,
    fit_isotonic,
    fit_platt,
)
from sidecar.confidence.errors import ConfidenceDataError
from sidecar.confidence.model import (
    ANSWER_SPEC,
    FEATURES,
    ConfidenceModel,
    FeatureSpec,
    feature_matrix,
    feature_vector,
)
from sidecar.stats.metrics import ReliabilityBin, brier, ece, nll, reliability_bins

__all__ = [
    "ANSWER_SPEC",
    "FEATURES",
    "BoundReport",
    "CalibratorChoice",
    "ConfidenceDataError",
    "ConfidenceModel",
    "CoverageCounts",
    "CoverageTracker",
    "FeatureSpec",
    "IsotonicCalibrator",
    "PlattCalibrator",
    "ReliabilityBin",
    "brier",
    "calibrator_from_dict",
    "choose_calibrator",
    "coverage_bound",
    "ece",
    "feature_matrix",
    "feature_vector",
    "fit_isotonic",
    "fit_platt",
    "nll",
    "reliability_bins",
]
