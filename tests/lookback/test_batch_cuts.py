"""An answer's lookback score does not hang on the batch it was consumed in.

The sidecar scores the answers a poll completes in one ONNX call; how Kafka cut the
polls decides which answers share a call. onnxruntime takes another kernel for a
one-row matrix: the same row alone came out up to 6e-8 from its score in a batch.
Each shipped model scores every answer bit for bit the same in every cut.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sidecar.lookback.artifact import load_metadata
from sidecar.lookback.serving import LookbackRequest, OnnxLookbackScorer
from tests.lookback.test_serving import NO_CERT, final

SHIPPED = sorted(
    p.parent for p in (Path(__file__).parents[2] / "models" / "lookback").glob("*/metadata.json")
)
ANSWERS = 67  # odd, and past the row blocks of the matrix kernels


def _requests(model_dir: Path, n: int) -> list[LookbackRequest]:
    meta, _ = load_metadata(model_dir)
    rng = np.random.default_rng(20261207)
    return [
        LookbackRequest(
            final(
                rng.random((meta.layers, meta.heads, meta.chunks)).astype(np.float32),
                variant=meta.variant,
                generator=meta.generator_model,
            ),
            NO_CERT,
        )
        for _ in range(n)
    ]


def test_the_shipped_models_are_found() -> None:
    assert {p.name for p in SHIPPED} >= {"smollm2-135m-nq-cw", "smollm2-135m-nq-fc"}


@pytest.mark.parametrize("model_dir", SHIPPED, ids=lambda p: p.name)
@pytest.mark.parametrize("cut", [1, 2, 3, 5, 8, 13, 32])
def test_every_cut_scores_each_answer_as_the_whole_batch_does(model_dir: Path, cut: int) -> None:
    scorer = OnnxLookbackScorer.from_dir(model_dir)
    requests = _requests(model_dir, ANSWERS)
    whole = [s.p_factual for s in scorer.score_many(requests)]
    assert all(p is not None and 0.0 < p < 1.0 for p in whole)
    assert len(set(whole)) > ANSWERS // 2  # not vacuous: the answers score apart
    parted = [
        s.p_factual
        for start in range(0, ANSWERS, cut)
        for s in scorer.score_many(requests[start : start + cut])
    ]
    assert parted == whole  # bit for bit


@pytest.mark.parametrize("model_dir", SHIPPED, ids=lambda p: p.name)
def test_score_of_one_is_its_score_in_a_batch(model_dir: Path) -> None:
    scorer = OnnxLookbackScorer.from_dir(model_dir)
    requests = _requests(model_dir, 9)
    batch = scorer.score_many(requests)
    single = [scorer.score(r.final, r.certification) for r in requests]
    assert [s.p_factual for s in single] == [s.p_factual for s in batch]
