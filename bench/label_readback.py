"""What reading a partition's labels back costs an assignment (the coverage windows).

On a lab broker: ``--labels`` feedback records over 3 partitions (keyed by request id,
as the client sends them), read back by ``sidecar.kafka.warmstart.read_labels`` as an
assignment does, for one partition and for all three (the first assignment after a
restart), ``--rounds`` times each; seconds per read, best and median::

    .venv/bin/python bench/label_readback.py --labels 20000 --out bench/results/label_readback.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from sidecar.config import Settings
from sidecar.kafka.topics import create_topics
from sidecar.kafka.warmstart import read_labels
from sidecar.lab.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port
from sidecar.lab.replay import Record, send
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy

PARTITIONS = 3


async def measure(bootstrap: str, labels: int, rounds: int) -> dict[str, object]:
    names = {k: f"lb.{k}" for k in ("retrieval", "generation", "feedback", "verdicts")}
    settings = Settings.load(
        kafka={"bootstrap_servers": bootstrap, "group_id": "lb"},
        topics={**names, "partitions": PARTITIONS},
        http={"enabled": False},
    )
    await create_topics(settings)
    records = [
        Record(
            settings.topics.feedback,
            f"q-{i}".encode(),
            orjson.dumps(
                {
                    "schema_version": 1,
                    "event_type": "feedback",
                    "request_id": f"q-{i}",
                    "correct": i % 3 != 0,
                    "source": "reviewer",
                }
            ),
        )
        for i in range(labels)
    ]
    await send(settings, records)
    processor = Processor(settings, PlaceholderPolicy())
    out: dict[str, object] = {}
    for name, partitions in (("one_partition", {1}), ("all_partitions", {0, 1, 2})):
        seconds, found = [], 0
        for _ in range(rounds):
            start = time.perf_counter()
            read = await read_labels(settings, processor, frozenset(partitions), PARTITIONS)
            seconds.append(time.perf_counter() - start)
            found = len(read or [])
        out[name] = {
            "labels_read": found,
            "best_s": round(min(seconds), 3),
            "median_s": round(statistics.median(seconds), 3),
            "seconds": [round(s, 3) for s in seconds],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lib = default_home()
    lib.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="label-readback-", dir=lib))
    broker = LocalKafka(
        home / "broker", ensure_jars(lib / "lib"), port=free_port(), controller_port=free_port()
    )
    broker.start()
    try:
        result = asyncio.run(measure(broker.bootstrap_servers, args.labels, args.rounds))
    finally:
        broker.stop()
        shutil.rmtree(home, ignore_errors=True)
    result = {
        "what": "seconds to read a partition's labels back on assignment "
        "(sidecar.kafka.warmstart.read_labels), lab broker, GUARDRAIL_SIGNALS__WARM_START "
        "records at most (20000 by default)",
        "labels_in_topic": args.labels,
        "partitions": PARTITIONS,
        **result,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
