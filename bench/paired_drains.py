"""Fast-path drains of two configurations, alternated on one broker: the ratio of a change.

Drains of the bench's fast-path load (``guardrail bench``'s ``LoadShape()``) through
side A and side B, A then B in even pairs and B then A in odd ones, each a fresh
process on fresh topics of one local broker. A side is the sidecar (or ``--*-argv``:
another process that serves ``/readyz``, such as the no-op floor) with extra
environment (``--*-env NAME=VALUE``, repeatable). Sequential drains on a shared
2-core machine differ by more than most changes; alternated pairs and their per-pair
ratio (B / A) say more. Writes each drain's rate, CPU per request and ``incomplete``::

    # the processor on the event loop instead of its worker thread
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 6 \\
        --b-env GUARDRAIL_KAFKA__PROCESSING_THREAD=false
    # the sidecar against the no-op floor
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 3 \\
        --b-argv "-m sidecar.lab.bench.floors noop"
    # two trees (a worktree of the commit before as A)
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 4 --a-env PYTHONPATH=../old
    # what a producer with another partitioner costs: every generation record off its
    # partition (one process joins it where it is; two reroute what the other one reads)
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 4 --b-off-partition
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 2 --instances 2 \\
        --requests 50000 --b-off-partition
    # answers streamed in 20 pieces (20 generation.delta records each, as a service that
    # publishes every few tokens writes them) instead of the bench's one
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 4 --requests 4000 \\
        --deltas 20 --b-argv "-m sidecar.lab.bench.floors noop"

``--rate R``: open loops instead of drains, ``--requests`` requests offered at R answers/s
(after the bench's warm-up), and the per-pair ratios of their latency (B / A, p50 and
p99) instead of rates::

    # the processor on the event loop, at about half the sidecar's drain rate
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 6 --requests 2500 \\
        --rate 1100 --b-env GUARDRAIL_KAFKA__PROCESSING_THREAD=false

``--placement split``: both sides' processes on the first half of the CPUs, the broker and
this load generator on the rest (``sidecar/lab/bench/placement.py``)::

    # the sidecar against the no-op at 1,300 answers/s, each on a core of its own
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 4 --requests 4000 \\
        --rate 1300 --a-argv "-m sidecar.lab.bench.floors noop" --placement split

Every drain also says how much of its process's CPU a request went to the processor
(``processor_cpu_us_per_request``: its thread's, which the service names
``gr-processor`` for the system, ``sidecar/osthreads.py``, read from ``/proc``) and how
much to the rest, the loop (``rest_cpu_us_per_request``)::

    # where the sidecar's CPU goes against the no-op's, each on a core of its own
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 3 --requests 40000 \\
        --a-argv "-m sidecar.lab.bench.floors noop" --placement split
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from sidecar.exceptions import ConfigError
from sidecar.lab.bench.e2e import Bench, LoadShape
from sidecar.lab.bench.placement import PLACEMENTS, Placement
from sidecar.lab.bench.ratios import machine
from sidecar.lab.bench.suite import on_local_broker
from sidecar.lab.localkafka.broker import LocalKafka

SIDECAR = "-m sidecar run"


def _env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--a-env / --b-env take NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


Side = tuple[dict[str, str], tuple[str, ...]]  # extra environment, argv


async def alternate(
    broker: LocalKafka,
    workdir: Path,
    sides: tuple[Side, Side],
    pairs: int,
    requests: int,
    *,
    after: Callable[[int], dict[str, Any]] | None = None,
    off_partition: tuple[bool, bool] = (False, False),
    instances: int = 1,
    shape: LoadShape | None = None,
    rate: float | None = None,
    cpus: frozenset[int] | None = None,
) -> tuple[list[list[dict[str, Any]]], list[float]]:
    """Drains of side 0 and side 1 alternated ``pairs`` times: each side's runs (``after``:
    more of a side's run, read once it is drained) and the per-pair rate ratios 1 / 0.
    ``off_partition``: per side, the load's generation records off their murmur2
    partition (``Bench``); ``instances``: processes per drain, in one group; ``shape``:
    each answer's events (the bench's ``LoadShape()`` when not given); ``rate``: open
    loops of ``requests`` at that rate instead of drains (one process), the ratios then
    of their p50 latency; ``cpus``: where both sides' processes run (``Placement``)."""
    shape = LoadShape() if shape is None else shape
    runs: list[list[dict[str, Any]]] = [[], []]
    for p in range(pairs):
        for side in (0, 1) if p % 2 == 0 else (1, 0):
            env, argv = sides[side]
            bench = Bench(
                broker, workdir, env, argv=argv, off_partition=off_partition[side], cpus=cpus
            )
            if rate is None:
                result = await bench.drain(f"s{side}p{p}", requests, shape, instances=instances)
            else:
                result = await bench.open_loop(f"s{side}p{p}", rate, requests / rate, shape)
            run = {
                "answers_per_s": result.throughput_answers_per_s,
                "cpu_us_per_request": round(result.cpu_s * 1e6 / requests, 1),
                **(
                    {}
                    if result.processor_cpu_s is None
                    else {
                        "processor_cpu_us_per_request": round(
                            result.processor_cpu_s * 1e6 / requests, 1
                        )
                    }
                ),
                "incomplete": result.incomplete,
                **(
                    {}
                    if rate is None
                    else {
                        "latency_ms": result.latency_ms,
                        "offered_answers_per_s": result.offered_answers_per_s,
                    }
                ),
                **(after(side) if after is not None else {}),
            }
            runs[side].append(run)
            print(side, run, flush=True)
    if rate is not None:
        return runs, _latency_ratios(runs, "p50")
    ratios = [
        b["answers_per_s"] / a["answers_per_s"]
        for a, b in zip(runs[0], runs[1], strict=True)
        if a["answers_per_s"] > 0
    ]
    return runs, ratios


