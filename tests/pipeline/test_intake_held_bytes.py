"""``held_bytes`` and the intake's one-look-up fast path give what they gave before.

``held_bytes`` sums its texts in plain loops (no generator, no ``max``) since the intake's
per-record cost was cut; these hold it to the formula it replaces, on events where the raw
bytes count and where the texts do (a non-ASCII query, emoji hits), with kept headers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import pytest

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind, decode_input
from sidecar.contracts.events import (
    AttentionSummary,
    GenerationDelta,
    GenerationFinal,
    RetrievalEvent,
)
from sidecar.pipeline.intake import HELD_EVENT_OVERHEAD, HELD_HIT_OVERHEAD, JoinedEvent, held_bytes
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps

R, G = InputKind.RETRIEVAL, InputKind.GENERATION
HEADERS = (("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"), ("baggage", b"k=v"))


def reference(event: JoinedEvent, raw: bytes | None, headers: tuple[tuple[str, bytes], ...]) -> int:
    """The formula as it was written before (generator and ``max``)."""
    extra = HELD_EVENT_OVERHEAD
    if isinstance(event, GenerationDelta):
        text = sys.getsizeof(event.text)
    elif isinstance(event, RetrievalEvent):
        text = sys.getsizeof(event.query) + sum(sys.getsizeof(h.text) for h in event.hits)
        extra += HELD_HIT_OVERHEAD * len(event.hits)
    else:
        text = sys.getsizeof(event.answer)
        if event.attention is not None:
            extra += event.attention.decoded_bytes
    return max(len(raw) if raw else 0, text) + extra + sum(len(k) + len(v) for k, v in headers)


def _raws(
    retrieval_event: EventFactory, delta_event: EventFactory, final_event: EventFactory
) -> list[tuple[InputKind, bytes]]:
    summary = AttentionSummary.from_array(np.full((2, 2, 8), 0.25)).model_dump()
    emoji = [
        {"chunk_id": f"c{i}", "doc_id": "d", "score": 0.5, "text": "\U0001f600" + "b" * 1000}
        for i in range(3)
    ]
    return [
        (R, dumps(retrieval_event())),  # the raw bytes count
        (R, dumps(retrieval_event(query="\U0001f600" + "a" * 3000))),  # the query's heap counts
        (R, dumps(retrieval_event(hits=emoji, k=3))),  # the hits' heap counts
        (G, dumps(delta_event(text="x"))),
        (G, dumps(delta_event(text="\U0001f600" + "c" * 500))),
        (G, dumps(final_event())),
        (G, dumps(final_event(attention=summary))),
        (G, dumps(final_event(answer="\U0001f600" + "d" * 2000, attention=summary))),
    ]


@pytest.mark.parametrize("headers", [(), HEADERS])
def test_held_bytes_is_the_formula_it_replaces(
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
    headers: tuple[tuple[str, bytes], ...],
) -> None:
    seen = set()
    for kind, raw in _raws(retrieval_event, delta_event, final_event):
        event = decode_input(kind, raw, max_bytes=10**8, max_depth=64)
        assert isinstance(event, RetrievalEvent | GenerationDelta | GenerationFinal)
        expected = reference(event, raw, headers)
        assert held_bytes(event, raw, headers) == expected
        assert held_bytes(event, None, headers) == reference(event, None, headers)
        seen.add(reference(event, raw, ()) > reference(event, None, ()))  # raw bytes counted
    assert seen == {True, False}  # both sides of the ``max``: the raw bytes, the texts


def test_a_request_open_here_is_held_and_accounted_as_before(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Each event after the first skips the decided memory and ``_open``: its bytes, refs,
    partitions and the final's headers are kept as they were; a second request's first
    event still opens it (one decided stays ``after-final``)."""
    p = Processor(settings_factory(), PlaceholderPolicy())
    events = [
        (R, dumps(retrieval_event("a")), InputRef("r", 0, 0)),
        (G, dumps(delta_event("a", 0, "Frank")), InputRef("g", 0, 0)),
        (G, dumps(delta_event("a", 1, "enstein")), InputRef("g", 1, 1, HEADERS)),
    ]
    expected = 0
    for kind, raw, ref in events:
        p.on_message(kind, raw, b"a", ref, 0.0)
        event = decode_input(kind, raw, max_bytes=10**8, max_depth=64)
        assert isinstance(event, RetrievalEvent | GenerationDelta)
        expected += reference(event, raw, ref.headers)
    entry = p.store.get("a")
    assert entry is not None
    assert entry.bytes_held == p.store.bytes_held == expected
    assert [r.offset for r in entry.refs] == [0, 0, 1]
    assert entry.partitions == {0: "r", 1: "g"} and p.intake.partition_mismatches == 1
    final = dumps(final_event("a"))
    step = p.on_message(G, final, b"a", InputRef("g", 0, 2, HEADERS), 0.0)
    assert [o.destination.value for o in step.outputs] == ["verdicts"]
    assert p.store.get("a") is None and p.store.bytes_held == 0
    late = p.on_message(G, dumps(delta_event("a", 2, "!")), b"a", InputRef("g", 0, 3), 0.0)
    assert [o.destination.value for o in late.outputs] == ["dlq"]
    assert late.outputs[0].header("x-dlq-reason") == b"after-final"
