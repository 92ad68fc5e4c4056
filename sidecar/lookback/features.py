"""The factuality classifier's input vector v. Pure numpy.

The method and its source: docs/methods.md §Lookback-ratio factuality.

From an ``(L, H, K_s)`` array of time-averaged lookback ratios (eq. 9) to the
classifier's ``L * H * K`` feature vector, in three steps:

1. **select** the columns of the trusted chunks, in retrieval order
   (:func:`select_chunks`); without a certification every column is kept;
2. **pad** with zero columns up to the model's K (:func:`pad_chunks`): "if,
   for a given input, less than K trusted chunks are identified, we pad v with
   zeros at those sections, in order to assure a fixed size of L x H x K";
3. **flatten** in C order ``(layer, head, chunk)`` and **scale per sample** to
   [0, 1] (:func:`scale_per_sample`): ``v' = (v - min v) / (max v - min v)``
   over the whole padded vector, padding zeros included; a constant vector maps
   to all zeros.

The full-context variant (``fc``) has ``K = 1``: ``v = [LR^{1,1}(context), ...,
LR^{L,H}(context)]`` of size ``L x H``; selection does not apply to it.

Properties the tests check: padding is the identity on a full input (so it
never changes its score); scaling is invariant to ``v -> a * v + b`` (a > 0)
for an unpadded input and to ``v -> a * v`` for any input (LR >= 0, so the
padding zeros stay the minimum); every feature lies in [0, 1].
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sidecar.exceptions import ConfigError

__all__ = [
    "SCALING",
    "feature_matrix",
    "feature_rows",
    "feature_vector",
    "pad_chunks",
    "scale_per_sample",
    "select_chunks",
]

SCALING = "per-sample-minmax"
"""The scaling recorded in model metadata: min-max over each padded, flattened vector."""

FloatArray = npt.NDArray[np.float32]

_EXACT_IN_FLOAT32 = (np.dtype(np.float16), np.dtype(np.float32))


def select_chunks(ratios: npt.ArrayLike, keep: Sequence[int] | None) -> FloatArray:
    """The columns ``keep`` (increasing positions) of an ``(L, H, K_s)`` array; all if None."""
    arr = np.asarray(ratios, dtype=np.float32)
    if arr.ndim != 3:
        raise ConfigError(f"lookback ratios must be 3-d (L, H, K), got shape {arr.shape}")
    if keep is None:
        return arr
    idx = [int(i) for i in keep]
    if any(b <= a for a, b in itertools.pairwise(idx)):
        raise ConfigError(f"kept chunk positions must be strictly increasing, got {idx}")
    if idx and (idx[0] < 0 or idx[-1] >= arr.shape[2]):
        raise ConfigError(f"kept chunk positions {idx} are outside 0..{arr.shape[2] - 1}")
    return arr[:, :, idx]


def pad_chunks(ratios: npt.ArrayLike, k: int) -> FloatArray:
    """``(L, H, K_s)`` -> ``(L, H, k)`` with zero columns after the given ones (``K_s <= k``)."""
    arr = np.asarray(ratios, dtype=np.float32)
    if arr.ndim != 3:
        raise ConfigError(f"lookback ratios must be 3-d (L, H, K), got shape {arr.shape}")
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    present = arr.shape[2]
    if present > k:
        raise ConfigError(f"{present} chunk columns do not fit a model for K={k}")
    if present == k:
        return arr
    out = np.zeros((arr.shape[0], arr.shape[1], k), dtype=np.float32)
    out[:, :, :present] = arr
    return out


def scale_per_sample(vectors: npt.ArrayLike, *, overwrite: bool = False) -> FloatArray:
    """Min-max scale each row of a 2-d array (or a single 1-d vector) to [0, 1].

    Computed in float64 and returned as float32; a row whose max equals its min
    becomes all zeros. ``overwrite``: ``vectors`` is a float64 array the caller
    is done with, scaled in place (a batch's matrix is a few hundred KiB: each
    temporary of that size is fresh pages from the OS, faulted in on every batch).
    """
    arr = np.asarray(vectors, dtype=np.float64)
    single = arr.ndim == 1
    rows = arr[None, :] if single else arr
    if rows.ndim != 2:
        raise ConfigError(f"expected feature vectors of 1 or 2 dims, got shape {arr.shape}")
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        return rows.astype(np.float32)[0] if single else rows.astype(np.float32)
    lo = rows.min(axis=1, keepdims=True)
    hi = rows.max(axis=1, keepdims=True)
    # NaN reaches the min and the max of its row, +-Inf one of them: all finite iff both are
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ConfigError("feature vectors contain NaN or Inf")
    span = hi - lo
    flat = span <= 0.0  # a constant row: all zeros
    some_flat = bool(flat.any())
    if some_flat:
        span = np.where(flat, 1.0, span)
    # (v - min) / span, in place; no clip needed: min <= v <= max, and rounding is
    # monotonic, so 0 <= v - min <= span and 0 <= (v - min) / span <= 1 in floats too
    # the caller's to overwrite, or a copy made above (not a view of what it passed)
    owned = overwrite or (arr is not vectors and arr.base is None)
    scaled = np.subtract(rows, lo, out=rows) if owned else rows - lo
    scaled /= span
    if some_flat:
        scaled[flat[:, 0]] = 0.0
    out: FloatArray = scaled.astype(np.float32)
    return out[0] if single else out


def feature_rows(
    ratios: Sequence[npt.NDArray[np.floating[Any]]], k: int, keeps: Sequence[Sequence[int] | None]
) -> FloatArray:
    """:func:`feature_vector` of each ``(ratios[i], keeps[i])``, stacked: ``(n, L * H * k)``.

    A batch's rows are selected and padded into one zeroed matrix and scaled in
    one pass; every array must have the same L and H.
    """
    if not ratios:
        raise ConfigError("feature_rows needs at least one array")
    layers, heads = ratios[0].shape[:2]
    # float64, as scale_per_sample computes: float16 and float32 ratios copy in exactly
    out = np.zeros((len(ratios), layers, heads, k), dtype=np.float64)
    for row, given, keep in zip(out, ratios, keeps, strict=True):
        if given.ndim != 3 or given.shape[:2] != (layers, heads):
            raise ConfigError(
                f"lookback ratios of shape {given.shape}; the batch has {layers}x{heads}"
            )
        prefix = keep is None or list(keep) == list(range(len(keep)))
        if not prefix:
            arr = select_chunks(given, keep)  # gathered (and checked), float32
        elif given.dtype in _EXACT_IN_FLOAT32:
            arr = given
        else:  # the features are float32 values, as feature_vector's are
            arr = given.astype(np.float32)
        present = arr.shape[2] if keep is None else len(keep)
        if present > k or present > arr.shape[2]:
            raise ConfigError(f"{present} chunk columns do not fit a model for K={k}")
        row[:, :, :present] = arr[:, :, :present]
    return scale_per_sample(out.reshape(len(ratios), -1), overwrite=True)


def feature_vector(ratios: npt.ArrayLike, k: int, keep: Sequence[int] | None = None) -> FloatArray:
    """Select, pad to ``k``, flatten (C order) and scale one ``(L, H, K_s)`` array."""
    padded = pad_chunks(select_chunks(ratios, keep), k)
    return scale_per_sample(padded.reshape(-1))


def feature_matrix(ratios: npt.ArrayLike, k: int) -> FloatArray:
    """``(n, L, H, K_s)`` -> ``(n, L * H * k)``: every column kept, padded and scaled."""
    arr = np.asarray(ratios, dtype=np.float32)
    if arr.ndim != 4:
        raise ConfigError(f"a batch of lookback ratios must be 4-d (n, L, H, K), got {arr.shape}")
    n, layers, heads, present = arr.shape
    if present > k:
        raise ConfigError(f"{present} chunk columns do not fit a model for K={k}")
    padded = np.zeros((n, layers, heads, k), dtype=np.float32)
    padded[..., :present] = arr
    return scale_per_sample(padded.reshape(n, -1))
