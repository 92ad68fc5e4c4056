"""The processor in a process of its own: does the second core lift the fast drain?

The sidecar runs ``Processor.on_batch`` on a worker thread of its one process, so
the event loop (fetch, track, publish, commit) and the processor share one GIL and
a drain costs their sum. This asks what a child process for the processor (its own
GIL, the machine's other core) would buy, without changing the sidecar: ``serve``
runs the sidecar with ``SidecarService._work_on`` patched to send each batch's
items to a one-process pool (spawned; it builds the served processor from the same
settings) and to publish the returned steps in their order, with up to
``--in-flight`` batches at the child at once (1: the loop waits for each, as the
thread does; 2: the next batch is worked on while the last one is published). Only
``on_batch`` moves: ticks, revocations and metrics stay with the parent's processor,
so this measures a drain and is not a way to serve.

The driver alternates drains of the sidecar as it is (``thread``) and ``serve``
(``split``) on one local broker and writes each drain's rate, the parent's CPU per
request and, for ``split``, the child's CPU in ``on_batch`` per request (the child
appends its running totals to a file) and the share of the drain it was busy::

    PYTHONPATH=. .venv/bin/python bench/process_split.py --pairs 4 --requests 20000 \\
        --out bench/results/process_split.json

``--child dict --against noop``: the child runs the dict floor's sketch
(:mod:`sidecar.lab.bench.dict_floor`) instead of the served processor, and side A is the
no-op floor: what a fast path rewritten on plain dicts *and* moved off the loop's GIL
could reach, against the bar's own denominator::

    PYTHONPATH=. .venv/bin/python bench/process_split.py --pairs 4 --child dict \\
        --against noop --out bench/results/process_split_dict.json
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from bench.paired_drains import alternate, show
from sidecar.config import Settings
from sidecar.lab.bench.ratios import machine
from sidecar.lab.bench.suite import on_local_broker
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.outputs import Step
from sidecar.pipeline.processor import BatchItem, Processor

_IN_FLIGHT_ENV = "BENCH_SPLIT_IN_FLIGHT"
_STATS_ENV = "BENCH_SPLIT_STATS"
_CHILD_ENV = "BENCH_SPLIT_CHILD"


class _Child:
    """The child's processor and its running totals (calls, items, wall and CPU seconds
    in ``on_batch``, the first call's start), appended to ``BENCH_SPLIT_STATS`` each call."""

    processor: Processor | None = None
    calls = items = 0
    wall_s = cpu_s = 0.0
    first: float | None = None


def _child_start(settings: Settings) -> None:
    from sidecar.runtime import build_processor  # noqa: PLC0415

    processor = build_processor(settings)
    if os.environ.get(_CHILD_ENV) == "dict":  # the dict floor's sketch instead (#22)
        from sidecar.lab.bench.dict_floor import DictFloor  # noqa: PLC0415
        from sidecar.lab.bench.floors import DictVerdictProcessor  # noqa: PLC0415

        processor = DictVerdictProcessor(settings, DictFloor(processor))
    _Child.processor = processor


def _child_ready() -> bool:
    return _Child.processor is not None


def _child_on_batch(items: list[BatchItem], now_ms: float) -> Step:
    processor = _Child.processor
    if processor is None:
        raise RuntimeError("the child's processor was not built")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    step = processor.on_batch(items, now_ms)
    wall1, cpu1 = time.perf_counter(), time.process_time()
    child = _Child
    child.calls += 1
    child.items += len(items)
    child.wall_s += wall1 - wall0
    child.cpu_s += cpu1 - cpu0
    child.first = wall0 if child.first is None else child.first
    if (path := os.environ.get(_STATS_ENV)) is not None:
        totals = {"calls": child.calls, "items": child.items, "wall_s": child.wall_s}
        totals |= {"cpu_s": child.cpu_s, "since_first_s": wall1 - child.first}
        with Path(path).open("ab") as out:
            out.write(orjson.dumps(totals) + b"\n")
    return step


