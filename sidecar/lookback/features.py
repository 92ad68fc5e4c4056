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

import functools
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
    "summary_rows",
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


def summary_rows(
    summaries: Sequence[bytes],
    widths: Sequence[int],
    keeps: Sequence[Sequence[int] | None],
    *,
    layers: int,
    heads: int,
    k: int,
) -> FloatArray:
    """:func:`feature_rows` of a batch of attention summaries given as their wire bytes.

    ``summaries[i]`` holds ``layers * heads * widths[i]`` little-endian float16 in C
    order (``AttentionSummary.decoded()``). The summaries of one width are read as one
    ``uint16`` array, the columns not kept and the padding are zeroed as integers
    (``+0.0``, the padding's zero) and the batch is widened to float64 in one pass: the
    matrix :func:`feature_rows` builds row by row, scaled the same way, bit for bit.
    A keep that is not a prefix of the columns (a reranked retrieval) is gathered alone.
    """
    if not summaries:
        raise ConfigError("summary_rows needs at least one summary")
    # the bytes and the uint16 matrix are let go before the scaling's temporaries are
    # made: a batch's matrices are a few hundred KiB each, and a larger peak makes the
    # allocator give pages back to the OS and fault them in again on every batch
    wide = _summary_matrix(summaries, widths, keeps, layers=layers, heads=heads, k=k)
    return scale_per_sample(wide, overwrite=True)


def _summary_matrix(
    summaries: Sequence[bytes],
    widths: Sequence[int],
    keeps: Sequence[Sequence[int] | None],
    *,
    layers: int,
    heads: int,
    k: int,
) -> npt.NDArray[np.float64]:
    """:func:`summary_rows` before the scaling: the float64 ``(n, layers * heads * k)``."""
    n, cells = len(summaries), layers * heads
    presents: list[int] = []  # per row: how many columns it keeps (then zeros)
    gathered: dict[int, list[int]] = {}  # row -> its kept columns, when not a prefix
    by_width: dict[int, list[int]] = {}
    for i, (width, keep) in enumerate(zip(widths, keeps, strict=True)):
        present = width if keep is None else len(keep)
        if keep is not None:
            columns = keep if type(keep) is list else list(keep)
            if columns != list(range(present)):
                select_chunks(np.zeros((1, 1, width), dtype=np.float32), columns)  # raises if bad
                gathered[i] = columns
            elif present > width:
                raise ConfigError(f"{present} chunk columns do not fit a model for K={k}")
        if present > k:
            raise ConfigError(f"{present} chunk columns do not fit a model for K={k}")
        presents.append(present)
        by_width.setdefault(width, []).append(i)
    groups = []
    for width, members in by_width.items():
        raw = b"".join([summaries[i] for i in members])
        size = len(members) * cells * width * 2
        if len(raw) != size:
            raise ConfigError(
                f"{len(members)} attention summaries of {layers}x{heads}x{width} float16 "
                f"take {size} bytes, got {len(raw)}"
            )
        groups.append((width, members, np.frombuffer(raw, "<u2").reshape(-1, cells, width)))
    if len(groups) == 1 and groups[0][0] == k and not gathered:
        bits = groups[0][2]  # the batch as it came (read only: masked into a new array)
    else:
        bits = np.zeros((n, cells, k), dtype=np.uint16)
        for width, members, given in groups:
            bits[members, :, : min(width, k)] = given[:, :, :k]
            for j, i in enumerate(members):
                if i in gathered:  # its kept columns first, then padding
                    bits[i] = 0
                    bits[i, :, : len(gathered[i])] = given[j][:, gathered[i]]
    # the columns not kept and the padding are zeroed as integers (+0.0, the padding's zero)
    masked = np.multiply(bits.reshape(n, cells * k), _prefix_masks(cells, k)[presents])
    wide: npt.NDArray[np.float64] = masked.view("<f2").astype(np.float64)  # widened exactly
    return wide


@functools.lru_cache(maxsize=16)  # one (cells, k) per served model
def _prefix_masks(cells: int, k: int) -> npt.NDArray[np.uint16]:
    """Row p: 1 in the first p columns of each of the ``cells`` (layer, head) blocks of
    ``k``, 0 after. Read only, shared by every batch (tiled per batch, it was ~0.5 us a
    request); ``masks[presents]`` copies the rows a batch needs."""
    masks = np.tile((np.arange(k) < np.arange(k + 1)[:, None]).astype(np.uint16), cells)
    masks.flags.writeable = False
    return masks


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
