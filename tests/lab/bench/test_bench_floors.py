"""The bench's floors and ratios without Kafka: the constant-verdict processor, the report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sidecar import runtime
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AnswerVerdict
from sidecar.lab.bench.dict_floor import DictFloor
from sidecar.lab.bench.e2e import LoadShape, answer_events, warmup_requests
from sidecar.lab.bench.floors import (
    ConstantVerdictProcessor,
    DictVerdictProcessor,
    ParsingVerdictProcessor,
    constant_verdict,
    is_final,
)
from sidecar.lab.bench.ratios import (
    cpu_model,
    floors_report,
    half_capacity,
    incomplete_failure,
    machine,
)
from sidecar.lab.bench.stages import request_items
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import BatchItem


def _requests(prefix: str, n: int) -> list[BatchItem]:
    """The batch items of ``n`` fast-path requests ``{prefix}-0`` .. ``{prefix}-{n-1}``."""
    items: list[BatchItem] = []
    for i in range(n):
        items += request_items(answer_events(f"{prefix}-{i}", LoadShape()), f"{prefix}-{i}", i)
    return items


def test_is_final_tells_the_final_event_from_the_others() -> None:
    r, deltas, final = answer_events("f-1", LoadShape())
    assert is_final(orjson.dumps(final))
    assert not any(is_final(orjson.dumps(e)) for e in (r, *deltas))
    assert not is_final(None)


def test_constant_verdict_processor_answers_each_final_once_and_finishes_every_input(
    settings_factory: Callable[..., Settings],
) -> None:
    processor = ConstantVerdictProcessor(settings_factory())
    items = _requests("r", 3)
    step = processor.on_batch(items, 0.0)
    assert [out.destination for out in step.outputs] == [Destination.VERDICTS] * 3
    verdicts = [AnswerVerdict.model_validate_json(out.value) for out in step.outputs]
    assert [v.request_id for v in verdicts] == ["r-0", "r-1", "r-2"]
    assert [out.key for out in step.outputs] == [b"r-0", b"r-1", b"r-2"]
    assert step.done == [ref for *_, ref in items]
    assert processor.counters.consumed == len(items) and processor.counters.verdicts == 3


def test_constant_verdict_processor_counts_consumed_records_as_the_sidecar_does(
    settings_factory: Callable[..., Settings],
) -> None:
    """The floor feeds ``guardrail.consumer.records`` (the processor's input tally), so the
    no-op passthrough pays for the same per-batch counter the sidecar does."""
    processor = ConstantVerdictProcessor(settings_factory())
    items = _requests("c", 2)
    feedback_ref = items[0][3]
    items.append((InputKind.FEEDBACK, b"{}", b"c-0", feedback_ref))
    processor.on_batch(items, 0.0)
    processor.on_batch(items[:1], 0.0)
    counts = processor.counters.inputs.counts()
    generation = sum(1 for kind, *_ in items if kind is InputKind.GENERATION)
    assert counts[("retrieval", "accepted")] == 3
    assert counts[("generation", "accepted")] == generation
    assert counts[("feedback", "accepted")] == 1
    assert sum(counts.values()) == processor.counters.consumed == len(items) + 1


def test_constant_verdict_processor_skips_keyless_and_non_generation_records(
    settings_factory: Callable[..., Settings],
) -> None:
    processor = ConstantVerdictProcessor(settings_factory())
    items = _requests("k", 1)
    final_kind, final_raw, _, final_ref = items[-1]
    keyless = [(final_kind, final_raw, None, final_ref)]
    as_retrieval = [(InputKind.RETRIEVAL, final_raw, b"k-0", final_ref)]
    assert processor.on_batch(keyless, 0.0).outputs == []
    assert processor.on_batch(as_retrieval, 0.0).outputs == []


def test_the_parsing_floor_reads_the_request_id_from_the_json_not_the_key(
    settings_factory: Callable[..., Settings],
) -> None:
    processor = ParsingVerdictProcessor(settings_factory())
    items = _requests("p", 3)
    kind, raw, _, ref = items[-1]
    items[-1] = (kind, raw, None, ref)  # keyless: the JSON still names the request
    step = processor.on_batch(items, 0.0)
    verdicts = [AnswerVerdict.model_validate_json(out.value) for out in step.outputs]
    assert [v.request_id for v in verdicts] == ["p-0", "p-1", "p-2"]
    assert [out.key for out in step.outputs] == [b"p-0", b"p-1", b"p-2"]
    assert step.done == [ref for *_, ref in items]
    assert processor.counters.consumed == len(items) and processor.counters.verdicts == 3


def test_the_parsing_floor_finishes_what_does_not_parse_without_a_verdict(
    settings_factory: Callable[..., Settings],
) -> None:
    processor = ParsingVerdictProcessor(settings_factory())
    *_, ref = _requests("b", 1)[-1]
    bad = [
        (InputKind.GENERATION, b'{"event_type": "generation.final", ', b"b-0", ref),
        (InputKind.GENERATION, b"[1, 2]", b"b-0", ref),
        (InputKind.GENERATION, None, b"b-0", ref),
        (InputKind.RETRIEVAL, b"\xff\xfe", b"b-0", ref),
    ]
    step = processor.on_batch(bad, 0.0)
    assert step.outputs == [] and step.done == [ref] * 4
    assert processor.counters.consumed == 4


def test_constant_verdict_is_a_valid_verdict_stamped_with_the_request() -> None:
    verdict = AnswerVerdict.model_validate_json(constant_verdict("q-9"))
    assert verdict.request_id == "q-9"
    assert [r.code for r in verdict.reasons] == ["bench.noop"]


@dataclass
class _Run:
    throughput_answers_per_s: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    incomplete: int = 0
    requests: int = 10
    verdicts: int = 10
    offered_answers_per_s: float | None = None
    cpu_s: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    processor_cpu_s: float | None = None


def _runs(noop_offered: float) -> dict[str, _Run]:
    """A no-op draining 1,000 answers/s (half capacity 500); its open loop sent ``noop_offered``."""
    return {
        "fast_drain": _Run(800.0),
        "noop_drain": _Run(1000.0),
        "raw_drain": _Run(2000.0),
        "parse_drain": _Run(900.0),
        "dict_drain": _Run(600.0),
        "native_drain": _Run(750.0),
        "full_drain": _Run(40.0),
        "fast_half": _Run(500.0, {"p99": 30.0}, offered_answers_per_s=499.0),
        "noop_half": _Run(noop_offered, {"p99": 20.0}, offered_answers_per_s=noop_offered),
    }


def test_floors_report_divides_the_sidecar_by_its_floors() -> None:
    report = floors_report(_runs(noop_offered=480.0))
    assert report["fast_drain_vs_noop"] == 0.8
    assert report["p99_at_half_capacity_vs_noop"] == 1.5
    assert report["full_path_vs_fast_path"] == 0.05
    assert report["noop_vs_raw_client"] == 0.5
    assert report["parse_vs_noop"] == 0.9 and report["fast_drain_vs_parse"] == 0.889
    assert report["parse_answers_per_s"] == 900.0
    assert report["dict_vs_noop"] == 0.6 and report["fast_drain_vs_dict"] == 1.333
    assert report["dict_answers_per_s"] == 600.0
    assert report["native_vs_noop"] == 0.75 and report["native_answers_per_s"] == 750.0
    assert report["half_capacity_answers_per_s"] == 500.0
    assert report["p99_ms_at_half_capacity"] == 30.0
    assert report["half_capacity_offered_answers_per_s"] == {"sidecar": 499.0, "noop": 480.0}
    assert report["half_capacity_rate_held"] is True


def test_alternated_pairs_give_the_drain_ratio_their_median() -> None:
    runs = _runs(noop_offered=480.0)  # the first drains: 800 / 1,000
    for i, (fast, noop) in enumerate([(300.0, 1000.0), (330.0, 600.0), (250.0, 1000.0)]):
        runs[f"paired_fast_{i}"] = _Run(fast, requests=2000, cpu_s=0.6)
        runs[f"paired_noop_{i}"] = _Run(noop, requests=2000, cpu_s=0.2)
    runs["paired_fast_3"] = _Run(900.0)  # its no-op drain missing: not a pair
    report = floors_report(runs)
    assert report["fast_drain_vs_noop_pairs"] == [0.3, 0.55, 0.25]
    assert report["fast_drain_vs_noop"] == report["fast_drain_vs_noop_paired"] == 0.3
    assert report["fast_drain_vs_noop_single"] == 0.8
    assert report["paired_answers_per_s"] == {
        "sidecar": [300.0, 330.0, 250.0],
        "noop": [1000.0, 600.0, 1000.0],
    }
    assert report["paired_cpu_us_per_request"] == {
        "sidecar": [300.0] * 3,
        "noop": [100.0] * 3,
    }
    # no processor thread in these runs: CPU not split
    assert report["paired_processor_cpu_us_per_request"] == {"sidecar": [], "noop": []}
    assert report["noop_vs_sidecar_loop_cpu"] is None
    # without pairs the first drains' ratio stands, and says it has no pairs
    alone = floors_report(_runs(noop_offered=480.0))
    assert alone["fast_drain_vs_noop"] == alone["fast_drain_vs_noop_single"] == 0.8
    assert alone["fast_drain_vs_noop_paired"] is None and alone["fast_drain_vs_noop_pairs"] == []


def test_the_pairs_split_each_process_cpu_into_its_processor_and_its_loop() -> None:
    runs = _runs(noop_offered=480.0)
    # 2,000 requests a drain: the sidecar's 0.6 s = processor 0.4 + loop 0.2 (100 us a
    # request), the no-op's 0.16 s (80 us: 0.8 of the sidecar's loop alone)
    for i, (processor, noop) in enumerate([(0.4, 0.16), (0.44, 0.1), (0.36, 0.2)]):
        runs[f"paired_fast_{i}"] = _Run(300.0, requests=2000, cpu_s=0.6, processor_cpu_s=processor)
        runs[f"paired_noop_{i}"] = _Run(1000.0, requests=2000, cpu_s=noop, processor_cpu_s=0.01)
    report = floors_report(runs)
    assert report["paired_processor_cpu_us_per_request"] == {
        "sidecar": [200.0, 220.0, 180.0],
        "noop": [5.0, 5.0, 5.0],
    }
    assert report["paired_loop_cpu_us_per_request"] == {
        "sidecar": [100.0, 80.0, 120.0],
        "noop": [75.0, 45.0, 95.0],
    }
    # per pair: 80 / 100, 50 / 80, 100 / 120
    assert report["noop_vs_sidecar_loop_cpu_pairs"] == [0.8, 0.625, 0.833]
    assert report["noop_vs_sidecar_loop_cpu"] == 0.8
    # a sidecar without its processor thread (processing on the loop): its pair not split
    runs["paired_fast_1"] = _Run(300.0, requests=2000, cpu_s=0.6)
    assert floors_report(runs)["noop_vs_sidecar_loop_cpu_pairs"] == [0.8, 0.833]


def test_the_latency_point_at_half_the_sidecars_own_rate() -> None:
    runs = _runs(noop_offered=480.0)
    assert floors_report(runs)["p99_at_half_sidecar_capacity_vs_noop"] is None  # not run
    asked = {"rate_answers_per_s": 150.0}
    runs["fast_sidecar_half"] = _Run(
        150.0, {"p99": 24.0}, offered_answers_per_s=149.0, config=asked
    )
    runs["noop_sidecar_half"] = _Run(
        150.0, {"p99": 16.0}, offered_answers_per_s=150.0, config=asked
    )
    report = floors_report(runs)
    assert report["p99_at_half_sidecar_capacity_vs_noop"] == 1.5
    assert report["p99_ms_at_half_sidecar_capacity"] == 24.0
    assert report["noop_p99_ms_at_half_sidecar_capacity"] == 16.0
    assert report["half_sidecar_capacity_answers_per_s"] == 150.0
    assert report["half_sidecar_capacity_rate_held"] is True
    runs["noop_sidecar_half"] = _Run(
        120.0, {"p99": 16.0}, offered_answers_per_s=120.0, config=asked
    )
    assert floors_report(runs)["half_sidecar_capacity_rate_held"] is False  # 0.8 of the rate


def test_a_load_generator_behind_its_rate_marks_the_half_capacity_point_not_held() -> None:
    report = floors_report(_runs(noop_offered=440.0))  # 0.88 of the 500 asked
    assert report["half_capacity_rate_held"] is False
    assert report["p99_at_half_capacity_vs_noop"] == 1.5  # still reported, flagged


def test_a_missing_latency_or_zero_floor_gives_no_ratio() -> None:
    runs = {
        name: _Run(0.0)
        for name in ("fast_drain", "noop_drain", "raw_drain", "full_drain", "fast_half")
    }
    runs["noop_half"] = _Run(0.0, {"p99": 0.0})
    report = floors_report(runs)
    assert report["fast_drain_vs_noop"] is None
    assert report["p99_at_half_capacity_vs_noop"] is None
    assert report["native_vs_noop"] is None  # not built: left out, not zero
    assert half_capacity(0.0) == 1.0


def test_incomplete_fails_the_run_and_names_where() -> None:
    assert incomplete_failure({"fast_drain": _Run(1.0), "full_drain": _Run(1.0)}) is None
    why = incomplete_failure({"fast_drain": _Run(1.0), "full_drain": _Run(1.0, incomplete=300)})
    assert why is not None and "300 incomplete" in why and "full_drain: 300" in why
    assert "without a verdict" not in why


def test_requests_left_without_a_verdict_fail_the_run() -> None:
    why = incomplete_failure({"full_drain": _Run(1.0, requests=500, verdicts=331)})
    assert why is not None and "169 requests without a verdict" in why
    assert "full_drain: 169" in why and "incomplete verdicts" not in why


def test_machine_reads_the_model_and_the_kernel_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx avx2 fma\n"
    )
    got = machine(cpuinfo)
    assert got["cpu_model"] == "AMD EPYC 7B13"
    assert got["cpu_flags"] == ["avx2", "fma"]
    assert (got["avx2"], got["avx512"], got["vnni"]) == (True, False, False)
    assert cpu_model(tmp_path / "absent") is None
    assert machine(tmp_path / "absent")["cpu_flags"] is None


def test_the_warm_up_is_a_second_of_load_or_a_fifth_of_a_short_run() -> None:
    assert warmup_requests(500.0, 20.0) == 500
    assert warmup_requests(4946.3, 0.5) == 494
    assert warmup_requests(2.8, 17.9) == 2


def test_the_dict_floor_answers_each_request_once_with_a_valid_verdict(
    settings_factory: Callable[..., Settings],
) -> None:
    settings = settings_factory(signals={"claims": False})
    processor = DictVerdictProcessor(settings, DictFloor(runtime.build_processor(settings)))
    items = _requests("d", 3)
    step = processor.on_batch(items, 0.0)
    verdicts = [AnswerVerdict.model_validate_json(out.value) for out in step.outputs]
    assert [v.request_id for v in verdicts] == ["d-0", "d-1", "d-2"]
    assert [out.key for out in step.outputs] == [b"d-0", b"d-1", b"d-2"]
    assert all(out.destination is Destination.VERDICTS for out in step.outputs)
    assert step.done == [ref for *_, ref in items]  # every input finished by its step
    assert processor.counters.consumed == len(items) and processor.counters.verdicts == 3
    # its input tally is the no-op's for the same records (a feedback record included)
    noop = ConstantVerdictProcessor(settings)
    more = [*items, (InputKind.FEEDBACK, b"{}", b"d-0", items[0][3])]
    processor.on_batch(more[-1:], 0.0)
    noop.on_batch(more, 0.0)
    assert processor.counters.inputs.counts() == noop.counters.inputs.counts()
