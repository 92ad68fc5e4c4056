"""Padding, selection and per-sample scaling of lookback features (seed 000 sec. 3.3)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sidecar.exceptions import ConfigError
from sidecar.lookback.features import (
    feature_matrix,
    feature_rows,
    feature_vector,
    pad_chunks,
    scale_per_sample,
    select_chunks,
    summary_rows,
)

RATIO = st.floats(min_value=0.0, max_value=50.0, allow_nan=False, width=32)


@st.composite
def ratios(draw: st.DrawFn, max_k: int = 4) -> npt.NDArray[np.float32]:
    layers = draw(st.integers(1, 4))
    heads = draw(st.integers(1, 3))
    k = draw(st.integers(1, max_k))
    return draw(hnp.arrays(np.float32, (layers, heads, k), elements=RATIO))


def _logit(x: npt.NDArray[np.float32], seed: int) -> float:
    w = np.random.default_rng(seed).normal(size=x.size)
    return float(w @ x.astype(np.float64) + 0.3)


@given(ratios())
def test_padding_never_changes_a_full_input(arr: npt.NDArray[np.float32]) -> None:
    k = arr.shape[2]
    assert np.array_equal(pad_chunks(arr, k), arr)
    v = feature_vector(arr, k)
    assert np.array_equal(v, scale_per_sample(arr.reshape(-1)))
    # The score of a full input is the same whether or not it went through padding.
    assert _logit(v, 1) == _logit(feature_vector(pad_chunks(arr, k), k), 1)


@given(ratios(max_k=3), st.integers(0, 3))
def test_padding_appends_zero_columns(arr: npt.NDArray[np.float32], extra: int) -> None:
    k = arr.shape[2] + extra
    padded = pad_chunks(arr, k)
    assert padded.shape == (*arr.shape[:2], k)
    assert np.array_equal(padded[:, :, : arr.shape[2]], arr)
    assert not padded[:, :, arr.shape[2] :].any()


@given(ratios(), st.floats(0.01, 100.0), st.floats(-5.0, 5.0))
def test_scaling_is_affine_invariant_for_full_inputs(
    arr: npt.NDArray[np.float32], a: float, b: float
) -> None:
    spread = float(arr.max() - arr.min())
    assume(spread == 0.0 or spread >= 0.5)  # float32 rounding of a*v+b stays far below 2e-5
    k = arr.shape[2]
    base = feature_vector(arr, k)
    moved = feature_vector(arr.astype(np.float64) * a + b, k)
    np.testing.assert_allclose(moved, base, atol=2e-5)


@given(ratios(max_k=2), st.floats(0.01, 100.0))
def test_scaling_is_scale_invariant_with_padding(arr: npt.NDArray[np.float32], a: float) -> None:
    assume(float(arr.max()) == 0.0 or float(arr.max()) >= 1e-3)
    k = arr.shape[2] + 2
    np.testing.assert_allclose(
        feature_vector(arr.astype(np.float64) * a, k), feature_vector(arr, k), atol=2e-5
    )


@given(hnp.arrays(np.float64, (5, 7), elements=st.floats(-1e3, 1e3)))
def test_scaled_rows_lie_in_unit_interval(rows: npt.NDArray[np.float64]) -> None:
    out = scale_per_sample(rows)
    assert out.dtype == np.float32
    assert out.shape == rows.shape
    assert (out >= 0.0).all()
    assert (out <= 1.0).all()
    for row, scaled in zip(rows, out, strict=True):
        if row.max() > row.min():
            assert scaled.min() == 0.0
            assert scaled.max() == 1.0
        else:
            assert not scaled.any()


@settings(max_examples=50)
@given(ratios(max_k=4), st.data())
def test_selection_then_padding_matches_manual_layout(
    arr: npt.NDArray[np.float32], data: st.DataObject
) -> None:
    k = arr.shape[2]
    keep = sorted(data.draw(st.sets(st.integers(0, k - 1))))
    expected = np.zeros_like(arr)
    expected[:, :, : len(keep)] = arr[:, :, keep]
    np.testing.assert_array_equal(
        feature_vector(arr, k, keep), scale_per_sample(expected.reshape(-1))
    )


def test_feature_matrix_equals_rowwise_vectors() -> None:
    rng = np.random.default_rng(0)
    batch = rng.uniform(0, 3, size=(6, 3, 2, 2)).astype(np.float32)
    matrix = feature_matrix(batch, 3)
    assert matrix.shape == (6, 3 * 2 * 3)
    for row, arr in zip(matrix, batch, strict=True):
        np.testing.assert_array_equal(row, feature_vector(arr, 3))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 4))
def test_feature_rows_are_the_batchs_feature_vectors(data: st.DataObject, n: int) -> None:
    """One matrix and one scaling pass for a batch: bit for bit each row's feature_vector."""
    k = 4
    layers, heads = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    # one width for the whole batch (as a serving batch's summaries have) or one per array
    width = data.draw(st.none() | st.integers(1, k))
    arrays, keeps = [], []
    for _ in range(n):
        present = width or data.draw(st.integers(1, k))
        arr = data.draw(hnp.arrays(np.float32, (layers, heads, present), elements=RATIO))
        keep = data.draw(
            st.none()
            | st.just(list(range(data.draw(st.integers(0, present)))))
            | st.lists(st.integers(0, present - 1), unique=True).map(sorted)
        )
        arrays.append(arr)
        keeps.append(keep)
    rows = feature_rows(arrays, k, keeps)
    for row, arr, keep in zip(rows, arrays, keeps, strict=True):
        np.testing.assert_array_equal(row, feature_vector(arr, k, keep))


