"""Verdict wait overhead with several service replicas: N concurrent requests, R VerdictClients.

Each replica has its own ``GuardrailPublisher`` and ``VerdictClient`` and
sends its share of the requests (all at once); a running sidecar process
(``python -m sidecar run``) decides them. The verdict topic is created with
``message.timestamp.type=LogAppendTime``, so a verdict record's timestamp is
the broker's append time, and the wait overhead of one request is the time
from that append to the moment its awaiting caller woke up (same host, same
clock). Written as JSON; nothing here asserts a timing.

    python -m bench.verdict_client [--requests 1000] [--replicas 3] [--rate 0] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from guardrail_client import GuardrailPublisher, VerdictClient, VerdictResult
from sidecar.config import TOPIC_ROLES

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "verdict_client.json"
GENERATOR = "HuggingFaceTB/SmolLM2-135M-Instruct"
HITS = [
    {"chunk_id": "c1", "doc_id": "d1", "score": 0.71, "text": "Mary Shelley wrote Frankenstein."},
    {"chunk_id": "c2", "doc_id": "d2", "score": 0.33, "text": "Gothic fiction is a genre."},
]


def topic_names(suffix: str) -> dict[str, str]:
    return {name: f"vc.{suffix}.{name}" for name in TOPIC_ROLES}


def sidecar_env(bootstrap: str, topics: dict[str, str], group: str) -> dict[str, str]:
    """Environment of a ``python -m sidecar run`` on these topics (default signals)."""
    return {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "GUARDRAIL_KAFKA__GROUP_ID": group,
        **{f"GUARDRAIL_TOPICS__{name.upper()}": topic for name, topic in topics.items()},
    }


async def create_append_time_verdicts(bootstrap: str, topic: str, partitions: int) -> None:
    """The verdict topic, its record timestamps set by the broker at append."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    topic,
                    partitions,
                    1,
                    topic_configs={"message.timestamp.type": "LogAppendTime"},
                )
            ]
        )
    finally:
        await admin.close()


async def one_request(
    publisher: GuardrailPublisher,
    verdicts: VerdictClient,
    request_id: str,
    timeout_s: float,
    delay_s: float = 0.0,
) -> VerdictResult:
    await asyncio.sleep(delay_s)
    await publisher.retrieval(
        request_id, "who wrote frankenstein", HITS, tenant="acme", collection="wiki"
    )
    await publisher.delta(request_id, "Frankenstein was written ")
    await publisher.delta(request_id, "by Mary Shelley.")
    await publisher.final(request_id, "Frankenstein was written by Mary Shelley.")
    return await verdicts.verdict(request_id, timeout=timeout_s)


async def run_replicas(
    bootstrap: str,
    topics: dict[str, str],
    *,
    requests: int = 1000,
    replicas: int = 3,
    timeout_s: float = 120.0,
    rate: float = 0.0,
) -> tuple[list[list[VerdictResult]], list[VerdictClient]]:
    """Send ``requests`` requests, split over ``replicas`` publisher + VerdictClient pairs.

    ``rate`` > 0 paces the starts (requests per second over all replicas); 0 starts
    them all at once. Returns each replica's results (its own requests only) and its
    (stopped) client.
    """
    publishers = [
        GuardrailPublisher(
            bootstrap,
            generator_model=GENERATOR,
            retrieval_topic=topics["retrieval"],
            generation_topic=topics["generation"],
        )
        for _ in range(replicas)
    ]
    clients = [
        VerdictClient(bootstrap, verdicts_topic=topics["verdicts"], claims_topic=None)
        for _ in range(replicas)
    ]
    for p, c in zip(publishers, clients, strict=True):
        await p.start()
        await c.start()
    try:
        run = uuid.uuid4().hex[:8]
        per_replica = await asyncio.gather(
            *(
                asyncio.gather(
                    *(
                        one_request(
                            publishers[r],
                            clients[r],
                            f"r{r}-{run}-{i}",
                            timeout_s,
                            i / rate if rate > 0 else 0.0,
                        )
                        for i in range(r, requests, replicas)
                    )
                )
                for r in range(replicas)
            )
        )
        # every verdict is on the topic once the last waiter returns, but a slower
        # client may not have fetched the other replicas' last ones yet: let it catch up
        # (bounded: a request the sidecar never answered leaves the count short for good)
        deadline = time.monotonic() + 30.0
        while any(c.records_read < requests for c in clients) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    finally:
        for p, c in zip(publishers, clients, strict=True):
            await c.stop()
            await p.stop()
    return [list(results) for results in per_replica], clients


