"""The error the confidence maths raises for data it cannot use.

:class:`ConfidenceDataError` is both a :class:`~sidecar.exceptions.GuardrailError`
(callers branch on the project's classes) and a :class:`ValueError` (the
conventional type for "this argument has the right type but a wrong value"), so
bad probabilities, labels or feature rows are told apart from bad configuration
(:class:`~sidecar.exceptions.ConfigError`) and from broken artifacts
(:class:`~sidecar.exceptions.ArtifactError`).
"""

from __future__ import annotations

from sidecar.exceptions import GuardrailError

__all__ = ["ConfidenceDataError"]


class ConfidenceDataError(GuardrailError, ValueError):
    """Probabilities, scores, labels or feature values that violate a documented contract."""
