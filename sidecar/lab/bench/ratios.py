"""The bench's verdict on a run: the sidecar as ratios to the floors, the CPU, and incomplete.

Absolute answers/s say little across CPUs; a ratio to a floor measured in the
same run on the same broker and client stack (``sidecar/lab/bench/floors.py``)
says how close the sidecar is to what the machine allows. Pure functions of
the runs' results, tested without Kafka.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from sidecar.golden import CPUINFO, cpu_features

__all__ = [
    "PAIRS",
    "RATE_HELD",
    "cpu_model",
    "floors_report",
    "incomplete_failure",
    "machine",
    "paired_report",
    "print_report",
    "sidecar_half_report",
]

RATE_HELD = 0.9  # an open loop held its rate if it sent at least this share of it
# alternated drains of the sidecar and the no-op, ``paired_fast_{i}`` / ``paired_noop_{i}``:
# the first drains of a run differed by up to 1.7x between runs minutes apart
PAIRS = 3


class _Run(Protocol):
    @property
    def throughput_answers_per_s(self) -> float: ...

    @property
    def latency_ms(self) -> dict[str, float]: ...

    @property
    def incomplete(self) -> int: ...

    @property
    def requests(self) -> int: ...

    @property
    def verdicts(self) -> int: ...

    @property
    def offered_answers_per_s(self) -> float | None: ...

    @property
    def cpu_s(self) -> float: ...

    @property
    def processor_cpu_s(self) -> float | None: ...

    @property
    def config(self) -> dict[str, Any]: ...


def cpu_model(cpuinfo: Path = CPUINFO) -> str | None:
    """``/proc/cpuinfo``'s first ``model name`` (``None``: not readable, not x86)."""
    try:
        text = cpuinfo.read_text("utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return None


def machine(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """The CPU the numbers were taken on: model and the kernel-relevant flags."""
    flags = cpu_features(cpuinfo)
    return {
        "cpu_model": cpu_model(cpuinfo),
        "cpu_flags": list(flags) if flags is not None else None,
        "avx2": flags is not None and "avx2" in flags,
        "avx512": flags is not None and "avx512f" in flags,
        "vnni": flags is not None and ("avx512_vnni" in flags or "avx_vnni" in flags),
    }


def print_report(report: Mapping[str, Any], out: Path | None) -> None:
    """A bench script's JSON report: printed, and written to ``out`` when given."""
    text = json.dumps(report, indent=2)
    print(text)  # noqa: T201 - the script's output
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return round(num / den, 3)


def floors_report(runs: Mapping[str, _Run]) -> dict[str, Any]:
    """Ratios of the sidecar to its floors, and the absolute numbers they come from.

    ``runs`` names: ``fast_drain``, ``noop_drain``, ``raw_drain``, ``full_drain``,
    ``fast_half`` and ``noop_half`` (open loops at half the no-op's drain rate), and
    optionally ``parse_drain`` (the no-op reading every record's JSON), ``dict_drain``
    (the no-op loop deciding with :class:`~sidecar.lab.bench.dict_floor.DictFloor`) and
    ``native_drain`` (the same sketch compiled: :mod:`sidecar.lab.bench.native_floor`),
    and the alternated pairs of :func:`paired_report`, whose median, where there are
    any, is ``fast_drain_vs_noop`` (``fast_drain_vs_noop_single``: the first drains').
    """
    fast, noop, raw = runs["fast_drain"], runs["noop_drain"], runs["raw_drain"]
    parse_rate, dict_rate, native_rate = (
        None if (run := runs.get(name)) is None else run.throughput_answers_per_s
        for name in ("parse_drain", "dict_drain", "native_drain")
    )
    single = _ratio(fast.throughput_answers_per_s, noop.throughput_answers_per_s)
    paired = paired_report(runs)
    fast_p99 = runs["fast_half"].latency_ms.get("p99")
    noop_p99 = runs["noop_half"].latency_ms.get("p99")
    rate = half_capacity(noop.throughput_answers_per_s)
    offered = {
        "sidecar": runs["fast_half"].offered_answers_per_s,
        "noop": runs["noop_half"].offered_answers_per_s,
    }
    return {
        # the median of the alternated pairs' ratios where the run has pairs, else the
        # first drains' (the sidecar's on a broker just started, the no-op's minutes later)
        "fast_drain_vs_noop": single
        if paired["fast_drain_vs_noop_paired"] is None
        else paired["fast_drain_vs_noop_paired"],
        "fast_drain_vs_noop_single": single,
        **paired,
        **sidecar_half_report(runs),
        "p99_at_half_capacity_vs_noop": _ratio(fast_p99, noop_p99),
        "full_path_vs_fast_path": _ratio(
            runs["full_drain"].throughput_answers_per_s, fast.throughput_answers_per_s
        ),
        "noop_vs_raw_client": _ratio(noop.throughput_answers_per_s, raw.throughput_answers_per_s),
        # what any processor that builds Python objects from its inputs can reach at most
        "parse_vs_noop": _ratio(parse_rate, noop.throughput_answers_per_s),
        "fast_drain_vs_parse": _ratio(fast.throughput_answers_per_s, parse_rate),
        "parse_answers_per_s": parse_rate,
        # what a fast path rewritten on plain dicts could reach at most (a sketch of one)
        "dict_vs_noop": _ratio(dict_rate, noop.throughput_answers_per_s),
        "fast_drain_vs_dict": _ratio(fast.throughput_answers_per_s, dict_rate),
        "dict_answers_per_s": dict_rate,
        # the same sketch outside the interpreter: what deciding in native code could reach
        "native_vs_noop": _ratio(native_rate, noop.throughput_answers_per_s),
        "native_answers_per_s": native_rate,
        "noop_answers_per_s": noop.throughput_answers_per_s,
        "raw_client_answers_per_s": raw.throughput_answers_per_s,
        "half_capacity_answers_per_s": rate,
        # the load generator shares the cores: the point means "half capacity" only if
        # it held that rate for both (else both p99s include its own lag, not comparable)
        "half_capacity_offered_answers_per_s": offered,
        "half_capacity_rate_held": _rate_held(offered, rate),
        "p99_ms_at_half_capacity": fast_p99,
        "noop_p99_ms_at_half_capacity": noop_p99,
    }


def paired_report(runs: Mapping[str, _Run]) -> dict[str, Any]:
    """The sidecar against the no-op in alternated drains of the same load.

    Pair ``i`` is ``paired_fast_{i}`` and ``paired_noop_{i}`` (drained one after the
    other, the order alternating from pair to pair). Each pair's ratio compares two
    drains seconds apart, so the machine's drift (the no-op's rate moved from
    7,595 to 12,539 answers/s between two runs minutes apart) mostly cancels; the
    median of the pairs is the run's ``fast_drain_vs_noop``. CPU per request is each
    process's own (user + system) over the requests it drained, split into its
    processor thread's (``sidecar.osthreads``: the deciding) and the rest's (the loop:
    consuming, publishing, committing, telemetry). ``noop_vs_sidecar_loop_cpu``, the
    median over the pairs of the no-op's CPU a request over the sidecar's loop's alone,
    is the ``fast_drain_vs_noop`` a processor that cost nothing would leave where the
    sidecar's drain is bound by its CPU: what the loop itself allows.
    """
    ratios: list[float] = []
    cpu: dict[str, list[float]] = {"sidecar": [], "noop": []}
    processor: dict[str, list[float]] = {"sidecar": [], "noop": []}
    loop: dict[str, list[float]] = {"sidecar": [], "noop": []}
    rates: dict[str, list[float]] = {"sidecar": [], "noop": []}
    loop_ratios: list[float] = []
    i = 0
    while (f := runs.get(f"paired_fast_{i}")) is not None and (
        n := runs.get(f"paired_noop_{i}")
    ) is not None:
        i += 1
        for side, run in (("sidecar", f), ("noop", n)):
            rates[side].append(run.throughput_answers_per_s)
            per_request = 1e6 / max(1, run.requests)
            cpu[side].append(round(run.cpu_s * per_request, 1))
            if run.processor_cpu_s is not None:
                processor[side].append(round(run.processor_cpu_s * per_request, 1))
                loop[side].append(round((run.cpu_s - run.processor_cpu_s) * per_request, 1))
        ratio = _ratio(f.throughput_answers_per_s, n.throughput_answers_per_s)
        if ratio is not None:
            ratios.append(ratio)
        if f.processor_cpu_s is not None and (
            loop_ratio := _ratio(n.cpu_s, f.cpu_s - f.processor_cpu_s)
        ):
            loop_ratios.append(loop_ratio)
    return {
        "fast_drain_vs_noop_paired": round(statistics.median(ratios), 3) if ratios else None,
        "fast_drain_vs_noop_pairs": ratios,
        "paired_answers_per_s": rates,
        "paired_cpu_us_per_request": cpu,
        "paired_processor_cpu_us_per_request": processor,
        "paired_loop_cpu_us_per_request": loop,
        "noop_vs_sidecar_loop_cpu": round(statistics.median(loop_ratios), 3)
        if loop_ratios
        else None,
        "noop_vs_sidecar_loop_cpu_pairs": loop_ratios,
    }


def sidecar_half_report(runs: Mapping[str, _Run]) -> dict[str, Any]:
    """The sidecar's p99 against the no-op's where neither queues: both open loops
    (``fast_sidecar_half``, ``noop_sidecar_half``) at half the sidecar's drain rate.

    ``p99_at_half_capacity_vs_noop`` offers half the *no-op's* rate, which a sidecar
    draining under half the no-op's rate cannot serve: its p99 there is a queue's. This
    point is the latency the sidecar adds to its loop's at a rate it serves (``None``
    where the run has no such loops).
    """
    fast, noop = runs.get("fast_sidecar_half"), runs.get("noop_sidecar_half")
    if fast is None or noop is None:
        return {"p99_at_half_sidecar_capacity_vs_noop": None}
    fast_p99, noop_p99 = fast.latency_ms.get("p99"), noop.latency_ms.get("p99")
    offered = {"sidecar": fast.offered_answers_per_s, "noop": noop.offered_answers_per_s}
    rate = float(fast.config.get("rate_answers_per_s", 0.0))
    return {
        "p99_at_half_sidecar_capacity_vs_noop": _ratio(fast_p99, noop_p99),
        "p99_ms_at_half_sidecar_capacity": fast_p99,
        "noop_p99_ms_at_half_sidecar_capacity": noop_p99,
        "half_sidecar_capacity_answers_per_s": rate,
        "half_sidecar_capacity_offered_answers_per_s": offered,
        "half_sidecar_capacity_rate_held": _rate_held(offered, rate),
    }


def _rate_held(offered: Mapping[str, float | None], rate: float) -> bool:
    """Every open loop sent at least ``RATE_HELD`` of the ``rate`` asked (a positive one)."""
    return rate > 0 and all(o is not None and o >= RATE_HELD * rate for o in offered.values())


def half_capacity(noop_answers_per_s: float) -> float:
    """The open-loop rate that means the same on any machine: half the no-op's drain rate."""
    return round(max(1.0, noop_answers_per_s / 2.0), 1)


def incomplete_failure(runs: Mapping[str, _Run]) -> str | None:
    """Why the bench run fails (a request decided ``incomplete`` or never decided), or ``None``."""
    bad = {name: run.incomplete for name, run in runs.items() if run.incomplete}
    undecided = {
        name: run.requests - run.verdicts
        for name, run in runs.items()
        if run.verdicts < run.requests
    }
    why = []
    if bad:
        listed = ", ".join(f"{name}: {n}" for name, n in bad.items())
        why.append(
            f"{sum(bad.values())} incomplete verdicts ({listed}); every request must be decided "
            "(a join TTL expired on requests whose inputs were in Kafka: the loop fell behind)"
        )
    if undecided:
        listed = ", ".join(f"{name}: {n}" for name, n in undecided.items())
        why.append(
            f"{sum(undecided.values())} requests without a verdict when the run's wait ended "
            f"({listed}): the sidecar did not keep up with the run's time budget"
        )
    return "; ".join(why) or None
