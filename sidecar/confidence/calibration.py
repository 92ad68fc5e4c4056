"""Post-hoc calibration of a forecast score: Platt scaling and isotonic regression, in numpy.

Both map a raw score ``s`` (any real number; larger = more likely correct) to a
probability and are monotone non-decreasing in ``s``:

- :class:`PlattCalibrator` (Platt 1999): ``p = sigmoid(a * s + b)`` with ``a >= 0``.
  :func:`fit_platt` minimises the logistic NLL against Platt's smoothed targets
  ``t+ = (N+ + 1)/(N+ + 2)`` for positives and ``t- = 1/(N- + 2)`` for negatives
  (so separable data still has a finite optimum), by Newton's method on the
  standardised score with a tiny ridge on the slope. If the best slope is negative
  the constrained optimum ``a = 0, b = logit(mean t)`` is used instead.
- :class:`IsotonicCalibrator`: the increasing step function of pool-adjacent-
  violators (:func:`fit_isotonic`; tied scores are pooled first), read as a
  piecewise-linear curve through each block's first and last score (``np.interp``,
  constant beyond the ends) and clipped to ``[1e-4, 1 - 1e-4]`` so NLL stays finite.

:func:`choose_calibrator` picks between them by K-fold cross-validated NLL.
Serving only needs ``predict`` and ``from_dict``; everything is numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from sidecar.confidence.errors import ConfidenceDataError
from sidecar.confidence.logistic import FloatArray, fit_logistic, sigmoid
from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.stats.metrics import as_labels, as_scores, nll

__all__ = [
    "ISOTONIC_CLIP",
    "Calibrator",
    "CalibratorChoice",
    "CalibratorDict",
    "IsotonicCalibrator",
    "Method",
    "PlattCalibrator",
    "calibrator_from_dict",
    "choose_calibrator",
    "cross_validated_probabilities",
    "fit_calibrator",
    "fit_isotonic",
    "fit_platt",
    "stratified_folds",
]

Method = Literal["platt", "isotonic"]
CalibratorDict = dict[str, str | float | list[float]]
"""The JSON form of a calibrator: ``{"method": "platt", "a": .., "b": ..}`` or
``{"method": "isotonic", "x": [..], "y": [..]}``."""

ISOTONIC_CLIP: Final = 1e-4
_PLATT_SLOPE_L2: Final = 1e-3  # ridge on the slope of the standardised score


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfidenceDataError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class PlattCalibrator:
    """``p = sigmoid(a * s + b)``; ``a >= 0`` keeps it non-decreasing in ``s``."""

    a: float
    b: float

    def __post_init__(self) -> None:
        a = _finite("Platt slope a", self.a)
        b = _finite("Platt intercept b", self.b)
        if a < 0.0:
            raise ConfidenceDataError(f"Platt slope a must be >= 0 (monotone), got {a!r}")
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)

    @property
    def method(self) -> Method:
        """``"platt"``."""
        return "platt"

    def predict(self, scores: npt.ArrayLike) -> FloatArray:
        """``sigmoid(a * s + b)`` for each score."""
        s = np.asarray(scores, dtype=np.float64)
        return sigmoid(self.a * s + self.b)

    def to_dict(self) -> CalibratorDict:
        """``{"method": "platt", "a": a, "b": b}``."""
        return {"method": "platt", "a": self.a, "b": self.b}


@dataclass(frozen=True, slots=True)
class IsotonicCalibrator:
    """``p = clip(interp(s, x, y), 1e-4, 1 - 1e-4)``; ``x`` increasing, ``y`` non-decreasing."""

    x: tuple[float, ...]
    y: tuple[float, ...]
    _x: FloatArray = field(init=False, repr=False, compare=False)
    _y: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        x = np.asarray([_finite("isotonic threshold x", v) for v in self.x], dtype=np.float64)
        y = np.asarray([_finite("isotonic value y", v) for v in self.y], dtype=np.float64)
        if x.size == 0 or x.size != y.size:
            raise ConfidenceDataError(
                f"isotonic x and y must be non-empty and of equal length, got {x.size} and {y.size}"
            )
        if np.any(np.diff(x) <= 0.0):
            raise ConfidenceDataError("isotonic thresholds x must be strictly increasing")
        if np.any(np.diff(y) < 0.0) or y[0] < 0.0 or y[-1] > 1.0:
            raise ConfidenceDataError("isotonic values y must be non-decreasing and in [0, 1]")
        object.__setattr__(self, "x", tuple(float(v) for v in x))
        object.__setattr__(self, "y", tuple(float(v) for v in y))
        object.__setattr__(self, "_x", x)
        object.__setattr__(self, "_y", y)

    @property
    def method(self) -> Method:
        """``"isotonic"``."""
        return "isotonic"

    def predict(self, scores: npt.ArrayLike) -> FloatArray:
        """Linear interpolation through ``(x, y)``, constant beyond the ends, then clipped."""
        s = np.asarray(scores, dtype=np.float64)
        p: FloatArray = np.clip(np.interp(s, self._x, self._y), ISOTONIC_CLIP, 1.0 - ISOTONIC_CLIP)
        return p

    def to_dict(self) -> CalibratorDict:
        """``{"method": "isotonic", "x": [...], "y": [...]}``."""
        return {"method": "isotonic", "x": list(self.x), "y": list(self.y)}


Calibrator = PlattCalibrator | IsotonicCalibrator


def calibrator_from_dict(data: Mapping[str, object]) -> Calibrator:
    """Rebuild a calibrator from :meth:`to_dict` output; :class:`ArtifactError` if malformed."""
    method = data.get("method")
    try:
        if method == "platt" and set(data) == {"method", "a", "b"}:
            a = _finite("Platt slope a", data["a"])
            return PlattCalibrator(a=a, b=_finite("Platt intercept b", data["b"]))
        if method == "isotonic" and set(data) == {"method", "x", "y"}:
            xs, ys = data["x"], data["y"]
            if isinstance(xs, list | tuple) and isinstance(ys, list | tuple):
                return IsotonicCalibrator(x=tuple(xs), y=tuple(ys))
    except ConfidenceDataError as exc:
        raise ArtifactError(f"invalid {method} calibrator: {exc}") from exc
    raise ArtifactError(
        "a calibrator must be {'method': 'platt', 'a', 'b'} or "
        f"{{'method': 'isotonic', 'x': [...], 'y': [...]}}, got keys {sorted(data)} "
        f"with method {method!r}"
    )


def _scores_labels(scores: npt.ArrayLike, labels: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    s = as_scores(scores)
    return s, as_labels(labels, s.size)


def fit_platt(scores: npt.ArrayLike, labels: npt.ArrayLike) -> PlattCalibrator:
    """Platt: ``argmin_{a >= 0, b} -sum t log p + (1 - t) log(1 - p)``, ``p = sigmoid(a s + b)``.

    Targets ``t`` are Platt's ``(N+ + 1)/(N+ + 2)`` for positives and ``1/(N- + 2)``
    for negatives. The score is standardised for the Newton fit and mapped back:
    ``a = a'/sd``, ``b = b' - a' * mean/sd``.
    """
    s, y = _scores_labels(scores, labels)
    n_pos = float(y.sum())
    n_neg = float(y.size - n_pos)
    targets = np.where(y == 1.0, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
    intercept_only = math.log(float(targets.mean()) / (1.0 - float(targets.mean())))
    centre, spread = float(s.mean()), float(s.std())
    if spread <= 1e-12 * max(1.0, abs(centre)):
        return PlattCalibrator(a=0.0, b=intercept_only)
    design = np.column_stack([(s - centre) / spread, np.ones_like(s)])
    slope, offset = fit_logistic(design, targets, np.array([_PLATT_SLOPE_L2, 0.0]))
    if slope <= 0.0:
        return PlattCalibrator(a=0.0, b=intercept_only)
    return PlattCalibrator(a=float(slope / spread), b=float(offset - slope * centre / spread))


def _pool_adjacent_violators(
    values: FloatArray, weights: FloatArray
) -> list[tuple[int, int, float]]:
    """Increasing PAV: blocks ``(first, last, mean)`` over indices of ``values``.

    Minimises ``sum_i w_i (f_i - v_i)^2`` subject to ``f`` non-decreasing; adjacent
    blocks whose weighted means are out of order (or equal) are merged.
    """
    first: list[int] = []
    last: list[int] = []
    wsum: list[float] = []
    vsum: list[float] = []
    for i, (v, w) in enumerate(zip(values.tolist(), weights.tolist(), strict=True)):
        first.append(i)
        last.append(i)
        wsum.append(w)
        vsum.append(v * w)
        while len(wsum) > 1 and vsum[-2] * wsum[-1] >= vsum[-1] * wsum[-2]:
            tail = last.pop()
            first.pop()
            last[-1] = tail
            w_tail, v_tail = wsum.pop(), vsum.pop()
            wsum[-1] += w_tail
            vsum[-1] += v_tail
    return [(f, l_, v / w) for f, l_, v, w in zip(first, last, vsum, wsum, strict=True)]


def fit_isotonic(scores: npt.ArrayLike, labels: npt.ArrayLike) -> IsotonicCalibrator:
    """Isotonic regression of labels on scores (PAV); tied scores are averaged first.

    Each PAV block contributes its first and last distinct score with the block mean,
    so the curve is flat within a block and linear between blocks.
    """
    s, y = _scores_labels(scores, labels)
    order = np.argsort(s, kind="mergesort")
    unique, starts, counts = np.unique(s[order], return_index=True, return_counts=True)
    means = np.add.reduceat(y[order], starts) / counts
    xs: list[float] = []
    ys: list[float] = []
    for first, last, mean in _pool_adjacent_violators(means, counts.astype(np.float64)):
        value = min(1.0, max(0.0, mean))
        xs.append(float(unique[first]))
        ys.append(value)
        if last != first:
            xs.append(float(unique[last]))
            ys.append(value)
    return IsotonicCalibrator(x=tuple(xs), y=tuple(ys))


def fit_calibrator(method: Method, scores: npt.ArrayLike, labels: npt.ArrayLike) -> Calibrator:
    """:func:`fit_platt` or :func:`fit_isotonic` by name."""
    if method == "platt":
        return fit_platt(scores, labels)
    if method == "isotonic":
        return fit_isotonic(scores, labels)
    raise ConfigError(f"calibration method must be 'platt' or 'isotonic', got {method!r}")


def stratified_folds(labels: FloatArray, folds: int, seed: int) -> npt.NDArray[np.int64]:
    """Fold number (0..folds-1) of each item: per class, a seeded permutation dealt round-robin."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ConfigError(f"folds must be an integer >= 2, got {folds!r}")
    if labels.size < folds:
        raise ConfidenceDataError(
            f"{folds}-fold cross-validation needs >= {folds} items, got {labels.size}"
        )
    rng = np.random.default_rng(seed)
    fold = np.empty(labels.size, dtype=np.int64)
    offset = 0
    for cls in (0.0, 1.0):
        members = rng.permutation(np.flatnonzero(labels == cls))
        fold[members] = (np.arange(members.size) + offset) % folds
        offset += members.size
    return fold


