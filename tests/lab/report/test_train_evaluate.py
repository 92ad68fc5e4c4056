"""The report's numbers on hand-made outcomes, the retrieve-again tau, the training variants."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from sidecar.confidence.bound import CoverageCounts, coverage_bound
from sidecar.lab.confidence.recipe import TAU_GRID, _claim_variants, choose_tau
from sidecar.lab.report.evaluate import Replayed, build_report
from sidecar.lab.report.plots import write_plots
from sidecar.lab.report.probe import LeakageProbeResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# ------------------------------------------------------------------ choose_tau


def test_tau_grid() -> None:
    assert TAU_GRID[0] == 0.05 and TAU_GRID[-1] == 0.9 and len(TAU_GRID) == 18


def test_choose_tau_separable_picks_the_first_perfect_tau() -> None:
    # flagged = best < tau: any tau in (0.2, 0.6] flags exactly the two no-answer requests
    tau, stats = choose_tau([0.1, 0.2, 0.6, 0.8], [True, True, False, False])
    assert tau == 0.25
    assert stats == {"f1": 1.0, "precision": 1.0, "recall": 1.0, "flagged_share": 0.5}


def test_choose_tau_best_f1_by_hand() -> None:
    best = [0.1, 0.3, 0.5, 0.7]
    no_answer = [True, False, True, False]
    # tau in (.1, .3]: flag {0}        P 1,   R .5  F1 2/3
    # tau in (.3, .5]: flag {0, 1}     P .5,  R .5  F1 1/2
    # tau in (.5, .7]: flag {0, 1, 2}  P 2/3, R 1   F1 4/5   <- best, first at .55
    # tau in (.7, .9]: flag all        P 1/2, R 1   F1 2/3
    tau, stats = choose_tau(best, no_answer)
    assert tau == 0.55
    assert stats["f1"] == pytest.approx(0.8)
    assert stats["precision"] == pytest.approx(2 / 3)
    assert stats["recall"] == 1.0
    assert stats["flagged_share"] == 0.75


def test_choose_tau_without_positives_keeps_the_smallest_tau() -> None:
    tau, stats = choose_tau([0.1, 0.5, 0.9], [False, False, False])
    assert tau == TAU_GRID[0]
    assert stats["f1"] == 0.0 and stats["recall"] == 0.0


# ------------------------------------------------------------------ _claim_variants


def test_claim_variants_without_claims_is_the_row_itself() -> None:
    row = {"retrieval_top_score": 0.7, "claims_reliability": None}
    assert _claim_variants(row) == [row]
    assert _claim_variants({"retrieval_top_score": 0.7}) == [{"retrieval_top_score": 0.7}]


def test_claim_variants_adds_the_claims_off_copy() -> None:
    row = {
        "retrieval_top_score": 0.7,
        "claims_reliability": 0.9,
        "claims_hallucination_rate": 0.1,
        "lookback_p": 0.6,
    }
    served, masked = _claim_variants(row)
    assert served == row
    assert masked == {
        "retrieval_top_score": 0.7,
        "claims_reliability": None,
        "claims_hallucination_rate": None,
        "lookback_p": 0.6,
    }
    assert row["claims_reliability"] == 0.9  # the input row is not changed


# ------------------------------------------------------------------ build_report


def make_row(
    qid: int,
    *,
    correct: bool,
    decision: str,
    confidence: float | None,
    m1: bool,
    answer: str = "Mary Shelley.",
    advice: bool = False,
    forecast: tuple[tuple[str, float], ...] = (),
    bearing: tuple[str, ...] = (),
    features: bool = True,
) -> Replayed:
    hits = [
        {"chunk_id": "c1", "doc_id": "d1", "score": 0.5 + qid / 100, "text": "t1"},
        {"chunk_id": "c2", "doc_id": "d2", "score": 0.2, "text": "t2"},
    ]
    row: dict[str, Any] = {
        "qid": qid,
        "correct": correct,
        "answer": answer,
        "retrieval": {"request_id": f"q{qid}", "k": 2, "hits": hits},
        "final": {"request_id": f"q{qid}", "answer": answer, "mean_token_logprob": -qid / 10},
        "chunks": [
            {"chunk_id": h["chunk_id"], "contains_answer": h["chunk_id"] in bearing} for h in hits
        ],
    }
    verdict: dict[str, Any] = {
        "request_id": f"q{qid}",
        "decision": decision,
        "policy": "default@1",
        "model_versions": {"generator": "gen"},
        "signals": {
            "retrieval": {"status": "ok", "m1": m1, "m2": 0.5 if m1 else 0.0},
            "lookback": {"status": "ok", "p_factual": 0.1 * qid},
            "claims": {"status": "not-configured"},
        },
        "confidence": confidence,
        "confidence_features": (
            {"lookback_p": 0.1 * qid, "retrieval_top_score": 0.5 + qid / 100, "m2": None}
            if features
            else {}
        ),
        "chunk_forecast": [
            {"chunk_id": c, "p_useful": p, "retrieval_rank": 0} for c, p in forecast
        ],
        "advice": {"action": "retrieve_again"} if advice else None,
    }
    return Replayed(row=row, verdict=verdict, claims=[])


def six_rows() -> list[Replayed]:
    """Three right, three wrong; confidence 8 of 9 pairs ordered right; one abstention."""
    return [
        make_row(1, correct=True, decision="allow", confidence=0.9, m1=True,
                 forecast=(("c1", 0.8), ("c2", 0.3)), bearing=("c1",)),
        make_row(2, correct=True, decision="allow", confidence=0.8, m1=True,
                 forecast=(("c1", 0.7),), bearing=("c1",)),
        make_row(3, correct=False, decision="allow", confidence=0.7, m1=True,
                 forecast=(("c1", 0.4),)),
        make_row(4, correct=True, decision="caveat", confidence=0.6, m1=True,
                 forecast=(("c2", 0.6),), bearing=("c2",)),
        make_row(5, correct=False, decision="block", confidence=0.3, m1=False, advice=True),
        make_row(6, correct=False, decision="block", confidence=0.2, m1=False, advice=True,
                 answer="I don't know."),
    ]  # fmt: skip


def test_headline_numbers_by_hand() -> None:
    report = build_report(six_rows())
    assert report["n"] == 6
    assert report["accuracy"] == 0.5
    # correct {.9, .8, .6} vs wrong {.7, .3, .2}: 8 of 9 pairs ordered right
    assert report["auroc"] == pytest.approx(8 / 9)
    p = [0.9, 0.8, 0.7, 0.6, 0.3, 0.2]
    y = [1, 1, 0, 1, 0, 0]
    assert report["brier"] == pytest.approx(
        sum((a - b) ** 2 for a, b in zip(p, y, strict=True)) / 6
    )
    assert report["nll"] == pytest.approx(
        -sum(math.log(a if b else 1 - a) for a, b in zip(p, y, strict=True)) / 6
    )
    # every forecast in its own bin: ECE = mean |y - p|
    assert report["ece"] == pytest.approx(sum(abs(a - b) for a, b in zip(p, y, strict=True)) / 6)
    assert report["error_rate_allowed"] == pytest.approx(1 / 3)
    assert report["block_rate"] == pytest.approx(2 / 6)
    assert report["caveat_rate"] == pytest.approx(1 / 6)
    assert report["policy"] == "default@1"
    assert report["model_versions"] == {"generator": "gen"}
    json.dumps(report, allow_nan=False)


def test_decision_buckets_by_hand() -> None:
    decisions = build_report(six_rows())["decisions"]
    assert decisions["allow"] == {"n": 3, "share": 0.5, "errors": 1, "error_rate": 1 / 3}
    assert decisions["caveat"] == {"n": 1, "share": 1 / 6, "errors": 0, "error_rate": 0.0}
    assert decisions["block"] == {"n": 2, "share": 1 / 3, "errors": 2, "error_rate": 1.0}


def test_empty_bucket_has_no_error_rate() -> None:
    rows = [r for r in six_rows() if r.verdict["decision"] != "caveat"]
    assert build_report(rows)["decisions"]["caveat"] == {
        "n": 0,
        "share": 0.0,
        "errors": 0,
        "error_rate": None,
    }


def test_signal_aurocs_use_the_verdict_features() -> None:
    signals = build_report(six_rows())["signals"]
    # lookback_p = qid / 10: correct {1, 2, 4} vs wrong {3, 5, 6}: pairs 0+0+1 right of 9
    assert signals["lookback_p"]["n"] == 6
    assert signals["lookback_p"]["auroc"] == pytest.approx(1 / 9)
    assert signals["m2"] == {"title": "m2 (trusted share)", "n": 0, "auroc": None}
    assert signals["mean_token_logprob"]["n"] == 0  # not among the served features


def test_retrieve_again_and_chunk_forecast() -> None:
    ra = build_report(six_rows())["retrieve_again"]
    assert ra["advised"] == 2 and ra["share"] == pytest.approx(1 / 3)
    assert ra["accuracy_advised"] == 0.0
    assert ra["accuracy_not_advised"] == 0.75
    # forecasts: bearing {.8, .7, .6} vs not {.3, .4}: perfectly ordered
    assert ra["chunks_forecast"] == 5
    assert ra["chunk_forecast_auroc_answer_bearing"] == 1.0


def test_coverage_bound_from_replayed_rows() -> None:
    report = build_report(six_rows())
    assert report["abstentions"] == 1 and report["pct_na"] == pytest.approx(100 / 6)
    # covered: rows 1-4 with one error; uncovered: rows 5, 6, of which 6 abstained
    expected = coverage_bound(
        CoverageCounts(
            requests=6,
            covered=4,
            labelled_covered=4,
            errors_covered=1,
            labelled_uncovered=2,
            errors_uncovered=1,
        )
    ).to_dict()
    bound = report["coverage_bound"]
    assert bound == json.loads(json.dumps(expected))
    assert bound["delta_source"] == "labelled-uncovered"
    assert bound["bound"] == pytest.approx(4 / 6 * 1 / 4 + 2 / 6 * 1 / 2)


def test_a_probe_sets_delta_and_is_reported() -> None:
    probe = LeakageProbeResult(
        generator_model="gen",
        embedder="emb",
        k=3,
        candidates=10,
        max_new_tokens=32,
        questions=50,
        skipped=0,
        trials=50,
        abstentions=20,
        correct_from_memory=25,
        errors=5,
        delta=0.1,
        delta_low=0.04,
        delta_high=0.21,
        dropped_gold_chunks=0,
        dropped_answer_chunks=0,
        seconds_per_question=0.1,
    )
    report = build_report(six_rows(), probe=probe)
    assert report["coverage_bound"]["delta_source"] == "probe"
    assert report["coverage_bound"]["delta"]["trials"] == 50
    assert report["leakage_probe"]["errors"] == 5


def test_without_confidence_the_report_reads_the_signals() -> None:
    rows = [
        make_row(i, correct=i % 2 == 0, decision="allow", confidence=None, m1=True, features=False)
        for i in range(1, 5)
    ]
    report = build_report(rows)
    assert report["calibration"] == {"available": False}
    assert report["auroc"] is None and report["ece"] is None
    assert report["brier"] is None and report["nll"] is None
    # read from the verdict signals and the row: lookback qid/10, logprob -qid/10
    assert report["signals"]["lookback_p"]["auroc"] == pytest.approx(3 / 4)
    assert report["signals"]["mean_token_logprob"]["auroc"] == pytest.approx(1 / 4)
    assert report["signals"]["m2"]["n"] == 4
    assert report["signals"]["m2"]["auroc"] == 0.5  # constant


def test_one_class_gives_no_auroc() -> None:
    rows = [
        make_row(i, correct=True, decision="allow", confidence=0.5 + i / 10, m1=True)
        for i in range(3)
    ]
    report = build_report(rows)
    assert report["auroc"] is None
    assert report["error_rate_allowed"] == 0.0
    assert report["calibration"]["available"] is True


def test_no_rows_is_an_error() -> None:
    with pytest.raises(ValueError, match="no rows"):
        build_report([])


# ------------------------------------------------------------------ plots


def test_write_plots_writes_png_files(tmp_path: Path) -> None:
    report = build_report(six_rows())
    written = write_plots(report, tmp_path / "plots")
    names = sorted(p.name for p in written)
    # no alpha sweep without a calibration file
    assert names == [
        "auroc.png",
        "coverage_bound.png",
        "decisions.png",
        "reliability.png",
        "risk_coverage.png",
    ]
    for path in written:
        assert path.parent == tmp_path / "plots"
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC), path.name
        assert len(data) > 1000


def test_write_plots_skips_what_the_report_lacks(tmp_path: Path) -> None:
    rows = [
        make_row(i, correct=True, decision="allow", confidence=None, m1=True, features=False)
        for i in range(3)
    ]
    written = write_plots(build_report(rows), tmp_path)
    # no calibration, no AUROC (one class), no bound (no uncovered labels, no probe),
    # no risk-coverage curve (no confidence)
    assert [p.name for p in written] == ["decisions.png"]
    assert written[0].read_bytes().startswith(PNG_MAGIC)
