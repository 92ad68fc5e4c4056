from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from sidecar import runtime
from sidecar.claims.checker import VerifierClaimChecker
from sidecar.config import Settings
from sidecar.lab.bench import stages
from sidecar.lab.bench.e2e import LoadShape, answer_events, percentiles
from sidecar.lab.bench.profile import package_of, profile_requests
from sidecar.lab.bench.stages import run_claim_stages, run_stages
from sidecar.pipeline.ports import SignalSuite
from sidecar.policy import PlaceholderPolicy


def test_percentiles_pick_order_statistics() -> None:
    values = [float(v) for v in range(1, 101)]
    got = percentiles(values)
    assert got["p50"] == 51.0 and got["p99"] == 100.0 and got["max"] == 100.0
    assert percentiles([]) == {}


def test_answer_events_put_claims_in_answer_order() -> None:
    r, deltas, final = answer_events("q-1", LoadShape(k=5, deltas=2, claims=5))
    assert len(r["hits"]) == 5
    assert "".join(d["text"] for d in deltas) == final["answer"]
    assert final["answer"].count(". ") == 5


def test_stage_benchmarks_run_and_report_microseconds(
    settings_factory: Callable[..., Settings],
) -> None:
    out = run_stages(settings_factory(), PlaceholderPolicy(), SignalSuite(), n=30)
    for stage in (
        "decode_retrieval",
        "decode_final",
        "whole_request_processor",
        "policy",
        "verdict_encode",
    ):
        assert out[stage]["p50_us"] > 0, stage


def test_package_of_names_the_library_or_ours() -> None:
    site = "/x/.venv/lib/python3.11/site-packages"
    assert package_of(f"{site}/onnxruntime/capi/session.py") == "onnxruntime"
    assert package_of("/work/main/sidecar/claims/evidence.py") == "sidecar"
    assert package_of("<built-in>") == "builtins"
    assert package_of("/usr/lib/python3.11/asyncio/events.py") == "stdlib"


def test_profile_attributes_self_time_to_functions(
    settings_factory: Callable[..., Settings],
) -> None:
    """Whole requests under the sampling profiler: shares sum to one, our code shows up."""
    out = profile_requests(settings_factory(), PlaceholderPolicy(), SignalSuite(), n=200, top=5)
    assert out["requests"] == 200
    assert out["claims_on"] is False
    assert sum(out["by_package"].values()) == pytest.approx(1.0, abs=0.01)
    assert "sidecar" in out["by_package"]
    rows = out["top_self_time"]
    assert 1 <= len(rows) <= 5
    assert [r["share"] for r in rows] == sorted((r["share"] for r in rows), reverse=True)
    assert all(r["ms_per_request"] >= 0 and ":" in r["where"] for r in rows)


def test_claim_stages_time_segmentation_selection_and_the_verifier() -> None:
    checker = runtime.build_signals(Settings.load(signals={"claims": True})).claims
    assert checker is not None
    out = run_claim_stages(checker, n=5)
    assert out["claims_per_answer"] == 5  # the bench answer has five one-fact sentences
    for stage in (
        "claim_segmentation_per_answer",
        "evidence_select",
        "verifier_single_claim",
        "verifier_batched_per_claim",
        "verifier_batched_per_window",
    ):
        assert out[stage]["p50_us"] > 0, stage
    # the shipped verifier scores each claim against 1..evidence_max_windows windows
    assert isinstance(checker, VerifierClaimChecker)
    assert 1 <= out["windows_per_claim"] <= checker.scorer.max_windows
    per_claim, per_window = out["verifier_batched_per_claim"], out["verifier_batched_per_window"]
    assert per_window["p50_us"] == pytest.approx(
        per_claim["p50_us"] / out["windows_per_claim"], rel=0.02
    )
    assert run_claim_stages(object(), n=5) == {}  # type: ignore[arg-type]  # not a verifier


def test_the_whole_request_is_timed_with_the_startup_objects_frozen_as_served(
    settings_factory: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``guardrail run`` freezes what it loaded (GUARDRAIL_GC_FREEZE); the in-process
    stages timed the processor without, so each full collection walked the models."""
    frozen_while_timed: list[int] = []
    timed = stages._time

    def recording(fn: Callable[[], object], n: int) -> dict[str, float]:
        frozen_while_timed.append(gc.get_freeze_count())
        return timed(fn, n)

    monkeypatch.setattr(stages, "_time", recording)
    before = gc.get_freeze_count()
    out = run_stages(settings_factory(), PlaceholderPolicy(), SignalSuite(), n=30)
    assert out["whole_request_processor"]["p50_us"] > 0
    decode_retrieval, whole = frozen_while_timed[0], frozen_while_timed[2]
    assert decode_retrieval == before and whole > before  # the processor's timing only
    assert gc.get_freeze_count() == before  # given back
    frozen_while_timed.clear()
    run_stages(settings_factory(gc_freeze=False), PlaceholderPolicy(), SignalSuite(), n=30)
    assert set(frozen_while_timed) == {before}
