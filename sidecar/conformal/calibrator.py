"""Conformal certification of retrieved chunks (eqs. 2-6, docs/methods.md §Retrieval certification).

Lifecycle (as in MAPIE): :meth:`RetrievalCalibrator.fit` learns the global
min-max normalisation ``n1, n2`` from all calibration scores;
:meth:`RetrievalCalibrator.calibrate` turns the normalised scores of the
*correct* calibration chunks into nonconformity scores ``1 - s`` and takes their
exact order statistic q_hat (eq. 2, :mod:`sidecar.conformal.quantile`);
:meth:`RetrievalCalibrator.predict` marks a retrieved chunk trusted when its
normalised score satisfies ``s >= 1 - q_hat`` (eq. 4). Calling a step before the
one it depends on raises :class:`LifecycleError`.

The comparison is done in score space against ``threshold``, the ``k``-th
largest normalised correct score, which equals ``1 - q_hat`` exactly in real
arithmetic and avoids rounding ``1 - (1 - s)`` twice. Under exchangeability of
correct chunks, a correct chunk is trusted with probability in
``[1 - alpha, 1 - alpha + 1/(n + 1)]`` (eq. 3; the upper bound needs no ties).

Scores arrive as ragged rows, one row per question (its top-K retrieval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Self, TypeAlias

import numpy as np
import numpy.typing as npt

from sidecar.conformal.normalise import MinMaxNormaliser
from sidecar.conformal.order import RISING_SHARE, score_direction
from sidecar.conformal.quantile import (
    AlphaLike,
    as_alpha,
    conformal_quantile,
    explain_rank,
    order_statistic_rank,
)
from sidecar.exceptions import ConfigError, InputError, LifecycleError
from sidecar.stats.binomial import beta_quantile
from sidecar.stats.metrics import auroc

__all__ = [
    "ConformalCalibration",
    "LabelRows",
    "RetrievalCalibrator",
    "RetrievalMetrics",
    "ScoreRows",
    "SweepPoint",
    "alpha_sweep",
    "default_alpha_grid",
    "evaluate",
    "pad_rows",
]

ScoreRows: TypeAlias = Sequence[Sequence[float]]
"""Raw retrieval scores, one row (the top-K of one question) per question."""
LabelRows: TypeAlias = Sequence[Sequence[bool]]
"""Ground-truth correctness of each retrieved chunk, same shape as :data:`ScoreRows`."""

FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class ConformalCalibration:
    """A fitted and calibrated conformal certifier: everything ``certify`` needs.

    ``threshold`` is the normalised-score cut ``1 - q_hat`` (``-inf`` when q_hat = +inf).
    """

    alpha: Fraction
    n1: float
    n2: float
    n: int
    """Number of correct calibration chunks (the size of the nonconformity set)."""
    k: int
    q_hat: float
    threshold: float
    n_questions: int
    n_chunks: int

    def __post_init__(self) -> None:
        expected_k = order_statistic_rank(self.n, self.alpha)
        if self.k != expected_k:
            raise ConfigError(
                f"k must be ceil((n+1)(1-alpha)) = {expected_k} for n={self.n}, "
                f"alpha={self.alpha}, got {self.k}"
            )
        MinMaxNormaliser(self.n1, self.n2)  # validates n1 < n2, both finite
        if self.k > self.n:
            if not (math.isinf(self.q_hat) and self.q_hat > 0 and self.threshold == -math.inf):
                raise ConfigError(
                    f"with k={self.k} > n={self.n}, q_hat must be +inf and threshold -inf, "
                    f"got q_hat={self.q_hat!r}, threshold={self.threshold!r}"
                )
        elif not (0.0 <= self.q_hat <= 1.0 and 0.0 <= self.threshold <= 1.0):
            raise ConfigError(
                f"q_hat and threshold must lie in [0, 1], got q_hat={self.q_hat!r}, "
                f"threshold={self.threshold!r}"
            )
        if self.n_chunks < self.n or self.n_questions < 0:
            raise ConfigError(
                f"need n_chunks >= n >= 0 and n_questions >= 0, got n_chunks={self.n_chunks}, "
                f"n={self.n}, n_questions={self.n_questions}"
            )

    @property
    def certifiable(self) -> bool:
        """False when q_hat = +inf (``k > n``): every chunk passes, the certificate is vacuous."""
        return self.k <= self.n

    @property
    def normaliser(self) -> MinMaxNormaliser:
        """The min-max normalisation learnt on the calibration scores."""
        return MinMaxNormaliser(self.n1, self.n2)

    @property
    def coverage_bounds(self) -> tuple[float, float]:
        """Eq. (3): ``(1 - alpha, 1 - alpha + 1/(n + 1))``, bounds on P(correct chunk trusted)."""
        lo = float(1 - self.alpha)
        return lo, min(1.0, lo + 1.0 / (self.n + 1))

    def coverage_spread(self, confidence: float = 0.9) -> tuple[float, float] | None:
        """Where the coverage of *this* threshold lies across calibration sets of this size:
        conditional on the calibration set it is ``Beta(k, n + 1 - k)`` (Vovk 2012;
        Angelopoulos & Bates, "A gentle introduction", §3.2), and eq. (3) holds only on
        average over them. The central ``confidence`` interval; None when not certifiable."""
        if not self.certifiable:
            return None
        tail = (1.0 - confidence) / 2.0
        a, b = self.k, self.n + 1 - self.k
        return beta_quantile(a, b, tail), beta_quantile(a, b, 1.0 - tail)

    def explain(self) -> str:
        """One sentence on how q_hat was obtained, or why nothing can be certified."""
        return explain_rank(self.alpha, self.n, self.k)


def pad_rows(rows: ScoreRows) -> tuple[FloatArray, BoolArray]:
    """Ragged score rows -> ``(N, K_max)`` array padded with NaN, and the presence mask.

    Raises :class:`InputError` ``invalid-score`` for NaN/inf or non-numeric scores.
    """
    n_rows = len(rows)
    width = max((len(r) for r in rows), default=0)
    values = np.full((n_rows, width), np.nan, dtype=np.float64)
    present = np.zeros((n_rows, width), dtype=np.bool_)
    for i, row in enumerate(rows):
        if len(row) == 0:
            continue
        if any(isinstance(v, str | bytes | bool | np.bool_) for v in row):
            # numpy reads "0.5" as 0.5 and True as 1.0: a file that quoted its scores or a
            # column of flags would calibrate without a word (audit)
            raise InputError("invalid-score", f"question {i}: scores must be numbers, got {row!r}")
        try:
            arr = np.asarray(row, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError("invalid-score", f"question {i}: scores must be numbers") from exc
        if arr.ndim != 1:
            raise InputError("invalid-score", f"question {i}: scores must be a flat list")
        if not np.all(np.isfinite(arr)):
            raise InputError("invalid-score", f"question {i}: scores must be finite, got {row!r}")
        values[i, : arr.size] = arr
        present[i, : arr.size] = True
    return values, present


def _pad_labels(labels: LabelRows, present: BoolArray) -> BoolArray:
    if len(labels) != present.shape[0]:
        raise InputError(
            "shape-mismatch",
            f"labels have {len(labels)} questions but scores have {present.shape[0]}",
        )
    out = np.zeros(present.shape, dtype=np.bool_)
    for i, row in enumerate(labels):
        width = int(present[i].sum())
        if len(row) != width:
            raise InputError(
                "shape-mismatch",
                f"question {i}: {len(row)} labels but {width} scores",
            )
        if not all(_is_label(v) for v in row):
            # bool("no") is True: labels given as text or as scores would all count (audit:
            # "no" labels moved n from 40 to 200 and q_hat from 0.11 to 0.94)
            raise InputError(
                "invalid-label",
                f"question {i}: labels must be true/false (or 1/0), got {list(row)!r}",
            )
        if width:
            out[i, :width] = np.asarray(row, dtype=np.bool_)
    return out


DIRECTION_MIN_EACH = 20  # correct and wrong chunks each before their order is judged
DIRECTION_MAX_AUROC = 0.4  # below it, correct chunks score lower: distances, not similarities


def _check_direction(scores: FloatArray, correct: BoolArray) -> None:
    """:class:`InputError` ``score-direction`` when the correct chunks score clearly lower
    than the wrong ones: the scores are distances (lower is better), and a calibration
    of them would trust the worst chunks (audit: fitted without a word)."""
    n_correct = int(correct.sum())
    if min(n_correct, correct.size - n_correct) < DIRECTION_MIN_EACH:
        return
    separation = auroc(scores, correct)
    if separation < DIRECTION_MAX_AUROC:
        raise InputError(
            "score-direction",
            f"the correct chunks score lower than the wrong ones (AUROC {separation:.2f} of "
            f"{correct.size} chunks): these look like distances (lower is better); the "
            "calibration needs similarities (higher is better): use 1 - distance for a cosine "
            "distance, else -distance, here and in the events",
        )


ORDER_MIN_LISTS = 5  # hit lists with distinct scores before their order is read


def _check_order(scores: ScoreRows) -> None:
    """:class:`InputError` ``score-direction`` when the hit lists' scores rise down the list
    (each list is best first): distances, as the serving side reads them (``ScoreOrder``).
    The label check above needs 20 chunks of each kind; 18 lists of 1 - similarity were
    calibrated without a word (audit), and served lists like them are refused."""
    directions = [d for row in scores if (d := score_direction(list(row))) is not None]
    rising = sum(d > 0 for d in directions)
    if len(directions) >= ORDER_MIN_LISTS and rising >= RISING_SHARE * len(directions):
        raise InputError(
            "score-direction",
            f"the scores rise down the hit list in {rising} of {len(directions)} lists; lists "
            "come best first, so these look like distances (lower is better); the calibration "
            "needs similarities (higher is better): use 1 - distance for a cosine distance, "
            "else -distance, here and in the events",
        )


def _is_label(value: object) -> bool:
    if isinstance(value, bool | np.bool_):
        return True
    return isinstance(value, int | np.integer) and value in (0, 1)


def _calibrate_normalised(
    correct: FloatArray,
    alpha: Fraction,
    normaliser: MinMaxNormaliser,
    *,
    n_questions: int,
    n_chunks: int,
) -> ConformalCalibration:
    """q_hat from the normalised scores of the correct chunks (eq. 2), exact rank."""
    quantile = conformal_quantile(1.0 - correct, alpha)
    if quantile.finite:
        # k-th largest normalised score == 1 - (k-th smallest of 1 - s), rounding is monotone.
        threshold = float(
            np.partition(correct, correct.size - quantile.k)[correct.size - quantile.k]
        )
    else:
        threshold = -math.inf
    return ConformalCalibration(
        alpha=alpha,
        n1=normaliser.n1,
        n2=normaliser.n2,
        n=quantile.n,
        k=quantile.k,
        q_hat=quantile.q_hat,
        threshold=threshold,
        n_questions=n_questions,
        n_chunks=n_chunks,
    )


class RetrievalCalibrator:
    """fit (normalisation) -> calibrate (q_hat) -> predict (trusted chunks), with guards."""

    def __init__(self, alpha: AlphaLike) -> None:
        self.alpha: Fraction = as_alpha(alpha)
        self._normaliser: MinMaxNormaliser | None = None
        self._calibration: ConformalCalibration | None = None

    def fit(self, scores: ScoreRows) -> Self:
        """Learn ``n1 = min(S_cal)``, ``n2 = max(S_cal)`` over every calibration score.

        Re-fitting discards a previous calibration.
        """
        values, present = pad_rows(scores)
        self._normaliser = MinMaxNormaliser.fit(values[present])
        self._calibration = None
        return self

    def calibrate(self, scores: ScoreRows, labels: LabelRows) -> Self:
        """Compute q_hat from the correct chunks of the calibration set (eq. 2).

        Scores outside the fitted [n1, n2] (when calibrating on other data than
        :meth:`fit` saw) are clipped like at inference.
        """
        normaliser = self.normaliser_
        values, present = pad_rows(scores)
        correct_mask = _pad_labels(labels, present)
        _check_direction(values[present], correct_mask[present])
        _check_order(scores)
        normalised, _ = normaliser.transform(values[correct_mask])
        self._calibration = _calibrate_normalised(
            normalised,
            self.alpha,
            normaliser,
            n_questions=len(scores),
            n_chunks=int(present.sum()),
        )
        return self

    @property
    def normaliser_(self) -> MinMaxNormaliser:
        """The fitted normalisation; :class:`LifecycleError` before :meth:`fit`."""
        if self._normaliser is None:
            raise LifecycleError(
                "RetrievalCalibrator: call fit(scores) before calibrate or predict"
            )
        return self._normaliser

    @property
    def calibration_(self) -> ConformalCalibration:
        """The calibration result; :class:`LifecycleError` before :meth:`calibrate`."""
        if self._calibration is None:
            if self._normaliser is None:
                raise LifecycleError(
                    "RetrievalCalibrator: call fit(scores) then calibrate(scores, labels) first"
                )
            raise LifecycleError(
                "RetrievalCalibrator: call calibrate(scores, labels) before predict"
            )
        return self._calibration

    def predict(self, scores: Sequence[float]) -> BoolArray:
        """Trusted mask for one retrieval's raw scores (eq. 4: ``s >= 1 - q_hat``)."""
        calibration = self.calibration_
        normaliser = calibration.normaliser
        normaliser.transform_values(scores)  # validates: non-finite scores raise
        return normaliser.unclipped(scores) >= calibration.threshold


