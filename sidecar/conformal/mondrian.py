"""Mondrian (per-category) conformal calibration by (tenant, collection, retriever).

Exchangeability is more plausible inside one category than across a fleet: a
different collection or retriever has a different score scale and a different
share of correct chunks. Mondrian conformal prediction calibrates each category
on its own data (its own n1, n2 and q_hat, eqs. 1-2 of
docs/methods.md §Retrieval certification), which keeps the
guarantee of eq. (3) per category. A category whose correct chunks are too few
for the requested alpha (``k = ceil((n+1)(1-alpha)) > n``) or whose scores cannot
be normalised falls back to the global calibration over all categories; the
result records which calibration is used and why (:class:`KeyCalibration`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from types import MappingProxyType
from typing import NamedTuple, Self

from sidecar.conformal.calibrator import (
    BoolArray,
    ConformalCalibration,
    LabelRows,
    RetrievalCalibrator,
    ScoreRows,
)
from sidecar.conformal.normalise import MinMaxNormaliser
from sidecar.conformal.quantile import AlphaLike, as_alpha
from sidecar.exceptions import InputError, LifecycleError

__all__ = [
    "GLOBAL_KEY_LABEL",
    "CalibrationKey",
    "FallbackReason",
    "KeyCalibration",
    "MondrianCalibration",
    "MondrianCalibrator",
    "key_label",
    "key_part",
    "split_label",
]

GLOBAL_KEY_LABEL = "global"
"""How certifications and the monitor name the calibration pooled over all keys."""


def key_part(text: str) -> str:
    """A tenant, collection or retriever as it stands in a key's label: ``%`` and ``/``
    percent-escaped, so two keys never share a label (audit: tenant ``org`` with collection
    ``team/nq`` and tenant ``org/team`` with ``nq`` shared one, and one tenant's lists of
    rising scores stopped the other's chunks from being certified)."""
    if "/" not in text and "%" not in text:
        return text
    return text.replace("%", "%25").replace("/", "%2F")


def key_label(tenant: str, collection: str, retriever: str) -> str:
    """``tenant/collection/retriever``, each part escaped by :func:`key_part`."""
    return f"{key_part(tenant)}/{key_part(collection)}/{key_part(retriever)}"


def split_label(label: str) -> tuple[str, str, str] | None:
    """The parts of a :func:`key_label` (``None``: not three parts)."""
    parts = label.split("/")
    if len(parts) != 3:
        return None
    tenant, collection, retriever = (p.replace("%2F", "/").replace("%25", "%") for p in parts)
    return tenant, collection, retriever


class CalibrationKey(NamedTuple):
    """The Mondrian category of a retrieval event."""

    tenant: str
    collection: str
    retriever: str

    @property
    def label(self) -> str:
        """``tenant/collection/retriever`` (:func:`key_label`)."""
        return key_label(self.tenant, self.collection, self.retriever)


class FallbackReason(StrEnum):
    """Why the global calibration is used instead of the event's own key."""

    TOO_FEW_SAMPLES = "too-few-samples"
    """The key's correct chunks are fewer than alpha needs (k > n)."""
    DEGENERATE_SCORES = "degenerate-scores"
    """The key's calibration scores are all equal: no min-max normalisation."""
    UNKNOWN_KEY = "unknown-key"
    """The collection is calibrated, but not for this tenant / retriever."""
    UNKNOWN_COLLECTION = "unknown-collection"
    """The collection was not in the calibration data at all."""


@dataclass(frozen=True, slots=True)
class KeyCalibration:
    """One key's own calibration (if it could be computed) and whether it is used."""

    key: CalibrationKey
    n_questions: int
    own: ConformalCalibration | None
    fallback_reason: FallbackReason | None
    detail: str

    @property
    def uses_global(self) -> bool:
        """True when events of this key are certified with the global calibration."""
        return self.fallback_reason is not None


@dataclass(frozen=True, slots=True)
class MondrianCalibration:
    """The global calibration plus one :class:`KeyCalibration` per key seen."""

    alpha: Fraction
    global_calibration: ConformalCalibration
    keys: Mapping[CalibrationKey, KeyCalibration] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def select(self, key: CalibrationKey) -> tuple[ConformalCalibration, KeyCalibration | None]:
        """The calibration for a *known* key and its entry; global and ``None`` if unknown."""
        entry = self.keys.get(key)
        if entry is None or entry.own is None or entry.uses_global:
            return self.global_calibration, entry
        return entry.own, entry


def _check_keys(keys: Sequence[CalibrationKey], n_rows: int) -> None:
    if len(keys) != n_rows:
        raise InputError(
            "shape-mismatch", f"got {len(keys)} keys for {n_rows} questions; need one per question"
        )
    for i, key in enumerate(keys):
        if not all(isinstance(part, str) and part for part in key):
            raise InputError(
                "invalid-key",
                f"question {i}: key parts must be non-empty strings "
                f"(tenant, collection, retriever), got {tuple(key)!r}",
            )


def _rows_by_key(keys: Sequence[CalibrationKey]) -> dict[CalibrationKey, list[int]]:
    groups: dict[CalibrationKey, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(CalibrationKey(*key), []).append(i)
    return groups


class MondrianCalibrator:
    """fit -> calibrate -> predict per key, with a reported fallback to the global calibration."""

    def __init__(self, alpha: AlphaLike) -> None:
        self.alpha: Fraction = as_alpha(alpha)
        self._global: RetrievalCalibrator | None = None
        self._per_key: dict[CalibrationKey, RetrievalCalibrator | InputError] = {}
        self._fit_keys: dict[CalibrationKey, list[int]] = {}
        self._result: MondrianCalibration | None = None

    def fit(self, scores: ScoreRows, keys: Sequence[CalibrationKey]) -> Self:
        """Fit the global normalisation and one per key (a degenerate key is recorded)."""
        _check_keys(keys, len(scores))
        self._global = RetrievalCalibrator(self.alpha).fit(scores)
        self._fit_keys = _rows_by_key(keys)
        self._per_key = {}
        for key, rows in self._fit_keys.items():
            try:
                self._per_key[key] = RetrievalCalibrator(self.alpha).fit([scores[i] for i in rows])
            except InputError as exc:
                if exc.reason != "degenerate-scores":
                    raise
                self._per_key[key] = exc
        self._result = None
        return self

    def calibrate(
        self, scores: ScoreRows, labels: LabelRows, keys: Sequence[CalibrationKey]
    ) -> Self:
        """q_hat globally and per key (eq. 2); keys with k > n fall back to the global one."""
        if self._global is None:
            raise LifecycleError("MondrianCalibrator: call fit(scores, keys) before calibrate")
        _check_keys(keys, len(scores))
        if len(labels) != len(scores):
            raise InputError(
                "shape-mismatch", f"{len(labels)} label rows for {len(scores)} score rows"
            )
        global_cal = self._global.calibrate(scores, labels).calibration_
        entries: dict[CalibrationKey, KeyCalibration] = {}
        for key, rows in _rows_by_key(keys).items():
            fitted = self._per_key.get(key)
            if fitted is None:
                raise LifecycleError(
                    f"MondrianCalibrator: key {key.label} was not seen by fit(); "
                    "fit and calibrate on the same keys"
                )
            if isinstance(fitted, InputError):
                entries[key] = KeyCalibration(
                    key=key,
                    n_questions=len(rows),
                    own=None,
                    fallback_reason=FallbackReason.DEGENERATE_SCORES,
                    detail=f"key {key.label}: {fitted.detail}; using the global calibration",
                )
                continue
            own = fitted.calibrate(
                [scores[i] for i in rows], [labels[i] for i in rows]
            ).calibration_
            if own.certifiable:
                entries[key] = KeyCalibration(
                    key=key,
                    n_questions=len(rows),
                    own=own,
                    fallback_reason=None,
                    detail=f"key {key.label}: own calibration; {own.explain()}",
                )
            else:
                global_note = (
                    f"n={global_cal.n}, k={global_cal.k}"
                    if global_cal.certifiable
                    else "which is itself vacuous at this alpha"
                )
                entries[key] = KeyCalibration(
                    key=key,
                    n_questions=len(rows),
                    own=own,
                    fallback_reason=FallbackReason.TOO_FEW_SAMPLES,
                    detail=(
                        f"key {key.label}: {own.explain()}; using the global calibration "
                        f"({global_note})"
                    ),
                )
        self._result = MondrianCalibration(
            alpha=self.alpha, global_calibration=global_cal, keys=MappingProxyType(entries)
        )
        return self

    @property
    def calibration_(self) -> MondrianCalibration:
        """The result; :class:`LifecycleError` before :meth:`calibrate`."""
        if self._result is None:
            raise LifecycleError(
                "MondrianCalibrator: call fit(scores, keys) then calibrate(scores, labels, keys)"
            )
        return self._result

    def predict(self, scores: Sequence[float], key: CalibrationKey) -> BoolArray:
        """Trusted mask for one retrieval of ``key`` with the calibration that key uses."""
        calibration, _ = self.calibration_.select(CalibrationKey(*key))
        normaliser = MinMaxNormaliser(calibration.n1, calibration.n2)
        normaliser.transform_values(scores)  # validates: non-finite scores raise
        return normaliser.unclipped(scores) >= calibration.threshold
