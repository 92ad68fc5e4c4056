"""Which signals a confidence model reads: ``FeatureSpec``, the answer-level signals and groups.

The signals come in optional groups (a request may have no lookback score, no
claims, no log-probabilities or no certification); each group has a
``<group>_missing`` indicator that is 1 when any of its values is ``None``. A
signal outside every group (retrieval scores, answer length) is expected on
every request. :data:`ANSWER_SPEC` (:data:`FEATURES`) is the answer-level
spec; other forecasters (per-chunk) bring their own. numpy + pydantic only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sidecar.confidence.errors import ConfidenceDataError
from sidecar.confidence.logistic import FloatArray

__all__ = [
    "ANSWER_SPEC",
    "FEATURES",
    "MISSING_GROUPS",
    "SIGNALS",
    "FeatureSpec",
    "FeatureValues",
    "feature_matrix",
    "feature_vector",
    "signal_value",
]

FeatureValues = Mapping[str, float | None]


def signal_value(name: str, value: object) -> float:
    """``value`` as a float (a bool as 0/1); ``ConfidenceDataError`` unless finite."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfidenceDataError(
            f"feature {name!r} must be a finite number or None, got {value!r}"
        )
    return float(value)


class FeatureSpec(BaseModel):
    """The signals a model reads, in input order, and its missing-value indicator groups.

    The model input is ``signals + tuple(missing_groups)``: each indicator name maps
    to the signals it covers (a signal belongs to at most one group).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    signals: tuple[str, ...] = Field(min_length=1)
    missing_groups: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> FeatureSpec:
        names = self.names
        if len(set(names)) != len(names):
            raise ValueError(f"feature names must be unique, got {list(names)}")
        grouped: list[str] = [m for members in self.missing_groups.values() for m in members]
        if len(set(grouped)) != len(grouped):
            raise ValueError("a signal may belong to at most one missing group")
        for indicator, members in self.missing_groups.items():
            unknown = [m for m in members if m not in self.signals]
            if not members or unknown:
                raise ValueError(
                    f"missing group {indicator!r} must list known signals, got {list(members)}"
                )
        return self

    @property
    def names(self) -> tuple[str, ...]:
        """The model input: the signals, then one indicator per group."""
        return self.signals + tuple(self.missing_groups)

    def vector(self, values: FeatureValues) -> FloatArray:
        """The input before imputation: ``len(names)`` floats, NaN where a value is None.

        A signal absent from ``values`` counts as ``None``; an indicator is 1.0 when
        any signal of its group is None. Unknown names or a non-finite value raise
        :class:`ConfidenceDataError`.
        """
        unknown = sorted(set(values) - set(self.signals))
        if unknown:
            raise ConfidenceDataError(f"unknown features {unknown}; allowed: {list(self.signals)}")
        x = np.full(len(self.names), np.nan, dtype=np.float64)
        for i, name in enumerate(self.signals):
            value = values.get(name)
            if value is not None:
                x[i] = signal_value(name, value)
        index = {name: i for i, name in enumerate(self.signals)}
        for j, members in enumerate(self.missing_groups.values(), start=len(self.signals)):
            x[j] = float(any(np.isnan(x[index[m]]) for m in members))
        return x

    def matrix(self, values_list: Sequence[FeatureValues]) -> FloatArray:
        """:meth:`vector` of each row, stacked: shape ``(n, len(names))``."""
        if not values_list:
            return np.empty((0, len(self.names)), dtype=np.float64)
        return np.vstack([self.vector(v) for v in values_list])

    def mismatch(self, feature_names: object, missing_groups: object) -> str | None:
        """How a model's stored features differ from this spec, or None when they match."""
        if not isinstance(feature_names, list | tuple):
            return f"feature_names must be a list, got {type(feature_names).__name__}"
        got = [str(n) for n in feature_names]
        if tuple(got) != self.names:
            missing = [n for n in self.names if n not in got]
            extra = [n for n in got if n not in self.names]
            detail = f"missing {missing}, unexpected {extra}" if missing or extra else "order"
            return f"the model's features differ ({detail}); expected {list(self.names)}"
        groups = missing_groups if isinstance(missing_groups, Mapping) else None
        expected = {k: list(v) for k, v in self.missing_groups.items()}
        if groups is None or {str(k): list(v) for k, v in groups.items()} != expected:
            return f"the model's missing groups are {missing_groups!r}, expected {expected}"
        return None


SIGNALS: Final[tuple[str, ...]] = (
    "retrieval_top_score",
    "retrieval_margin",
    "retrieval_mean_score",
    "m1",
    "m2",
    "lookback_p",
    "claims_reliability",
    "claims_hallucination_rate",
    "mean_token_logprob",
    "answer_words_log1p",
)
"""The answer-level signals a caller supplies, in model-input order."""

MISSING_GROUPS: Final[Mapping[str, tuple[str, ...]]] = {
    "lookback_missing": ("lookback_p",),
    "claims_missing": ("claims_reliability", "claims_hallucination_rate"),
    "logprob_missing": ("mean_token_logprob",),
    "certification_missing": ("m1", "m2"),
}
"""Indicator name -> the optional answer-level signals it covers."""

ANSWER_SPEC: Final = FeatureSpec(signals=SIGNALS, missing_groups=dict(MISSING_GROUPS))
"""The answer-level forecaster's features (the default everywhere)."""

FEATURES: Final[tuple[str, ...]] = ANSWER_SPEC.names
"""The answer-level model input: the signals, then one missing indicator per optional group."""


def feature_vector(values: FeatureValues, spec: FeatureSpec = ANSWER_SPEC) -> FloatArray:
    """``spec.vector(values)``: NaN for each None, indicators set (:meth:`FeatureSpec.vector`)."""
    return spec.vector(values)


def feature_matrix(
    values_list: Sequence[FeatureValues], spec: FeatureSpec = ANSWER_SPEC
) -> FloatArray:
    """``spec.matrix(values_list)``: shape ``(n, len(spec.names))``."""
    return spec.matrix(values_list)
