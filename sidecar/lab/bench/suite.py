"""``guardrail bench``: the whole benchmark, one JSON object.

Runs on the machine it is given; on 2 cores the load generator, the broker and
the sidecar share the CPU, which the JSON records (``cpu_count``, ``cpu_model``,
the CPU flags). The sidecar is also reported as ratios to floors measured in
the same run (``ratios.py``, ``floors.py``), and ``failure`` names the runs that
decided any request ``incomplete`` (the CLI then exits non-zero).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from sidecar.config import Settings
from sidecar.kafka.topics import create_topics
from sidecar.lab.bench import native_floor
from sidecar.lab.bench.e2e import Bench, LoadShape, RunResult
from sidecar.lab.bench.placement import Placement
from sidecar.lab.bench.profile import profile_paths
from sidecar.lab.bench.ratios import (
    PAIRS,
    floors_report,
    half_capacity,
    incomplete_failure,
    machine,
)
from sidecar.lab.bench.stages import run_claim_stages, run_stages
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port, lib_for


def _log(msg: str) -> None:
    sys.stderr.write(f"[bench] {msg}\n")
    sys.stderr.flush()


async def _suite(
    broker: LocalKafka, workdir: Path, quick: bool, placement: Placement
) -> dict[str, Any]:
    from sidecar import runtime  # noqa: PLC0415

    scale = 0.25 if quick else 1.0
    runs: dict[str, RunResult] = {}
    cpus = placement.under_test  # every process under test runs there
    fast = Bench(broker, workdir, {"GUARDRAIL_SIGNALS__CLAIMS": "false"}, cpus=cpus)
    baseline = Bench(
        broker, workdir, {**fast.extra_env, "GUARDRAIL_KAFKA__BATCH": "false"}, cpus=cpus
    )

    _log("fast path drain (batched, pipelined)")
    runs["fast_drain"] = await fast.drain("fast", int(20000 * scale), LoadShape())
    # as the Helm chart starts it: Prometheus metrics on (stage durations served from
    # a plain histogram, not the SDK's per-record path)
    charted = Bench(
        broker,
        workdir,
        {**fast.extra_env, "GUARDRAIL_METRICS__PROMETHEUS_PORT": str(free_port())},
        cpus=cpus,
    )
    _log("fast path drain with Prometheus metrics on (the chart's default)")
    runs["fast_prometheus_drain"] = await charted.drain("fastp", int(20000 * scale), LoadShape())
    # every verdict traced: the SDK's tracer batching spans to an OTLP endpoint that
    # refuses them (spans are dropped; a live collector's export would add to this),
    # with one child span per stage (the default) and with the stages as attributes
    traced_env = {
        **fast.extra_env,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{free_port()}/v1/traces",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_METRICS_EXPORTER": "none",
    }
    for name, stage_spans in (
        ("fast_traced_drain", "true"),
        ("fast_traced_attributes_drain", "false"),
    ):
        _log(f"fast path drain tracing every verdict (stage spans: {stage_spans})")
        env = {**traced_env, "GUARDRAIL_TRACING__STAGE_SPANS": stage_spans}
        traced = Bench(broker, workdir, env, cpus=cpus)
        runs[name] = await traced.drain(name, int(20000 * scale), LoadShape())
    _log("baseline drain (one message, one confirmed publish at a time)")
    runs["baseline_drain"] = await baseline.drain("base", int(4000 * scale), LoadShape())
    _log("fast path open loop at 500 answers/s")
    runs["fast_500"] = await fast.open_loop("o500", 500, 20 * scale, LoadShape())
    # the floors drain 4x the requests: at 4-5x the fast path's rate, 5,000 took them
    # 0.2-0.4 s and their rate moved by +-20 % between runs
    runs.update(await _floors(fast, int(80000 * scale), int(10000 * scale)))
    runs.update(await _pairs(fast, int(80000 * scale), int(10000 * scale)))
    full = Bench(broker, workdir, {"GUARDRAIL_SIGNALS__CLAIMS": "true"}, cpus=cpus)
    claims_shape = LoadShape(k=5, deltas=5, claims=5, attention=None)
    _log("full path drain (5 claims per answer, K=5)")
    runs["full_drain"] = await full.drain("full", int(2000 * scale), claims_shape)
    # half the claim path's own drain rate: the same point on any machine (50/s was
    # 10x what this 2-core machine's verifier can decide; it only measured a queue)
    full_rate = half_capacity(runs["full_drain"].throughput_answers_per_s)
    _log(f"full path open loop at half its drain rate ({full_rate} answers/s)")
    runs["full_half"] = await full.open_loop(
        "fhalf", full_rate, int(200 * scale) / full_rate, claims_shape
    )
    # 3 partitions (odd): two instances split them 2 + 1, which the co-partitioning
    # assignor must do without tearing a request apart (0 incomplete)
    _log("scale-out: 3 partitions, one instance then two")
    runs["scale_1"] = await fast.drain(
        "s1", int(20000 * scale), LoadShape(), partitions=3, instances=1, fill_after_start=True
    )
    runs["scale_2"] = await fast.drain(
        "s2", int(20000 * scale), LoadShape(), partitions=3, instances=2, fill_after_start=True
    )

    _log("start to ready")
    await create_topics(Settings.load(kafka={"bootstrap_servers": broker.bootstrap_servers}))
    startups = []
    for i in range(3):
        p = SidecarProcess(
            {"GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers},
            workdir / f"start-{i}.log",
            cpus=cpus,
        )
        t0 = time.monotonic()
        await asyncio.to_thread(p.start)
        startups.append(time.monotonic() - t0)
        rss = p.rss_mb()
        await asyncio.to_thread(p.signal, 15)
    _log("stages in isolation")
    stages = _stages(claims_shape)
    _log("profiles: whole requests through the processor (fast path, claim path)")
    profiles = profile_paths()
    res = {k: asdict(v) for k, v in runs.items()}
    return {
        **floors_report(runs),
        **machine(),
        **placement.report(),
        "incomplete": {name: run.incomplete for name, run in runs.items()},
        "failure": incomplete_failure(runs),
        "throughput_answers_per_s": runs["fast_drain"].throughput_answers_per_s,
        "p99_ms_at_500": runs["fast_500"].latency_ms.get("p99"),
        "full_path_answers_per_s": runs["full_drain"].throughput_answers_per_s,
        "claim_p95_ms": runs["full_half"].claim_latency_ms.get("p95"),
        "full_half_answers_per_s": runs["full_half"].config["rate_answers_per_s"],
        "rss_mb": max(runs["fast_drain"].rss_mb, runs["full_drain"].rss_mb, rss or 0.0),
        "startup_s": round(min(startups), 2),
        "prometheus_vs_fast_drain": _drain_ratio(runs, "fast_prometheus_drain", "fast_drain"),
        "traced_vs_fast_drain": _drain_ratio(runs, "fast_traced_drain", "fast_drain"),
        "traced_stage_attributes_vs_fast_drain": _drain_ratio(
            runs, "fast_traced_attributes_drain", "fast_drain"
        ),
        "baseline_ratio": _drain_ratio(runs, "fast_drain", "baseline_drain"),
        "scale_out_ratio": _drain_ratio(runs, "scale_2", "scale_1"),
        "scale_out_incomplete": runs["scale_2"].incomplete,
        "serving_imports_torch": runtime.serving_imports_torch(),
        "cpu_count": os.cpu_count(),
        "quick": quick,
        "runs": res,
        "stages": stages,
        "profiles": profiles,
    }


def _stages(claims_shape: LoadShape) -> dict[str, Any]:
    """Each stage in isolation, the claim check's with the claim settings; the signals
    are closed after (an LLM judge's calls in flight cut off: its threads held the exit)."""
    from sidecar import runtime  # noqa: PLC0415

    settings = Settings.load()
    policy, signals = runtime.build_policy(settings), runtime.build_signals(settings)
    try:
        stages = run_stages(settings, policy, signals)
    finally:
        signals.close()
    claim_signals = runtime.build_signals(Settings.load(signals={"claims": True}))
    try:
        if claim_signals.claims is not None:
            stages["claims"] = run_claim_stages(claim_signals.claims, shape=claims_shape)
    finally:
        claim_signals.close()
    return stages


def _drain_ratio(runs: dict[str, RunResult], num: str, den: str) -> float:
    """One run's answers/s over another's, to 2 places."""
    return round(
        runs[num].throughput_answers_per_s / max(1e-9, runs[den].throughput_answers_per_s), 2
    )


def _floor(fast: Bench, kind: str) -> Bench:
    """The ``kind`` floor (``python -m sidecar.lab.bench.floors kind``) on the fast path's
    broker, environment and CPUs."""
    argv = ("-m", "sidecar.lab.bench.floors", kind)
    return Bench(fast.broker, fast.workdir, fast.extra_env, argv=argv, cpus=fast.cpus)


async def _floors(fast: Bench, n: int, n_open: int) -> dict[str, RunResult]:
    """The floors on the fast path's load: drains of ``n`` requests, then both open
    loops at half the no-op's drain rate (so the point means the same on any
    machine), ``n_open`` requests each (the same work on a fast or slow CPU)."""
    noop, raw = _floor(fast, "noop"), _floor(fast, "raw")
    runs: dict[str, RunResult] = {}
    _log("floor: no-op passthrough drain (the sidecar's loop, a constant verdict)")
    runs["noop_drain"] = await noop.drain("noop", n, LoadShape())
    _log("floor: raw aiokafka loop drain (consume, produce, commit)")
    runs["raw_drain"] = await raw.drain("raw", n, LoadShape())
    parse = _floor(fast, "parse")
    _log("floor: the no-op loop reading every record's JSON (orjson), deciding nothing")
    runs["parse_drain"] = await parse.drain("parse", n, LoadShape())
    sketch = _floor(fast, "dict")
    _log("floor: the no-op loop deciding on plain dicts (a sketch of a rewrite's fast path)")
    runs["dict_drain"] = await sketch.drain("dict", n, LoadShape())
    library = native_floor.library()
    if library.is_file():
        compiled = _floor(fast, "native")
        _log(f"floor: the same sketch compiled outside the interpreter ({library})")
        runs["native_drain"] = await compiled.drain("native", n, LoadShape())
    else:
        _log(f"floor: no native sketch at {library} (make native-floor): native_vs_noop left out")
    rate = half_capacity(runs["noop_drain"].throughput_answers_per_s)
    _log(f"fast path and no-op open loops at half the no-op's capacity ({rate} answers/s)")
    duration_s = n_open / rate
    runs["fast_half"] = await fast.open_loop("ohalf", rate, duration_s, LoadShape())
    runs["noop_half"] = await noop.open_loop("nhalf", rate, duration_s, LoadShape())
    return runs


async def _pairs(fast: Bench, n: int, n_open: int, *, pairs: int = PAIRS) -> dict[str, RunResult]:
    """``pairs`` drains of ``n`` requests each through the sidecar and through the no-op,
    alternated (no-op first in even pairs, the sidecar first in odd ones), after the
    runs above warmed the broker: ``fast_drain_vs_noop`` is the median of their ratios
    (``ratios.paired_report``). Then both open loops at half the sidecar's drain rate
    (the pairs' median), ``n_open`` requests each: the latency the sidecar adds to the
    loop's where it does not queue (``ratios.sidecar_half_report``)."""
    noop = _floor(fast, "noop")
    runs: dict[str, RunResult] = {}
    for i in range(pairs):
        order = (("noop", noop), ("fast", fast)) if i % 2 == 0 else (("fast", fast), ("noop", noop))
        for side, bench in order:
            _log(f"alternated drains, pair {i + 1} of {pairs}: {side}")
            runs[f"paired_{side}_{i}"] = await bench.drain(f"p{side}{i}", n, LoadShape())
    rates = [runs[f"paired_fast_{i}"].throughput_answers_per_s for i in range(pairs)]
    rate = half_capacity(statistics.median(rates))
    _log(f"fast path and no-op open loops at half the sidecar's capacity ({rate} answers/s)")
    runs["fast_sidecar_half"] = await fast.open_loop("oshalf", rate, n_open / rate, LoadShape())
    runs["noop_sidecar_half"] = await noop.open_loop("nshalf", rate, n_open / rate, LoadShape())
    return runs


_T = TypeVar("_T")


def on_local_broker(
    run: Callable[[LocalKafka, Path], Coroutine[Any, Any, _T]],
    prefix: str = "bench-",
    placement: Placement | None = None,
) -> _T:
    """``run(broker, workdir)`` on a fresh local broker in a temporary folder of the
    bench's home (1 GiB heap), stopped and removed afterwards. ``placement``: this process
    and the broker run on its ``rest`` CPUs meanwhile (the processes under test are
    started on its ``under_test`` ones by whoever starts them)."""
    with (placement or Placement()).applied():
        return _on_local_broker(run, prefix)


def _on_local_broker(run: Callable[[LocalKafka, Path], Coroutine[Any, Any, _T]], prefix: str) -> _T:
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=home) as tmp:
        workdir = Path(tmp)
        broker = LocalKafka(
            workdir / "broker",
            ensure_jars(lib_for(home)),
            port=free_port(),
            controller_port=free_port(),
            heap_mb=1024,
        )
        broker.start()
        try:
            return asyncio.run(run(broker, workdir))
        finally:
            broker.stop()


def run_bench(
    quick: bool = False, out: Path | None = None, placement: Placement | None = None
) -> dict[str, Any]:
    placement = placement or Placement()
    report = on_local_broker(
        lambda broker, workdir: _suite(broker, workdir, quick, placement), placement=placement
    )
    if out is not None:
        import orjson  # noqa: PLC0415

        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return report
