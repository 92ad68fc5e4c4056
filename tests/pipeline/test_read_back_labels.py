"""Labels read back from the feedback topic (a partition's coverage windows, on assignment)
are read as intake reads them when it consumes them: what intake refuses, and dead-letters
when consumed, is left out of the refill, one record at a time, and a label names only
its own tenant's request (``Processor.read_back_label``)."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from guardrail_client.keys import partition_for
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import Decision
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.ports import DecidedRequest, ReadLabel
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.confidence.test_fleet_partitions import signal
from tests.conftest import EventFactory
from tests.pipeline.test_processor_feedback import KEY, decide, feedback_event, make_feed

REF = InputRef("rag.feedback", 1, 7, partitions=3)
F = InputKind.FEEDBACK


def processor(settings_factory: Callable[..., Settings], **overrides: object) -> Processor:
    return Processor(settings_factory(**overrides), PlaceholderPolicy())


def test_a_label_is_read_back_with_its_request_key_and_whether_it_is_an_error(
    settings_factory: Callable[..., Settings],
) -> None:
    p = processor(settings_factory)
    value = orjson.dumps(feedback_event("req-1"))
    home = {rid: partition_for(rid, 3) for rid in ("req-1", "req-2", "req-3")}
    assert p.read_back_label(value, b"req-1", REF) == ReadLabel(
        "req-1", False, False, home["req-1"]
    )
    right = orjson.dumps(feedback_event("req-2", correct=True))
    assert p.read_back_label(right, b"req-2", REF) == ReadLabel("req-2", True, False, home["req-2"])
    abstained = orjson.dumps(feedback_event("req-3", abstained=True))
    assert p.read_back_label(abstained, None, REF) == ReadLabel("req-3", False, True, home["req-3"])
    # the partition its request's id hashes to, wherever it was read (a rerouted copy
    # and its original are one label); where it was read when the count is not known
    unknown = InputRef("rag.feedback", 2, 7)
    assert p.read_back_label(value, b"req-1", unknown) == ReadLabel("req-1", False, False, 2)


@pytest.mark.parametrize(
    ("value", "key"),
    [
        (b"{not json", b"req-1"),
        (b"\xff\xfe\x00 not utf-8", b"req-1"),
        (orjson.dumps(feedback_event("req-1", correct="yes")), b"req-1"),
        (orjson.dumps(feedback_event("req-1", schema_version=99)), b"req-1"),
        (orjson.dumps(feedback_event("req-1")), b"another-request"),
        (orjson.dumps({**feedback_event("req-1"), "event_type": "retrieval"}), b"req-1"),
        (orjson.dumps(feedback_event("r" * 5000)), None),
        (orjson.dumps(feedback_event("req-1")) + b" " * 1_100_000, b"req-1"),  # > 1 MiB
        (None, b"req-1"),
    ],
    ids=[
        "malformed",
        "not-utf8",
        "schema",
        "version",
        "key",
        "event-type",
        "long-id",
        "oversize",
        "tombstone",
    ],
)
def test_what_intake_refuses_is_left_out(
    settings_factory: Callable[..., Settings], value: bytes | None, key: bytes | None
) -> None:
    assert processor(settings_factory).read_back_label(value, key, REF) is None


def test_under_header_tenancy_a_label_names_its_own_tenants_request(
    settings_factory: Callable[..., Settings],
) -> None:
    p = processor(settings_factory, tenancy={"source": "header", "header": "x-tenant"})
    value = orjson.dumps(feedback_event("req-1"))
    acme = InputRef("rag.feedback", 1, 7, headers=(("x-tenant", b"acme"),), partitions=3)
    assert p.read_back_label(value, b"req-1", acme) == ReadLabel(
        "acme/req-1", False, False, partition_for("req-1", 3)
    )
    assert p.read_back_label(value, b"req-1", REF) is None  # no tenant header: refused


def test_a_label_read_back_then_consumed_again_is_not_a_replacement(
    settings_factory: Callable[..., Settings],
) -> None:
    # a restarted replica reads its partitions' labels back, then consumes those past the
    # committed offset again: the same records, not a producer's second labels
    ids = [f"req-{i}" for i in range(6)]
    monitor = CoverageMonitor(window=100)
    feed = make_feed(settings_factory, coverage=monitor)
    p = feed.processor
    p.warm_start(
        [
            DecidedRequest(rid, None, Decision.ALLOW, signal(i % 2 == 0), None, None)
            for i, rid in enumerate(ids)
        ]
    )
    values = [orjson.dumps(feedback_event(rid, correct=i < 3)) for i, rid in enumerate(ids)]
    read = [
        p.read_back_label(value, rid.encode(), InputRef("rag.feedback", 0, offset))
        for offset, (rid, value) in enumerate(zip(ids, values, strict=True))
    ]
    assert p.hold_partitions(frozenset({0}), 1, [label for label in read if label]) is not None
    counts = monitor.tracker.counts(KEY)
    held = (counts.labelled_covered, counts.labelled_uncovered, counts.errors_covered)
    assert held == (3, 3, 1)
    for rid, value in zip(ids, values, strict=True):
        feed(F, value, key=rid.encode())
    c = p.counters
    assert (c.feedback, c.feedback_replaced, c.feedback_unmatched) == (6, 0, 0)
    counts = monitor.tracker.counts(KEY)
    assert (counts.labelled_covered, counts.labelled_uncovered, counts.errors_covered) == held
    feed(F, orjson.dumps(feedback_event(ids[0], correct=False)), key=ids[0].encode())
    assert c.feedback_replaced == 1  # a second label of a request still is one


def test_a_label_waiting_for_its_request_moves_with_its_partition(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    # catching up, the feedback topic runs ahead of the inputs: a label waits for its
    # request on the replica that read it. The partition moves (the lag scaled the fleet
    # out): its new owner reads the label back before the request is decided anywhere,
    # and keeps it waiting for it, as the old owner did
    wall = 1_700_000_000_000
    old = make_feed(settings_factory, coverage=CoverageMonitor())
    value = orjson.dumps(feedback_event("req-a", correct=False))
    old(F, value, key=b"req-a")
    assert len(old.processor.waiting_labels) == 1

    monitor = CoverageMonitor()
    new = make_feed(settings_factory, coverage=monitor)
    p = new.processor
    stale = orjson.dumps(feedback_event("req-z", correct=False))  # past the decided memory
    memory = p.waiting_labels.max_age_ms
    read = [
        p.read_back_label(
            stale, b"req-z", InputRef("rag.feedback", 0, 0, timestamp_ms=wall - int(memory))
        ),
        p.read_back_label(value, b"req-a", InputRef("rag.feedback", 0, 1, timestamp_ms=wall - 5)),
    ]
    held = p.hold_partitions(frozenset({0}), 1, [label for label in read if label])
    assert held is not None and held.labels_unmatched == 2
    assert p.move_waiting_labels(held, 1, 0.0, wall) == 1  # req-z's would have left
    assert len(p.waiting_labels) == 1
    decide(new, retrieval_event, final_event, "req-a", now_ms=5_000.0)
    counts = monitor.tracker.counts(KEY)
    assert (counts.labelled_covered, counts.errors_covered) == (1, 1)
    c = p.counters
    assert (c.feedback, c.feedback_unmatched) == (0, 0)  # consumed by the old owner, not here


def test_a_label_read_back_waits_without_taking_a_consumed_ones_room_and_leaves_uncounted(
    settings_factory: Callable[..., Settings],
) -> None:
    wall = 1_700_000_000_000
    feed = make_feed(settings_factory, coverage=CoverageMonitor())
    p = feed.processor
    p.waiting_labels.max_entries = 2
    feed(F, orjson.dumps(feedback_event("req-live")), key=b"req-live")
    read = [
        p.read_back_label(
            orjson.dumps(feedback_event(f"req-{i}")),
            f"req-{i}".encode(),
            InputRef("rag.feedback", 0, i, timestamp_ms=wall - 100 + i),
        )
        for i in range(3)
    ]
    held = p.hold_partitions(frozenset({0}), 1, [label for label in read if label])
    assert held is not None
    assert p.wait_for_requests(held.unknown, 0.0, wall) == 1  # the newest, in the room left
    assert p.waiting_labels.take("req-live") is not None  # the consumed one stays
    assert p.waiting_labels.take("req-2") is not None
    feed(F, orjson.dumps(feedback_event("req-live")), key=b"req-live")
    p.wait_for_requests(held.unknown, 0.0, wall)
    assert len(p.waiting_labels) == 2
    memory = p.waiting_labels.max_age_ms
    feed.processor.on_tick(memory + 1.0)  # both leave: only the consumed one is unmatched
    assert len(p.waiting_labels) == 0
    assert p.counters.feedback_unmatched == 1


def test_labels_waiting_for_requests_of_partitions_gone_elsewhere_leave_uncounted(
    settings_factory: Callable[..., Settings],
) -> None:
    # the old owner's side of the move: the waiting labels of partitions read elsewhere now
    # are the new owner's (it reads them back); kept here, they waited in vain and left as
    # unmatched. A rebalance revokes every partition first (eager): only the assignment
    # after it says which went elsewhere
    feed = make_feed(settings_factory, coverage=CoverageMonitor())
    p = feed.processor
    ids = [f"req-{i}" for i in range(12)]
    assert p.hold_partitions(frozenset({0, 1, 2}), 3) is not None
    for rid in ids:
        feed(F, orjson.dumps(feedback_event(rid)), key=rid.encode())
    assert len(p.waiting_labels) == 12
    gone = [rid for rid in ids if partition_for(rid, 3) == 1]
    assert 0 < len(gone) < 12
    held = p.hold_partitions(frozenset({0, 2}), 3)
    assert held is not None and held.gone == (1,)
    assert p.move_waiting_labels(held, 3, 0.0, 0.0) == 0
    assert len(p.waiting_labels) == 12 - len(gone)
    assert all(p.waiting_labels.take(rid) is None for rid in gone)
    p.on_tick(p.waiting_labels.max_age_ms + 1.0)
    assert p.counters.feedback_unmatched == 12 - len(gone)  # only the ones kept here


def test_a_label_stamped_ahead_of_this_clock_counts_as_recent(
    settings_factory: Callable[..., Settings],
) -> None:
    wall = 1_700_000_000_000
    feed = make_feed(settings_factory, coverage=CoverageMonitor())
    p = feed.processor
    stamps = {"req-ahead": wall + 3_000, "req-none": -1, "req-old": wall - 10**9}
    read = [
        p.read_back_label(
            orjson.dumps(feedback_event(rid)),
            rid.encode(),
            InputRef("rag.feedback", 0, i, timestamp_ms=ts),
        )
        for i, (rid, ts) in enumerate(stamps.items())
    ]
    held = p.hold_partitions(frozenset({0}), 1, [label for label in read if label])
    assert held is not None
    assert p.move_waiting_labels(held, 1, 0.0, wall) == 1  # the producer's clock runs ahead
    assert p.waiting_labels.take("req-ahead") is not None


def test_a_waiting_label_read_back_then_consumed_live_counts_once(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    # the old owner had not committed the label yet: the new owner reads it back and
    # consumes it again; it waits once, and labels its request once
    wall = 1_700_000_000_000
    monitor = CoverageMonitor()
    feed = make_feed(settings_factory, coverage=monitor)
    p = feed.processor
    value = orjson.dumps(feedback_event("req-a", correct=False))
    label = p.read_back_label(value, b"req-a", InputRef("rag.feedback", 0, 0, timestamp_ms=wall))
    assert label is not None
    held = p.hold_partitions(frozenset({0}), 1, [label])
    assert held is not None and p.move_waiting_labels(held, 1, 0.0, wall) == 1
    feed(F, value, key=b"req-a")
    assert len(p.waiting_labels) == 1
    decide(feed, retrieval_event, final_event, "req-a", now_ms=5_000.0)
    counts = monitor.tracker.counts(KEY)
    assert (counts.labelled_covered, counts.errors_covered) == (1, 1)
    c = p.counters
    assert (c.feedback, c.feedback_replaced, c.feedback_unmatched) == (1, 0, 0)
    assert len(p.waiting_labels) == 0
