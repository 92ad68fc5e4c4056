"""A claim-path backlog, batches in parts or whole: how long verdicts wait, and a stop.

With claims on, a sidecar that starts on a backlog takes polls of up to 500 records
(~100 answers of the bench's claim shape, seconds to minutes of verification). Whole
(``GUARDRAIL_KAFKA__PART_BUDGET_MS=0``), a batch's verdicts are published together at
its end and a stop waits for it; in parts (the default, 100 ms), each part's verdicts go
out before the next part and a stop waits for the part in hand.

Each run: ``--requests`` requests of the claim shape (5 claims in 5 deltas, K = 5, the
shipped verifier) filled before a ``sidecar run`` process starts. ``drain``: until every
answer has its verdict; the rate, and how long each answer and claim verdict waited
between its decision (``produced_at``) and the moment this reader had it (``waited_ms``),
and the time from start to the first verdict. ``stop``: SIGTERM ``--stop-after`` seconds
after the first verdict; how long the process took to exit and how many answers it had
decided. Sides alternated (whole, parts; parts, whole; ...) on one local broker::

    PYTHONPATH=. .venv/bin/python bench/batch_parts.py --pairs 2 --requests 100 \\
        --out bench/results/batch_parts.json
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from sidecar.kafka.topics import create_topics
from sidecar.lab.bench.e2e import Bench, LoadShape, _encoded_load, percentiles
from sidecar.lab.bench.ratios import machine
from sidecar.lab.bench.suite import on_local_broker
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka

SHAPE = LoadShape(k=5, deltas=5, claims=5, attention=None)  # guardrail bench's claim path
SIDES = {"whole": "0", "parts": "100"}


async def _run(
    broker: LocalKafka, workdir: Path, name: str, budget_ms: str, args: argparse.Namespace
) -> dict[str, Any]:
    bench = Bench(
        broker,
        workdir,
        {"GUARDRAIL_SIGNALS__CLAIMS": "true", "GUARDRAIL_KAFKA__PART_BUDGET_MS": budget_ms},
    )
    settings, env = bench._setup(args.partitions)
    await create_topics(settings)
    t = settings.topics
    records = [
        record
        for _, key, retrieval, deltas, final in _encoded_load(name, args.requests, SHAPE)
        for record in (
            (t.retrieval, retrieval, key),
            *((t.generation, delta, key) for _, delta in deltas),
            (t.generation, final, key),
        )
    ]
    await bench._fill(settings, records)
    consumer = AIOKafkaConsumer(
        t.verdicts,
        t.claims,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    sidecar = SidecarProcess(env, workdir / f"{name}.log")
    started = time.time()
    await asyncio.to_thread(sidecar.start)
    answers: list[float] = []  # waited, ms
    claims: list[float] = []
    first: float | None = None
    decided: set[str] = set()
    incomplete = 0
    stop_s: float | None = None
    exit_code: int | None = None
    try:
        deadline = time.monotonic() + args.timeout_s
        # a stop run stops even when every answer came in the first batch (whole)
        while (args.mode == "stop" or len(decided) < args.requests) and (
            time.monotonic() < deadline
        ):
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for tp, rs in batch.items():
                for r in rs:
                    obj = orjson.loads(r.value)
                    waited = (now - datetime.fromisoformat(obj["produced_at"]).timestamp()) * 1e3
                    if tp.topic == t.claims:
                        claims.append(waited)
                        continue
                    answers.append(waited)
                    decided.add(obj["request_id"])
                    incomplete += any(r["code"] == "incomplete" for r in obj["reasons"])
                    first = now if first is None else first
            if args.mode == "stop" and first is not None and now - first >= args.stop_after:
                t0 = time.monotonic()
                exit_code = await asyncio.to_thread(sidecar.signal, signal.SIGTERM, 120.0)
                stop_s = time.monotonic() - t0
                break
        last = time.time()
    finally:
        await consumer.stop()
        if exit_code is None:
            await asyncio.to_thread(sidecar.signal, signal.SIGTERM, 120.0)
    out: dict[str, Any] = {
        "budget_ms": int(budget_ms),
        "answers_decided": len(decided),
        "incomplete": incomplete,
        "first_verdict_s": None if first is None else round(first - started, 2),
        "answer_waited_ms": percentiles(answers),
        "claim_waited_ms": percentiles(claims),
    }
    if args.mode == "drain":
        out["answers_per_s"] = round(len(decided) / (last - started), 2)
    else:
        out |= {"stop_s": None if stop_s is None else round(stop_s, 2), "exit_code": exit_code}
    return out


async def _pairs(broker: LocalKafka, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for p in range(args.pairs):
        order = list(SIDES) if p % 2 == 0 else list(reversed(SIDES))
        for side in order:
            run = await _run(broker, workdir, f"{side}{p}", SIDES[side], args)
            runs[side].append(run)
            print(side, orjson.dumps(run).decode(), flush=True)

    def median(side: str, *path: str) -> float | None:
        values = []
        for run in runs[side]:
            value: Any = run
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            if isinstance(value, int | float):
                values.append(value)
        return round(statistics.median(values), 2) if values else None

    keys = [("answer_waited_ms", "p95"), ("claim_waited_ms", "p95"), ("first_verdict_s",)]
    keys += [("answers_per_s",)] if args.mode == "drain" else [("stop_s",), ("answers_decided",)]
    return {
        "what": f"claim-path backlog ({args.mode}), batches whole vs in parts, alternated",
        "requests": args.requests,
        "partitions": args.partitions,
        "shape": "K=5, 5 deltas, 5 claims, the shipped verifier",
        **({"stop_after_s": args.stop_after} if args.mode == "stop" else {}),
        "runs": runs,
        "medians": {side: {".".join(k): median(side, *k) for k in keys} for side in SIDES},
        **machine(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--mode", choices=("drain", "stop"), default="drain")
    parser.add_argument("--stop-after", type=float, default=2.0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = on_local_broker(lambda broker, workdir: _pairs(broker, workdir, args))
    text = orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