def test_scaling_refuses_inf_in_any_row() -> None:
    for bad in (np.inf, -np.inf, np.nan):
        with pytest.raises(ConfigError, match="NaN or Inf"):
            scale_per_sample(np.array([[0.0, 1.0], [2.0, bad]]))


def test_flattening_is_c_order_layer_head_chunk() -> None:
    arr = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    v = feature_vector(arr, 2)
    assert v[1] > v[0]  # chunk varies fastest
    np.testing.assert_allclose(v * 11.0, arr.reshape(-1), atol=1e-5)


def test_constant_and_empty_inputs() -> None:
    assert not feature_vector(np.full((2, 2, 3), 4.0), 3).any()
    assert not feature_vector(np.ones((2, 2, 3)), 3, keep=[]).any()
    assert scale_per_sample(np.zeros((0, 4))).shape == (0, 4)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pad_chunks(np.zeros((2, 2, 4)), 3), "do not fit"),
        (lambda: pad_chunks(np.zeros((2, 2)), 3), "3-d"),
        (lambda: select_chunks(np.zeros((2, 2, 3)), [2, 1]), "increasing"),
        (lambda: select_chunks(np.zeros((2, 2, 3)), [0, 3]), "outside"),
        (lambda: scale_per_sample(np.array([[1.0, np.nan]])), "NaN"),
        (lambda: feature_matrix(np.zeros((2, 2, 3)), 3), "4-d"),
        (lambda: feature_rows([np.zeros((2, 2, 4))], 3, [None]), "do not fit"),
        (lambda: feature_rows([np.zeros((2, 2, 3)), np.zeros((2, 3, 3))], 3, [None, None]), "2x2"),
    ],
)
def test_bad_inputs_raise_config_error(call: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call()  # type: ignore[operator]


@settings(max_examples=200)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(1, 9)),
        elements=st.floats(-1e6, 1e6) | st.sampled_from([0.0, 1.0, 0.5]),
    )
)
def test_scaling_is_the_clipped_min_max_formula_bit_for_bit(
    rows: npt.NDArray[np.float64],
) -> None:
    """Without its clip the fast branch is the formula (min <= v <= max, rounding monotonic)."""
    lo, hi = rows.min(axis=1, keepdims=True), rows.max(axis=1, keepdims=True)
    span = hi - lo
    formula = np.where(span > 0.0, (rows - lo) / np.where(span > 0.0, span, 1.0), 0.0)
    # the clip written out: np.clip turns -0.0 into 0.0 in numpy 1.26 but keeps it in 2.x,
    # and a row with -0.0 at its min scales to -0.0 (the bytes differ, the values do not)
    clipped = np.where(formula < 0.0, 0.0, np.where(formula > 1.0, 1.0, formula))
    expected = clipped.astype(np.float32)
    assert scale_per_sample(rows).tobytes() == expected.tobytes()


