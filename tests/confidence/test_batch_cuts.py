"""A request's confidence does not hang on the batch it was consumed in.

The sidecar scores the requests a poll completes in one numpy pass per model (the
answers' rows, every request's chunk rows one after another). numpy's matrix-vector
product picks its kernel by the matrix's height: a row's score moved in its last bits
(up to 2.2e-16) with the rows beside it. ``row_scores`` sums each row alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sidecar.confidence.scorer import CalibratedConfidenceScorer
from sidecar.contracts.events import Signals
from tests.confidence.test_scorer import FINAL, certified, retrieval

SHIPPED = Path(__file__).parents[2] / "models" / "confidence" / "smollm2-135m-nq"
ROWS = 257


@pytest.fixture(scope="module")
def shipped() -> CalibratedConfidenceScorer:
    return CalibratedConfidenceScorer.from_dir(SHIPPED)


def _rows(width: int) -> list[list[float | None]]:
    rng = np.random.default_rng(20261207)
    return [
        [None if rng.random() < 0.15 else float(rng.normal(0.5, 0.3)) for _ in range(width)]
        for _ in range(ROWS)
    ]


@pytest.mark.parametrize("which", ["answer", "chunks"])
@pytest.mark.parametrize("cut", [1, 2, 3, 5, 8, 13, 64])
def test_every_cut_scores_each_row_as_the_whole_matrix_does(
    shipped: CalibratedConfidenceScorer, which: str, cut: int
) -> None:
    model = shipped.answer if which == "answer" else shipped.chunks
    names = model.spec.signals
    rows = _rows(len(names))
    whole = model.predict_rows(rows, names).tolist()
    assert len(set(whole)) > ROWS // 2  # not vacuous: the rows score apart
    parted = [
        p
        for start in range(0, ROWS, cut)
        for p in model.predict_rows(rows[start : start + cut], names).tolist()
    ]
    assert parted == whole  # bit for bit


def test_a_request_scores_alike_alone_and_in_any_batch(
    shipped: CalibratedConfidenceScorer,
) -> None:
    items = [
        (retrieval((0.95, 0.15, 0.7, 0.4)), FINAL, certified("c0", "c2")),
        (retrieval((0.3, 0.2, 0.1, 0.05)), FINAL, certified()),
        (retrieval(()), FINAL, Signals()),
        (retrieval((0.95, 0.9, 0.85, 0.8)), FINAL, Signals()),
        (retrieval((0.61, 0.6, 0.59, 0.2)), FINAL, certified("c0", "c1", "c2")),
    ] * 7
    whole = shipped.score_batch(items)
    for cut in (1, 2, 3, 4):
        parted = [
            r for s in range(0, len(items), cut) for r in shipped.score_batch(items[s : s + cut])
        ]
        assert parted == whole
