"""Intake alone: ``Intake.admit`` over whole requests, as the processor admits them.

Each request is a retrieval, ``--deltas`` generation deltas and a final event (the
bench's load, 200-character chunks, a 30 x 9 x 3 attention summary); a request that
completes is closed, as the processor closes it before deciding. Prints microseconds
of this thread's CPU time per request: the best and the median of ``--passes`` passes
(fresh requests each), with the garbage collector as the service sets it. Paired runs
of two trees, alternating, give the ratio of a change (the machine's noise is large).

    PYTHONPATH=. .venv/bin/python bench/intake_admit.py --passes 25 --requests 150
"""

from __future__ import annotations

import argparse
import statistics
import time

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
    args = parser.parse_args()
    intake = runtime.build_processor(Settings.load(signals={"claims": False})).intake
    shape = LoadShape(payload_chars=200, claims=args.deltas, deltas=args.deltas)
    work = []
    for p in range(args.passes + 1):  # the first pass warms up
        items: list[Item] = []
        for i in range(args.requests):
            rid = f"p{p}-{i}"
            items.extend(request_items(answer_events(rid, shape), rid, p * args.requests + i))
        work.append(items)
    _admit_all(intake, work[0])
    spent = []
    with as_served(Settings.load()):
        for items in work[1:]:
            start = time.thread_time_ns()
            _admit_all(intake, items)
            spent.append((time.thread_time_ns() - start) / args.requests / 1e3)
    print(f"{min(spent):.2f} {statistics.median(spent):.2f}")


if __name__ == "__main__":
    main()