@dataclass(frozen=True, slots=True)
class RetrievalMetrics:
    """Eqs. (5)-(6) averaged over questions, and the empirical coverage of correct chunks."""

    n_questions: int
    n_chunks: int
    n_correct: int
    n_correct_trusted: int
    coverage: float | None
    """Share of correct chunks that are trusted; ``None`` without labels or correct chunks."""
    m1_mean: float
    """mean(m1): share of questions with at least one trusted chunk (eq. 5)."""
    m2_mean: float
    """mean(m2): mean of |C|/K over questions (eq. 6)."""
    n_clipped: int


def _trusted_matrix(
    values: FloatArray, present: BoolArray, normaliser: MinMaxNormaliser, threshold: float
) -> tuple[BoolArray, int]:
    _, n_clipped = normaliser.transform(values)
    with np.errstate(invalid="ignore"):
        trusted = (normaliser.unclipped(values) >= threshold) & present
    return trusted, n_clipped


def _metrics(
    trusted: BoolArray, present: BoolArray, correct: BoolArray | None, n_clipped: int
) -> RetrievalMetrics:
    depth = present.sum(axis=1)
    n_trusted = trusted.sum(axis=1)
    n_questions = int(present.shape[0])
    m1 = float(np.mean(n_trusted > 0)) if n_questions else math.nan
    m2_rows = np.divide(
        n_trusted, depth, out=np.zeros(n_questions, dtype=np.float64), where=depth > 0
    )
    m2 = float(np.mean(m2_rows)) if n_questions else math.nan
    if correct is None:
        n_correct = n_correct_trusted = 0
        coverage = None
    else:
        n_correct = int(correct.sum())
        n_correct_trusted = int((trusted & correct).sum())
        coverage = n_correct_trusted / n_correct if n_correct else None
    return RetrievalMetrics(
        n_questions=n_questions,
        n_chunks=int(present.sum()),
        n_correct=n_correct,
        n_correct_trusted=n_correct_trusted,
        coverage=coverage,
        m1_mean=m1,
        m2_mean=m2,
        n_clipped=n_clipped,
    )