def _latency_ratios(runs: list[list[dict[str, Any]]], key: str) -> list[float]:
    """Per pair, side 1's ``key`` latency over side 0's (open loops)."""
    return [
        b["latency_ms"][key] / a["latency_ms"][key]
        for a, b in zip(runs[0], runs[1], strict=True)
        if a["latency_ms"].get(key) and key in b["latency_ms"]
    ]


async def _pairs(
    broker: LocalKafka, workdir: Path, args: argparse.Namespace, placement: Placement
) -> dict[str, Any]:
    a = (_env(args.a_env), tuple(shlex.split(args.a_argv)))
    b = (_env(args.b_env), tuple(shlex.split(args.b_argv)))
    off = (False, args.b_off_partition)
    runs, ratios = await alternate(
        broker,
        workdir,
        (a, b),
        args.pairs,
        args.requests,
        off_partition=off,
        instances=args.instances,
        shape=streamed(args.deltas),
        rate=args.rate,
        cpus=placement.under_test,
    )
    with_rest(runs)
    p99: dict[str, Any] = {}
    if args.rate is not None:
        q = _latency_ratios(runs, "p99")
        p99 = {
            "offered_answers_per_s": args.rate,
            "b_vs_a_p99": [round(r, 3) for r in q],
            "b_vs_a_p99_median": round(statistics.median(q), 3) if q else None,
        }
    return {
        "what": "fast-path drains, side B against side A, alternated"
        if args.rate is None
        else "fast-path open loops, side B against side A, alternated: B / A of p50 latency",
        "a": {"env": a[0], "argv": list(a[1]), "runs": runs[0]},
        "b": {
            "env": b[0],
            "argv": list(b[1]),
            **({"generation_off_partition": True} if off[1] else {}),
            "runs": runs[1],
        },
        "requests": args.requests,
        "deltas_per_answer": args.deltas,
        "instances": args.instances,
        "b_vs_a": [round(r, 3) for r in ratios],
        "b_vs_a_median": round(statistics.median(ratios), 3) if ratios else None,
        **p99,
        **machine(),
        **placement.report(),
    }


def with_rest(runs: list[list[dict[str, Any]]]) -> None:
    """Each run that has its processor's CPU gets the rest of its CPU a request too."""
    for run in (run for side in runs for run in side):
        if "processor_cpu_us_per_request" in run:
            rest = run["cpu_us_per_request"] - run["processor_cpu_us_per_request"]
            run["rest_cpu_us_per_request"] = round(rest, 1)


def streamed(deltas: int) -> LoadShape:
    """The bench's answer in ``deltas`` generation.delta records (one sentence each): its
    one short sentence when ``deltas`` is 1."""
    if deltas < 1:
        raise SystemExit(f"--deltas takes a positive number of records, got {deltas}")
    return LoadShape() if deltas == 1 else LoadShape(deltas=deltas, claims=deltas)


def show(report: dict[str, Any], out: Path | None) -> None:
    """Print the report, and write it to ``out`` if given."""
    text = orjson.dumps(report, option=orjson.OPT_INDENT_2)
    print(text.decode())
    if out is not None:
        out.write_bytes(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--a-argv", default=SIDECAR, help=f"default {SIDECAR!r}")
    parser.add_argument("--b-argv", default=SIDECAR, help=f"default {SIDECAR!r}")
    parser.add_argument(
        "--b-off-partition",
        action="store_true",
        help="side B's generation records go to the partition after their request's murmur2 "
        "one (a producer with another partitioner): the sidecar reroutes every one",
    )
    parser.add_argument("--instances", type=int, default=1, help="processes per drain")
    parser.add_argument(
        "--deltas",
        type=int,
        default=1,
        help="generation.delta records per answer, a sentence each (default 1: the bench's load)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loops at this many answers/s instead of drains (the ratios: p50 and p99)",
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="shared",
        help="split: both sides' processes on the first half of the CPUs, the broker and the "
        "load generator on the rest (default shared: all on every CPU)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    try:
        placement = Placement.of(args.placement)
    except ConfigError as exc:  # one CPU: said as the script's other refusals are
        raise SystemExit(f"--placement: {exc}") from None
    report = on_local_broker(
        lambda broker, workdir: _pairs(broker, workdir, args, placement), "pairs-", placement
    )
    show(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