def summarise(
    per_replica: list[list[VerdictResult]], clients: list[VerdictClient], wall_s: float
) -> dict[str, Any]:
    results = [r for rs in per_replica for r in rs]
    decided = [r for r in results if r.from_sidecar]
    overhead = np.array(
        [r.woke_at_ms - r.timestamp_ms for r in decided if r.woke_at_ms and r.timestamp_ms]
    )
    waited = np.array([r.waited_s * 1000.0 for r in decided])

    def pct(a: Any, q: float) -> float | None:
        return round(float(np.percentile(a, q)), 2) if len(a) else None

    return {
        "requests": len(results),
        "replicas": len(per_replica),
        "from_sidecar": len(decided),
        "fallbacks": len(results) - len(decided),
        "wall_s": round(wall_s, 2),
        "wake_overhead_ms": {q: pct(overhead, p) for q, p in (("p50", 50), ("p99", 99))}
        | {"max": pct(overhead, 100)},
        "verdict_wait_ms": {q: pct(waited, p) for q, p in (("p50", 50), ("p99", 99))},
        "records_read_per_replica": [c.records_read for c in clients],
        "decoded_per_replica": [c.waiters.decoded for c in clients],
        "skipped_undecoded_per_replica": [c.waiters.skipped for c in clients],
        "note": "wake overhead: verdict record's LogAppendTime to the awaiting caller's "
        "wake-up (ms; 1 ms timestamp resolution); every replica reads every verdict",
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    from sidecar.kafka.topics import create_topics  # noqa: PLC0415
    from sidecar.lab.chaos.process import SidecarProcess  # noqa: PLC0415 - lab code, bench only
    from sidecar.lab.localkafka.broker import LocalKafka, ensure_jars, free_port  # noqa: PLC0415
    from tests.kafka.harness import settings_for  # noqa: PLC0415

    home = Path(tempfile.mkdtemp(prefix="vc-bench-"))
    broker = LocalKafka(
        home / "kafka",
        ensure_jars(REPO / ".kafka" / "lib"),
        port=free_port(),
        controller_port=free_port(),
    )
    broker.start()
    proc: SidecarProcess | None = None
    try:
        topics = topic_names(uuid.uuid4().hex[:8])
        settings = settings_for({**topics, "group": "vc-bench"}, broker.bootstrap_servers)
        await create_append_time_verdicts(
            broker.bootstrap_servers, topics["verdicts"], settings.topics.partitions
        )
        await create_topics(settings)
        proc = SidecarProcess(
            sidecar_env(broker.bootstrap_servers, topics, "vc-bench"), home / "sidecar.log"
        )
        proc.start()
        started = time.monotonic()
        per_replica, clients = await run_replicas(
            broker.bootstrap_servers,
            topics,
            requests=args.requests,
            replicas=args.replicas,
            rate=args.rate,
        )
        summary = summarise(per_replica, clients, time.monotonic() - started)
    finally:
        if proc is not None and proc.pid is not None:
            proc.signal(15)
        broker.stop()
        shutil.rmtree(home, ignore_errors=True)
    return summary | {
        "rate_per_s": args.rate or "all at once",
        "cpu_count": os.cpu_count(),
        "load_average_1m_after": os.getloadavg()[0],
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: all at once")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    summary = asyncio.run(_main(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
