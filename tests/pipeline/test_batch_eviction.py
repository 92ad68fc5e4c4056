"""A request completed early in a batch must not be evicted for room later in that batch.

Were a completed request left open in the join store until the batch is decided,
a new request later in the batch that needs its slot (``max_entries``) or its
bytes (``max_bytes``) would evict it: a ``block``/``incomplete`` verdict *and*
the decided verdict, and its inputs finished twice (found by
``test_fuzz_batch.py`` with ``max_entries=2``).
"""

from __future__ import annotations

from collections import Counter

import orjson

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.lab.chaos.corpus import final, retrieval
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.policy import PlaceholderPolicy


def test_a_request_completed_then_evicted_in_the_same_batch_gets_one_verdict() -> None:
    processor = Processor(Settings.load(join={"max_entries": 4}), PlaceholderPolicy())
    batch: list[BatchItem] = [
        (
            InputKind.RETRIEVAL,
            orjson.dumps(retrieval("r1")),
            b"r1",
            InputRef("rag.retrieval", 0, 0),
        ),
        (
            InputKind.GENERATION,
            orjson.dumps(final("r1", "An answer.")),
            b"r1",
            InputRef("rag.generation", 0, 0),
        ),
    ]
    batch += [  # four more requests: the fifth open one evicts the oldest, r1
        (
            InputKind.RETRIEVAL,
            orjson.dumps(retrieval(rid)),
            rid.encode(),
            InputRef("rag.retrieval", 0, i),
        )
        for i, rid in enumerate(["r2", "r3", "r4", "r5"], start=1)
    ]
    step = processor.on_batch(batch, now_ms=0.0)
    verdicts = [
        orjson.loads(o.value)["request_id"]
        for o in step.outputs
        if o.destination is Destination.VERDICTS
    ]
    assert verdicts.count("r1") == 1
    assert max(Counter((r.topic, r.offset) for r in step.done).values()) == 1
