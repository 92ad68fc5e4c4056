"""The shipped verifier (models/verifier) on held-out HaluEval QA, and ``guardrail eval claims``.

The slice in ``data/halueval_qa_test_slice.jsonl`` holds the first 60 records
of the verifier's test split (``split_of(question) == "test"``): never trained
on, never used for calibration. The thresholds are sanity floors below the
measured numbers (in the comments), so the test catches a broken artifact or
a broken serving path (tokenizer, truncation, calibration), not small drifts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.claims.scorer import ClaimScorer
from sidecar.claims.verifier import OnnxVerifier, load_artifact
from sidecar.cli.main import main
from sidecar.lab.verifier.datasets import length_auroc
from sidecar.lab.verifier.evaluate import evaluate_pairs
from sidecar.lab.verifier.pairs import build_eval_sets
from sidecar.lab.verifier.sources import read_halueval_qa, split_of
from tests.claims.conftest import DATA, REPO

MODEL = REPO / "models" / "verifier"
SLICE = DATA / "halueval_qa_test_slice.jsonl"


@pytest.fixture(scope="module")
def verifier() -> OnnxVerifier:
    return OnnxVerifier.load(MODEL, threads=1)


def test_the_slice_is_held_out() -> None:
    records = read_halueval_qa(SLICE)
    assert len(records) == 60
    assert all(split_of(r.question) == "test" for r in records)


def test_the_artifact_describes_itself() -> None:
    artifact = load_artifact(MODEL)
    # int8 weights computed in fp32: the same logits on every x86 CPU
    # (sidecar.lab.verifier.quantization)
    assert artifact.onnx_file == "model.int8.onnx" and artifact.quantization == "int8-weights"
    assert (MODEL / artifact.onnx_file).stat().st_size < 30_000_000
    assert (MODEL / "MODEL_CARD.md").is_file()
    assert 0.0 < artifact.unsupported_below <= artifact.supported_from < 1.0
    assert abs((artifact.data.length_auroc_train or 0.0) - 0.5) < 0.05
    assert artifact.question_in_input  # the network reads "question [SEP] claim"
    assert artifact.golden is not None and len(artifact.golden.cases) >= 5
    # its own band (empty at 0.8) and the wider ones GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION
    # can serve instead, fitted on the same validation pairs
    assert artifact.target_precision == 0.8 and artifact.band_for(0.8) == artifact.band
    wide = artifact.band_for(0.9)
    assert wide.unsupported_below < artifact.unsupported_below
    assert wide.supported_from > artifact.supported_from


def test_the_golden_logits_hold_on_this_cpu(verifier: OnnxVerifier) -> None:
    """The load checked them (it raises past the tolerance); they are the file's own logits."""
    golden = verifier.artifact.golden
    assert golden is not None and golden.output == "logit"
    drift = verifier.check_golden("models/verifier")
    assert drift is not None and drift <= golden.tolerance
    single = verifier.golden_logits(golden.inputs)[: len(golden.cases)]
    assert single == pytest.approx(golden.references, rel=0, abs=golden.tolerance)


def test_accuracy_on_length_matched_held_out_pairs(verifier: OnnxVerifier) -> None:
    sets = build_eval_sets(read_halueval_qa(SLICE), split="test", seed=3)
    pairs = sets["length-matched-qa"] + sets["length-matched-decl"] + sets["sentences"]
    assert abs(length_auroc(pairs) - 0.5) < 0.1  # length says nothing here
    pooled = evaluate_pairs(verifier.probabilities, pairs, verifier.band)
    assert float(pooled["auroc"]) >= 0.70, pooled  # measured 0.76 on this slice
    assert float(pooled["accuracy"]) >= 0.63, pooled  # measured 0.68 (on any x86 CPU)
    sentences = evaluate_pairs(verifier.probabilities, sets["sentences"], verifier.band)
    assert float(sentences["auroc"]) >= 0.80, sentences  # measured 0.90
    assert float(sentences["accuracy_decided"]) >= 0.80, sentences  # measured 0.87


def test_eval_claims_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            *("eval", "claims", "--data", str(SLICE), "--format", "halueval-qa"),
            *("--model", str(MODEL), "--limit", "20", "--json"),
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 40 and out["hallucinated"] == 20 and out["split"] == "test"
    for key in ("accuracy", "auroc", "f1", "length_auroc"):
        assert 0.0 <= out[key] <= 1.0


@pytest.mark.parametrize(
    ("fmt", "record"),
    [
        (
            "halueval-summarization",
            {
                "document": "The council approved a new park in 2021. It opens in May 2023.",
                "right_summary": "The council approved a new park in 2021.",
                "hallucinated_summary": "The council rejected a new stadium in 2019.",
            },
        ),
        (
            "halueval-dialogue",
            {
                "knowledge": "Inception was directed by Christopher Nolan.",
                "dialogue_history": "[Human]: Who directed Inception?",
                "right_response": "It was directed by Christopher Nolan.",
                "hallucinated_response": "It was directed by Steven Spielberg in 1985.",
            },
        ),
    ],
)
def test_the_other_halueval_formats(
    fmt: str, record: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(record) for _ in range(3)) + "\n", encoding="utf-8")
    assert main(["eval", "claims", "--data", str(path), "--format", fmt, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 6 and out["split"] == "all"


def test_a_file_of_the_wrong_format_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "claims", "--data", str(SLICE), "--format", "halueval-dialogue"]) == 1
    err = capsys.readouterr().err
    assert "format halueval-dialogue needs string fields" in err and "right_response" in err


def test_the_scorer_runs_on_the_real_model(verifier: OnnxVerifier) -> None:
    from sidecar.claims.evidence import EvidenceChunk
    from sidecar.claims.segment import segment_claims

    scorer = ClaimScorer(verifier)
    context = "Mary Shelley wrote Frankenstein. It was published in 1818 in London."
    checks = scorer.check(
        segment_claims("Mary Shelley wrote Frankenstein. It was published in 1823."),
        scorer.index([EvidenceChunk("c1", context)]),
    )
    assert checks[1].tier == "rule" and checks[1].label.value == "unsupported"
    assert checks[0].verifier_p > checks[1].score