def cross_validated_probabilities(
    method: Method, scores: npt.ArrayLike, labels: npt.ArrayLike, *, folds: int = 5, seed: int = 0
) -> FloatArray:
    """Out-of-fold probabilities: item ``i`` is predicted by a calibrator fit without its fold."""
    s, y = _scores_labels(scores, labels)
    fold = stratified_folds(y, folds, seed)
    out = np.empty_like(s)
    for k in range(folds):
        held = fold == k
        out[held] = fit_calibrator(method, s[~held], y[~held]).predict(s[held])
    return out


@dataclass(frozen=True, slots=True)
class CalibratorChoice:
    """Why :func:`choose_calibrator` chose ``method``: both cross-validated NLLs."""

    method: Method
    platt_cv_nll: float
    isotonic_cv_nll: float
    folds: int
    seed: int
    n: int

    def to_dict(self) -> dict[str, str | float | int]:
        """Plain JSON-serialisable values."""
        return {
            "method": self.method,
            "platt_cv_nll": self.platt_cv_nll,
            "isotonic_cv_nll": self.isotonic_cv_nll,
            "folds": self.folds,
            "seed": self.seed,
            "n": self.n,
        }


def choose_calibrator(
    scores: npt.ArrayLike, labels: npt.ArrayLike, *, folds: int = 5, seed: int = 0
) -> tuple[Calibrator, CalibratorChoice]:
    """Platt or isotonic, whichever has the lower K-fold cross-validated NLL, refit on all data.

    The cross-validated NLL of a method is ``nll`` of its out-of-fold probabilities
    over all items (the fold-size-weighted mean of the per-fold NLLs). Ties go to Platt
    (two parameters). Same data, folds and seed give the same choice.
    """
    s, y = _scores_labels(scores, labels)
    losses = {
        method: nll(cross_validated_probabilities(method, s, y, folds=folds, seed=seed), y)
        for method in ("platt", "isotonic")
    }
    method: Method = "isotonic" if losses["isotonic"] < losses["platt"] else "platt"
    choice = CalibratorChoice(
        method=method,
        platt_cv_nll=losses["platt"],
        isotonic_cv_nll=losses["isotonic"],
        folds=folds,
        seed=seed,
        n=int(s.size),
    )
    return fit_calibrator(method, s, y), choice