def evaluate(
    calibration: ConformalCalibration, scores: ScoreRows, labels: LabelRows | None = None
) -> RetrievalMetrics:
    """mean(m1), mean(m2) and (with labels) the coverage of correct chunks on retrievals."""
    values, present = pad_rows(scores)
    correct = None if labels is None else _pad_labels(labels, present)
    trusted, n_clipped = _trusted_matrix(
        values, present, calibration.normaliser, calibration.threshold
    )
    return _metrics(trusted, present, correct, n_clipped)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """Calibration at one alpha and the metrics it gives on an evaluation set (seed Fig. 4)."""

    alpha: Fraction
    n: int
    k: int
    q_hat: float
    threshold: float
    m1_mean: float
    m2_mean: float
    coverage: float | None


def default_alpha_grid() -> list[Fraction]:
    """alpha = 0.01, 0.02, ..., 0.99 (exact)."""
    return [Fraction(i, 100) for i in range(1, 100)]


def alpha_sweep(
    cal_scores: ScoreRows,
    cal_labels: LabelRows,
    alphas: Sequence[AlphaLike],
    eval_scores: ScoreRows | None = None,
    eval_labels: LabelRows | None = None,
) -> list[SweepPoint]:
    """mean(m1) and mean(m2) against alpha (the source's Fig. 4).

    For each alpha the calibration set gives q_hat exactly as :class:`RetrievalCalibrator`
    does; the metrics are averaged over ``eval_scores`` (default: the calibration
    set itself, as in the source's figure).
    """
    if eval_scores is None:
        eval_scores, eval_labels = cal_scores, cal_labels
    cal_values, cal_present = pad_rows(cal_scores)
    normaliser = MinMaxNormaliser.fit(cal_values[cal_present])
    cal_correct = _pad_labels(cal_labels, cal_present)
    correct_normalised, _ = normaliser.transform(cal_values[cal_correct])
    ev_values, ev_present = pad_rows(eval_scores)
    ev_correct = None if eval_labels is None else _pad_labels(eval_labels, ev_present)
    _, n_clipped = normaliser.transform(ev_values)
    ev_normalised = normaliser.unclipped(ev_values)  # eq. 4 compares the unclipped score
    points: list[SweepPoint] = []
    for alpha in alphas:
        cal = _calibrate_normalised(
            correct_normalised,
            as_alpha(alpha),
            normaliser,
            n_questions=len(cal_scores),
            n_chunks=int(cal_present.sum()),
        )
        with np.errstate(invalid="ignore"):
            trusted = (ev_normalised >= cal.threshold) & ev_present
        m = _metrics(trusted, ev_present, ev_correct, n_clipped)
        points.append(
            SweepPoint(
                alpha=cal.alpha,
                n=cal.n,
                k=cal.k,
                q_hat=cal.q_hat,
                threshold=cal.threshold,
                m1_mean=m.m1_mean,
                m2_mean=m.m2_mean,
                coverage=m.coverage,
            )
        )
    return points
