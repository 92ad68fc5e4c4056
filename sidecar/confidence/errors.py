"""The error the confidence maths raises for data it cannot use: the project's :class:`DataError`.

Bad probabilities, labels or feature rows are told apart from bad configuration
(:class:`~sidecar.exceptions.ConfigError`) and from broken artifacts
(:class:`~sidecar.exceptions.ArtifactError`); the metrics of :mod:`sidecar.stats.metrics`
raise the same class.
"""

from __future__ import annotations

from sidecar.exceptions import DataError

__all__ = ["ConfidenceDataError"]

ConfidenceDataError = DataError
