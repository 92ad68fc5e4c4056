"""What counting consumed input records costs the processor per batch (JSON).

``Processor.on_batch`` counts a batch's records per kind in local variables (one
identity test a record) and adds them once to ``InputTally`` (``guardrail.consumer.records``);
before, it added 1 to ``counters.consumed`` for every record. Both loops are timed with
the record's own work stubbed out (a whole answer costs ~360 us, so the difference
would be lost in its noise), on batches of 3 records (one answer per batch: a
retrieval, a delta, a final), 7 and 500 (a poll of many answers). Best of 15 interleaved
rounds. Not a timed test.

    PYTHONPATH=. .venv/bin/python bench/input_tally_cost.py
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Sequence
from functools import partial
from typing import Any

from sidecar.contracts.codec import InputKind
from sidecar.pipeline.processor import Counters

_GENERATION, _RETRIEVAL = InputKind.GENERATION, InputKind.RETRIEVAL
Item = tuple[InputKind, bytes, bytes, None]


class _Loops:
    """``on_batch``'s loop before and after, the record's own work stubbed."""

    def __init__(self) -> None:
        self.counters = Counters()

    def _admit(self, item: Item) -> None:
        del item

    def before(self, items: Sequence[Item]) -> None:
        for kind, raw, key, ref in items:
            self.counters.consumed += 1
            self._admit((kind, raw, key, ref))

    def after(self, items: Sequence[Item]) -> None:
        retrieval = feedback = 0
        for kind, raw, key, ref in items:
            if kind is not _GENERATION:
                if kind is _RETRIEVAL:
                    retrieval += 1
                else:
                    feedback += 1
            self._admit((kind, raw, key, ref))
        self.counters.consumed += len(items)
        self.counters.inputs.batch(retrieval, len(items) - retrieval - feedback, feedback)


def main() -> dict[str, Any]:
    loops = _Loops()
    report: dict[str, Any] = {}
    for n in (3, 7, 500):
        items: list[Item] = [(_RETRIEVAL, b"", b"", None)] + [(_GENERATION, b"", b"", None)] * (
            n - 1
        )
        number = max(200, 60_000 // n)
        best = {"before": float("inf"), "after": float("inf")}
        for _ in range(15):
            for name, loop in (("before", loops.before), ("after", loops.after)):
                seconds = timeit.timeit(partial(loop, items), number=number) / number
                best[name] = min(best[name], seconds)
        report[f"batch_of_{n}"] = {
            "before_us": round(best["before"] * 1e6, 3),
            "after_us": round(best["after"] * 1e6, 3),
            "added_us_per_batch": round((best["after"] - best["before"]) * 1e6, 3),
        }
    return report


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
