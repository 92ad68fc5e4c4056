"""Global min-max normalisation of retrieval scores (docs/methods.md §Retrieval certification).

With ``n1 = min(S_cal)`` and ``n2 = max(S_cal)`` over every calibration score
(all questions, all K chunks), a score is rescaled as ``(s - n1) / (n2 - n1)``.
Calibration scores land in [0, 1] by construction; at inference a score outside
[n1, n2] is clipped to 0 or 1 and counted, so a drift of the retriever's score
range is visible rather than silently absorbed.

The scalar and the vectorised paths perform the same IEEE operations
(subtract, then divide by the stored span), so they agree bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sidecar.exceptions import ConfigError, InputError

__all__ = ["MinMaxNormaliser"]


@dataclass(frozen=True, slots=True)
class MinMaxNormaliser:
    """The affine map ``s -> (s - n1)/(n2 - n1)``, clipped to [0, 1]."""

    n1: float
    n2: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.n1) and math.isfinite(self.n2)):
            raise ConfigError(f"n1 and n2 must be finite, got n1={self.n1!r}, n2={self.n2!r}")
        if not self.n2 > self.n1:
            raise ConfigError(f"n2 must be greater than n1, got n1={self.n1!r}, n2={self.n2!r}")

    @property
    def span(self) -> float:
        """``n2 - n1`` (> 0)."""
        return self.n2 - self.n1

    @classmethod
    def fit(cls, scores: npt.ArrayLike) -> MinMaxNormaliser:
        """Learn ``n1 = min``, ``n2 = max`` from all calibration scores (any shape).

        Raises :class:`InputError` ``invalid-score`` for NaN/inf and
        ``degenerate-scores`` when there are no scores or they are all equal
        (no scale to normalise by).
        """
        values = np.asarray(scores, dtype=np.float64).ravel()
        if values.size == 0:
            raise InputError("degenerate-scores", "cannot normalise: no calibration scores given")
        if not np.all(np.isfinite(values)):
            bad = int(np.count_nonzero(~np.isfinite(values)))
            raise InputError(
                "invalid-score", f"calibration scores must be finite, got {bad} NaN/inf value(s)"
            )
        n1, n2 = float(values.min()), float(values.max())
        if not n2 > n1:
            raise InputError(
                "degenerate-scores",
                f"cannot normalise: all {values.size} calibration scores equal {n1!r} "
                "(min-max normalisation needs max > min)",
            )
        return cls(n1=n1, n2=n2)

    def transform(self, scores: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], int]:
        """Normalise finite scores; return them clipped to [0, 1] and how many were clipped.

        NaN entries (used as padding by callers) pass through as NaN and are not counted.
        """
        out = self.unclipped(scores)  # +/-inf past float64 for a tiny span, then clipped
        outside = (out < 0.0) | (out > 1.0)
        n_clipped = int(np.count_nonzero(outside))
        if n_clipped:
            out = np.clip(out, 0.0, 1.0)
        return out, n_clipped

    def unclipped(self, scores: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """``(s - n1) / (n2 - n1)`` without clipping: what the trust rule ``s' >= 1 - q_hat``
        (eq. 4) compares. Clipping first would lift a score below n1 to 0 and pass a cut
        of 0 (k = n with the smallest calibration score correct): audit."""
        values = np.asarray(scores, dtype=np.float64)
        with np.errstate(over="ignore"):
            out: npt.NDArray[np.float64] = (values - self.n1) / self.span
        return out

    def transform_values(self, scores: Sequence[float]) -> tuple[list[float], int]:
        """Pure-Python path for a handful of scores (one retrieval event).

        Same arithmetic as :meth:`transform`. Non-finite values raise
        :class:`InputError` ``invalid-score``.
        """
        n1, span = self.n1, self.span
        out: list[float] = []
        n_clipped = 0
        for j, raw in enumerate(scores):
            try:
                s = float(raw)
            except (TypeError, ValueError) as exc:
                raise InputError(
                    "invalid-score", f"retrieval score {j} is {raw!r}; scores must be numbers"
                ) from exc
            if not math.isfinite(s):
                raise InputError(
                    "invalid-score", f"retrieval score {j} is {s!r}; scores must be finite numbers"
                )
            v = (s - n1) / span
            if v < 0.0:
                v, n_clipped = 0.0, n_clipped + 1
            elif v > 1.0:
                v, n_clipped = 1.0, n_clipped + 1
            out.append(v)
        return out, n_clipped