def serve() -> int:
    """The sidecar, its ``on_batch`` calls in a child process (see the module's text)."""
    from sidecar.cli.main import main  # noqa: PLC0415
    from sidecar.kafka import app  # noqa: PLC0415

    in_flight = int(os.environ.get(_IN_FLIGHT_ENV, "2"))
    pools: dict[int, ProcessPoolExecutor] = {}
    sent: deque[asyncio.Future[None]] = deque()

    def pool(service: app.SidecarService) -> ProcessPoolExecutor:
        if id(service) not in pools:
            spawn = multiprocessing.get_context("spawn")
            made = ProcessPoolExecutor(
                1, mp_context=spawn, initializer=_child_start, initargs=(service.settings,)
            )
            # started on the first batch (the loop waits: a drain is timed from its first
            # verdict), built before that batch is sent
            made.submit(_child_ready).result()
            pools[id(service)] = made
        return pools[id(service)]

    async def split(service: app.SidecarService, records: tuple[Any, ...]) -> None:
        async with service._handler_lock:  # the items as the sidecar builds them
            if service._stopping.is_set():
                return
            items = service._items(records)
            now_ms = service.intake.clock.read(app._monotonic_ms())
        if not items:
            return  # no record of ours in the batch
        while len(sent) >= in_flight:
            await sent.popleft()
        loop = asyncio.get_running_loop()
        result = loop.run_in_executor(pool(service), _child_on_batch, items, now_ms)
        before = sent[-1] if sent else None

        async def publish() -> None:
            if before is not None:
                await asyncio.shield(before)  # steps go out in the batches' order
            await service.publisher.submit(await result)

        sent.append(asyncio.ensure_future(publish()))

    app.SidecarService._work_on = split  # type: ignore[method-assign,assignment]
    return main(["run"])


async def _pairs(broker: LocalKafka, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    stats = workdir / "child.jsonl"
    env = {_IN_FLIGHT_ENV: str(args.in_flight), _STATS_ENV: str(stats), _CHILD_ENV: args.child}
    thread = (env, ("-m", "sidecar", "run"))
    if args.against == "noop":
        thread = (env, ("-m", "sidecar.lab.bench.floors", "noop"))
    split = (env, (__file__, "serve"))

    def child(side: int) -> dict[str, Any]:
        """The child's totals at the end of a split drain (read, then removed)."""
        if side == 0 or not stats.exists():
            return {}
        last = orjson.loads(stats.read_bytes().splitlines()[-1])
        stats.unlink()
        requests = last["items"] / 3  # a retrieval, a delta and a final each
        return {
            "child_cpu_us_per_request": round(last["cpu_s"] * 1e6 / requests, 1),
            "child_busy_share": round(last["wall_s"] / last["since_first_s"], 3),
            "items_per_batch": round(last["items"] / last["calls"], 1),
        }

    runs, ratios = await alternate(
        broker, workdir, (thread, split), args.pairs, args.requests, after=child
    )
    return {
        "what": (
            "fast drain, the processor on a thread (the sidecar)"
            if args.against == "thread"
            else "fast drain, the no-op floor"
        )
        + f" vs the sidecar's loop with on_batch in a child process (child: {args.child}); "
        "cpu_us_per_request: the sidecar's process (split: the parent only)",
        "child": args.child,
        "against": args.against,
        "requests": args.requests,
        "in_flight": args.in_flight,
        "runs": {args.against: runs[0], "split": runs[1]},
        f"split_vs_{args.against}_median": round(statistics.median(ratios), 3) if ratios else None,
        f"split_vs_{args.against}": [round(r, 3) for r in ratios],
        **machine(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=["drive", "serve"], default="drive")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--in-flight", type=int, default=2, choices=[1, 2, 3, 4])
    parser.add_argument(
        "--child",
        choices=["served", "dict"],
        default="served",
        help="the child's processor: the served one, or the dict floor's sketch",
    )
    parser.add_argument(
        "--against",
        choices=["thread", "noop"],
        default="thread",
        help="side A: the sidecar as it is, or the no-op floor",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        return serve()
    report = on_local_broker(lambda broker, workdir: _pairs(broker, workdir, args), "split-")
    show(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
