"""Conformal certification of retrieved chunks (docs/methods.md §Retrieval certification).

Pure logic (numpy and pydantic only; no Qdrant, ONNX or Kafka):

- :mod:`~sidecar.conformal.quantile` -- the exact order statistic q_hat (eq. 2);
- :mod:`~sidecar.conformal.normalise` -- global min-max normalisation;
- :mod:`~sidecar.conformal.calibrator` -- fit -> calibrate -> predict, metrics, alpha-sweep;
- :mod:`~sidecar.conformal.mondrian` -- per (tenant, collection, retriever) calibration;
- :mod:`~sidecar.conformal.artifact`, :mod:`~sidecar.conformal.registry` -- the versioned
  calibration file and the choice of calibration per event;
- :mod:`~sidecar.conformal.certify` -- the per-event certificate (eqs. 4-6);
- :mod:`~sidecar.conformal.monitor` -- rolling mean(m1) with a Wilson-interval alarm.

:mod:`~sidecar.conformal.storage` is the one module that touches files. The ground truth
(eq. 1) and the calibration recipe are fit-time only: :mod:`sidecar.lab.conformal`.
"""

from sidecar.conformal.artifact import CalibrationArtifact, build_artifact
from sidecar.conformal.calibrator import (
    ConformalCalibration,
    RetrievalCalibrator,
    RetrievalMetrics,
    SweepPoint,
    alpha_sweep,
    evaluate,
)
from sidecar.conformal.certify import Certification, certify
from sidecar.conformal.mondrian import (
    CalibrationKey,
    FallbackReason,
    MondrianCalibration,
    MondrianCalibrator,
)
from sidecar.conformal.monitor import ExchangeabilityMonitor, MonitorState, MonitorStatus
from sidecar.conformal.quantile import as_alpha, conformal_quantile, order_statistic_rank
from sidecar.conformal.registry import (
    CalibrationRegistry,
    ResolvedCalibration,
    UnknownCollectionPolicy,
)
from sidecar.conformal.storage import load_artifact, save_artifact

__all__ = [
    "CalibrationArtifact",
    "CalibrationKey",
    "CalibrationRegistry",
    "Certification",
    "ConformalCalibration",
    "ExchangeabilityMonitor",
    "FallbackReason",
    "MondrianCalibration",
    "MondrianCalibrator",
    "MonitorState",
    "MonitorStatus",
    "ResolvedCalibration",
    "RetrievalCalibrator",
    "RetrievalMetrics",
    "SweepPoint",
    "UnknownCollectionPolicy",
    "alpha_sweep",
    "as_alpha",
    "build_artifact",
    "certify",
    "conformal_quantile",
    "evaluate",
    "load_artifact",
    "order_statistic_rank",
    "save_artifact",
]