def test_feature_rows_take_float16_summaries_as_their_float32_values() -> None:
    rng = np.random.default_rng(3)
    halves = [rng.uniform(0.0, 2.0, size=(3, 2, 3)).astype(np.float16) for _ in range(4)]
    keeps: list[list[int] | None] = [None, [0], [0, 2], []]
    rows = feature_rows(halves, 4, keeps)
    singles = [h.astype(np.float32) for h in halves]
    assert rows.tobytes() == feature_rows(singles, 4, keeps).tobytes()
    doubles = [h.astype(np.float64) + 1e-9 for h in halves]  # rounded to float32 first
    for row, arr, keep in zip(feature_rows(doubles, 4, keeps), doubles, keeps, strict=True):
        assert row.tobytes() == feature_vector(arr, 4, keep).tobytes()


# float16 bit patterns a summary may hold: zeros of both signs, subnormals, the largest
HALF = st.sampled_from([0.0, -0.0, 6e-8, 6.1e-5, 1.0, 65504.0]) | st.floats(
    min_value=0.0, max_value=65504.0, allow_nan=False, width=16
)


@st.composite
def summary_batches(
    draw: st.DrawFn,
) -> tuple[list[npt.NDArray[np.float16]], list[list[int] | None], int]:
    """Summaries of one L x H (one width, or one each), with keeps of every kind."""
    k = draw(st.integers(1, 4))
    layers, heads = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    width = draw(st.none() | st.integers(1, k + 1))
    arrays: list[npt.NDArray[np.float16]] = []
    keeps: list[list[int] | None] = []
    for _ in range(draw(st.integers(1, 5))):
        present = width or draw(st.integers(1, k + 1))
        arrays.append(draw(hnp.arrays(np.float16, (layers, heads, present), elements=HALF)))
        keeps.append(
            draw(
                (st.none() if present <= k else st.nothing())
                | st.integers(0, min(present, k)).map(lambda n: list(range(n)))
                | st.lists(st.integers(0, present - 1), unique=True, max_size=k).map(sorted)
            )
        )
    return arrays, keeps, k


@settings(max_examples=300, deadline=None)
@given(summary_batches())
def test_summary_rows_are_feature_rows_bit_for_bit(
    batch: tuple[list[npt.NDArray[np.float16]], list[list[int] | None], int],
) -> None:
    """The serving batch's matrix from the summaries' bytes: feature_rows' bytes exactly
    (-0.0 kept where a kept column has it, +0.0 in the padding and dropped columns)."""
    arrays, keeps, k = batch
    layers, heads = arrays[0].shape[:2]
    got = summary_rows(
        [a.astype("<f2").tobytes() for a in arrays],
        [a.shape[2] for a in arrays],
        keeps,
        layers=layers,
        heads=heads,
        k=k,
    )
    assert got.dtype == np.float32
    assert got.tobytes() == feature_rows(arrays, k, keeps).tobytes()


@pytest.mark.parametrize(
    ("width", "keep"),
    [(3, None), (2, [0, 1, 2]), (3, [2, 1]), (3, [0, 3]), (3, [-1, 1]), (2, [0, 0])],
)
def test_summary_rows_refuse_what_feature_rows_refuses(width: int, keep: list[int] | None) -> None:
    arr = np.ones((2, 1, width), dtype=np.float16)
    with pytest.raises(ConfigError) as old:
        feature_rows([arr], 2, [keep])
    with pytest.raises(ConfigError) as new:
        summary_rows([arr.tobytes()], [width], [keep], layers=2, heads=1, k=2)
    assert str(new.value) == str(old.value)
    with pytest.raises(ConfigError, match="take 4 bytes, got 6"):
        summary_rows([b"\x00" * 6], [2], [None], layers=1, heads=1, k=2)


class _Subclass(np.ndarray):
    """An array subclass (a memmap, say), which ``np.asarray`` views instead of copying."""


def test_scaling_leaves_its_input_alone_unless_told_to_overwrite_it() -> None:
    rng = np.random.default_rng(5)
    rows = rng.uniform(0.0, 2.0, size=(4, 6))
    rows[2] = 0.7  # a constant row: all zeros after scaling
    before = rows.copy()
    expected = scale_per_sample(rows)
    assert rows.tobytes() == before.tobytes()
    assert not expected[2].any()
    single = rows[0].astype(np.float32)
    scale_per_sample(single)
    assert single.tobytes() == rows[0].astype(np.float32).tobytes()
    scale_per_sample(rows.view(_Subclass))  # asarray hands back a view of the caller's data
    assert rows.tobytes() == before.tobytes()
    assert scale_per_sample(rows, overwrite=True).tobytes() == expected.tobytes()
    assert rows.tobytes() != before.tobytes()  # scaled in place, as asked
