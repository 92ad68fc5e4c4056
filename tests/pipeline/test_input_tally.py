"""The consumed-records tally: a batch's records by kind and outcome, counted once a batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.pipeline.tally import InputTally, Outcome
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps

R, G, F = InputKind.RETRIEVAL, InputKind.GENERATION, InputKind.FEEDBACK


def _nonzero(tally: InputTally) -> dict[tuple[str, str], int]:
    return {key: n for key, n in tally.counts().items() if n}


def test_every_kind_and_outcome_starts_at_zero() -> None:
    counts = InputTally().counts()
    assert counts == {(k.value, o.value): 0 for k in InputKind for o in Outcome}


def test_a_batch_is_accepted_less_what_other_outcomes_took() -> None:
    tally = InputTally()
    tally.add(G, Outcome.DEAD_LETTERED)
    tally.add(R, Outcome.DUPLICATE)
    tally.batch(retrieval=2, generation=5, feedback=1)
    tally.batch(retrieval=1, generation=0, feedback=0)  # the next batch: nothing set aside
    assert _nonzero(tally) == {
        ("retrieval", "accepted"): 2,
        ("retrieval", "duplicate"): 1,
        ("generation", "accepted"): 4,
        ("generation", "dead-lettered"): 1,
        ("feedback", "accepted"): 1,
    }


def test_a_record_dead_lettered_twice_never_makes_accepted_go_back() -> None:
    """A bug after a record's dead letter dead-letters it again (internal-error): two dead
    letters, as guardrail.dead_letters counts them; accepted never drops (a counter read
    lower than before is a reset to Prometheus)."""
    tally = InputTally()
    tally.batch(retrieval=3, generation=0, feedback=0)
    tally.add(R, Outcome.DEAD_LETTERED)
    tally.add(R, Outcome.DEAD_LETTERED)
    tally.batch(retrieval=1, generation=0, feedback=0)
    assert _nonzero(tally) == {("retrieval", "accepted"): 3, ("retrieval", "dead-lettered"): 2}


def _items(events: list[tuple[InputKind, bytes, bytes]]) -> list[BatchItem]:
    return [
        (kind, raw, key, InputRef(topic=kind.value, partition=0, offset=i))
        for i, (kind, raw, key) in enumerate(events)
    ]


@pytest.fixture
def processor(settings_factory: Callable[..., Settings]) -> Processor:
    return Processor(settings_factory(), PlaceholderPolicy())


def test_one_batch_of_good_bad_and_repeated_records(
    processor: Processor, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    label: dict[str, Any] = {
        "schema_version": 1, "event_type": "feedback", "request_id": "a", "correct": True,
        "source": "user",
    }  # fmt: skip

    batch = _items(
        [
            (R, dumps(retrieval_event("a")), b"a"),
            (R, dumps(retrieval_event("a")), b"a"),  # the same bytes again: a duplicate
            (G, dumps(final_event("a")), b"a"),
            (R, dumps(retrieval_event("b")), b"b"),
            (G, b"{", b"c"),  # unreadable: dead-lettered
            (R, dumps(retrieval_event("d")), b"other-key"),  # key is not its request id
            (F, orjson.dumps(label), b"a"),
        ]
    )
    step = processor.on_batch(batch, 0.0)
    assert len([o for o in step.outputs if o.destination is Destination.DLQ]) == 2
    assert _nonzero(processor.counters.inputs) == {
        ("retrieval", "accepted"): 2,
        ("retrieval", "duplicate"): 1,
        ("retrieval", "dead-lettered"): 1,
        ("generation", "accepted"): 1,
        ("generation", "dead-lettered"): 1,
        ("feedback", "accepted"): 1,
    }
    assert processor.counters.consumed == len(batch)


def test_a_record_that_hits_a_bug_is_counted_dead_lettered(
    processor: Processor, retrieval_event: EventFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(processor, "_admit", broken)
    processor.on_batch(_items([(R, dumps(retrieval_event("a")), b"a")] * 2), 0.0)
    assert _nonzero(processor.counters.inputs) == {("retrieval", "dead-lettered"): 2}
