"""Intake alone: ``Intake.admit`` over whole requests, as the processor admits them.

Each request is a retrieval, ``--deltas`` generation deltas and a final event (the
bench's load, 200-character chunks, a 30 x 9 x 3 attention summary); a request that
completes is closed, as the processor closes it before deciding. Prints microseconds
of this thread's CPU time per request: the best and the median of ``--passes`` passes
(fresh requests each), with the garbage collector as the service sets it. Paired runs
of two trees, alternating, give the ratio of a change (the machine's noise is large).

``--partitions N`` also times the same requests with their topics' partition count known
(N, each record on its request's murmur2 partition, as a murmur2 producer puts it), so
that intake checks where each request belongs (``join.reroute``: one murmur2 a request),
pass by pass alternating with the count unknown; prints both and the median of the
paired ratios.

    PYTHONPATH=. .venv/bin/python bench/intake_admit.py --passes 25 --requests 150
    PYTHONPATH=. .venv/bin/python bench/intake_admit.py --passes 40 --partitions 3
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import uuid

from guardrail_client.keys import partition_for
from sidecar import runtime
from sidecar.config import Settings
from sidecar.lab.bench.e2e import LoadShape, answer_events
from sidecar.lab.bench.stages import Item, as_served, request_items
from sidecar.pipeline.intake import Held, Intake


def _admit_all(intake: Intake, items: list[Item]) -> None:
    admit, store = intake.admit, intake.store
    for kind, raw, key, ref in items:
        admission = admit(kind, raw, key, ref, 0.0)
        if type(admission) is not Held:
            raise SystemExit(f"the load's record was not held: {admission}")
        if admission.entry.complete:
            store.close(admission.entry.store_key, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=25)
    parser.add_argument("--requests", type=int, default=150, help="requests per pass")
    parser.add_argument("--deltas", type=int, default=2, help="deltas per request")
    parser.add_argument(
        "--partitions", type=int, default=0, help="also time with this partition count known"
    )
    args = parser.parse_args()
    intake = runtime.build_processor(Settings.load(signals={"claims": False})).intake
    shape = LoadShape(payload_chars=200, claims=args.deltas, deltas=args.deltas)
    counts = (0, args.partitions) if args.partitions > 0 else (0,)
    work: list[list[list[Item]]] = []  # per pass, per partition count
    for p in range(args.passes + 1):  # the first pass warms up
        work.append([])
        for n, count in enumerate(counts):
            items: list[Item] = []
            for i in range(args.requests):
                # a UUID's 36 characters when timing the hash, as request ids often are
                serial = (p * len(counts) + n) * args.requests + i
                rid = str(uuid.UUID(int=serial)) if args.partitions > 0 else f"p{p}-{i}"
                request = request_items(answer_events(rid, shape), rid, p * args.requests + i)
                if count:
                    home = partition_for(rid, count)
                    request = [
                        (kind, raw, key, dataclasses.replace(ref, partition=home, partitions=count))
                        for kind, raw, key, ref in request
                    ]
                items.extend(request)
            work[-1].append(items)
    for items in work[0]:
        _admit_all(intake, items)
    spent: list[list[float]] = [[] for _ in counts]
    with as_served(Settings.load()):
        for by_count in work[1:]:
            for n, items in enumerate(by_count):
                start = time.thread_time_ns()
                _admit_all(intake, items)
                spent[n].append((time.thread_time_ns() - start) / args.requests / 1e3)
    if len(counts) == 1:
        print(f"{min(spent[0]):.2f} {statistics.median(spent[0]):.2f}")
        return
    ratio = statistics.median(b / a for a, b in zip(*spent, strict=True))
    print(
        f"count unknown: {min(spent[0]):.2f} {statistics.median(spent[0]):.2f}; "
        f"{args.partitions} partitions: {min(spent[1]):.2f} {statistics.median(spent[1]):.2f} "
        f"us/request (best, median); paired ratio {ratio:.3f}"
    )


if __name__ == "__main__":
    main()
