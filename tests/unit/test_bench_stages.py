from __future__ import annotations

from collections.abc import Callable

from sidecar.bench.e2e import LoadShape, answer_events, percentiles
from sidecar.bench.stages import run_stages
from sidecar.config import Settings
from sidecar.pipeline.signals import SignalSuite
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
