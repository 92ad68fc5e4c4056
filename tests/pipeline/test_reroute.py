"""Records off their request's murmur2 partition are sent on to it (``join.reroute``).

A producer with another partitioner (librdkafka's default CRC32, round-robin, FNV-1a)
puts a request's events on other partitions than murmur2 of its id, where Kafka's
default partitioner puts the rest: with several replicas the halves were read by two of
them, and each decided the request ``incomplete`` (audit: 13 of 30 requests, two
verdicts each). Now the replica that reads such a record sends it, as it came, keyed by
its request id, to its own topic: the producer's murmur2 puts it on the partition the
replica holding the other half reads.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from guardrail_client.keys import partition_for
from guardrail_client.records import MAX_RECORD_HEADERS
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import DeadLetterRecord
from sidecar.exceptions import InputError
from sidecar.pipeline import intake
from sidecar.pipeline.deadletters import reroute_refused_output
from sidecar.pipeline.join import REROUTED_HEADER, InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import Processor
from sidecar.pipeline.tally import Outcome
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps
from tests.pipeline.test_intake_limits import verdicts

R, G, F = InputKind.RETRIEVAL, InputKind.GENERATION, InputKind.FEEDBACK
N = 3  # partitions


def processor(settings_factory: Callable[..., Settings], **join: Any) -> Processor:
    return Processor(settings_factory(join={"ttl_ms": 1_000, **join}), PlaceholderPolicy())


def torn_id() -> str:
    """A request id CRC32 (librdkafka's default) and murmur2 put on different partitions."""
    return next(
        r
        for r in (f"req-{i}" for i in range(100))
        if zlib.crc32(r.encode()) % N != partition_for(r, N)
    )


def at(topic: str, partition: int, offset: int, *headers: tuple[str, bytes]) -> InputRef:
    return InputRef(topic, partition, offset, tuple(headers), partitions=N)


def test_a_record_off_its_partition_is_sent_on_as_it_came_and_finished_here(
    settings_factory: Callable[..., Settings], final_event: EventFactory
) -> None:
    rid = torn_id()
    home, crc = partition_for(rid, N), zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    raw = dumps(final_event(rid))
    off = at("g", crc, 7, ("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"))
    step = p.on_message(G, raw, None, off, 0.0)  # a keyless producer: keyed on the way
    (out,) = step.outputs
    assert out.destination is Destination.GENERATION
    assert (out.key, out.value) == (rid.encode(), raw)
    assert out.headers == [*off.headers, (REROUTED_HEADER, f"g/{crc}/7".encode())]
    assert step.done == [off]
    assert p.store.get(rid) is None  # nothing held here: its replica joins it
    assert p.intake.rerouted == 1 and p.intake.misrouted == 0
    assert p.counters.inputs.counts()[("generation", Outcome.REROUTED.value)] == 1
    assert p.counters.inputs.counts()[("generation", Outcome.ACCEPTED.value)] == 0
    # the same record read again (a rebalance): sent again, counted once
    again = p.on_message(G, raw, None, off, 0.0)
    assert [o.destination for o in again.outputs] == [Destination.GENERATION]
    assert p.intake.rerouted == 1
    assert home != crc


def test_the_copy_is_joined_on_its_partition_and_never_rerouted_again(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    rid = torn_id()
    home, crc = partition_for(rid, N), zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    step = p.on_message(G, dumps(final_event(rid)), None, at("g", crc, 0), 0.0)
    copy = step.outputs[0]
    p.on_message(R, dumps(retrieval_event(rid)), rid.encode(), at("r", home, 0), 0.0)
    decided = p.on_message(G, copy.value, copy.key, at("g", home, 5, *copy.headers), 0.0)
    (verdict,) = verdicts(decided)
    assert verdict.request_id == rid and verdict.decision != "incomplete"
    assert p.intake.rerouted == 1 and p.intake.partition_mismatches == 0
    # the original sent on again by a replica that restarted before committing it: its
    # second copy finds the request decided, a duplicate (not after-final)
    late = p.on_message(G, copy.value, copy.key, at("g", home, 6, *copy.headers), 0.0)
    assert late.outputs == [] and late.done and p.intake.rerouted_late == 1
    assert p.intake.rereads == 0
    # a copy still off its partition (the partition count changed meanwhile) is joined
    # where it is read: a header never sends a record round in circles
    other = torn_id() + "-x"
    while partition_for(other, N) == crc:
        other += "x"
    q = processor(settings_factory)
    header = (REROUTED_HEADER, b"g/0/0")
    stay = q.on_message(G, dumps(final_event(other)), None, at("g", crc, 0, header), 0.0)
    assert stay.outputs == [] and q.store.get(other) is not None and q.intake.rerouted == 0


def test_an_input_on_its_partition_costs_one_hash_per_request(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    monkeypatch: Any,
) -> None:
    calls: list[str] = []

    def counting(request_id: str, partitions: int) -> int:
        calls.append(request_id)
        return partition_for(request_id, partitions)

    monkeypatch.setattr(intake, "partition_for", counting)
    p = processor(settings_factory)
    rid = "req-home"
    home = partition_for(rid, N)
    p.on_message(R, dumps(retrieval_event(rid)), None, at("r", home, 0), 0.0)
    for seq in range(20):
        step = p.on_message(G, dumps(delta_event(rid, seq, "a")), None, at("g", home, seq), 0.0)
        assert step.outputs == [] or all(
            o.destination is not Destination.GENERATION for o in step.outputs
        )
    assert calls == [rid]
    # in memory (no partition count): never hashed
    p.on_message(R, dumps(retrieval_event("mem")), None, InputRef("r", 2, 0), 0.0)
    assert calls == [rid]


def test_a_label_off_its_partition_goes_to_its_requests_replica(
    settings_factory: Callable[..., Settings],
) -> None:
    rid = torn_id()
    crc = zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    label = {"schema_version": 1, "event_type": "feedback", "request_id": rid, "correct": True}
    raw = dumps({**label, "source": "user"})
    step = p.on_message(F, raw, rid.encode(), at("f", crc, 3), 0.0)
    assert [(o.destination, o.value) for o in step.outputs] == [(Destination.FEEDBACK, raw)]
    assert p.counters.feedback == 0 and p.intake.misrouted == 0


def test_bad_input_off_its_partition_is_dead_lettered_where_it_is_read(
    settings_factory: Callable[..., Settings], final_event: EventFactory
) -> None:
    """Decoded and checked before the hash: a hostile record costs one dead letter here,
    never a copy on another partition."""
    rid = torn_id()
    crc = zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    bad = {**final_event(rid), "answer": 5}
    step = p.on_message(G, dumps(bad), None, at("g", crc, 0), 0.0)
    assert [o.destination for o in step.outputs] == [Destination.DLQ]
    mis_keyed = p.on_message(G, dumps(final_event(rid)), b"other", at("g", crc, 1), 0.0)
    assert [o.destination for o in mis_keyed.outputs] == [Destination.DLQ]
    assert p.intake.rerouted == 0


def test_rerouting_off_joins_where_read(
    settings_factory: Callable[..., Settings], final_event: EventFactory
) -> None:
    rid = torn_id()
    crc = zlib.crc32(rid.encode()) % N
    p = processor(settings_factory, reroute=False)
    step = p.on_message(G, dumps(final_event(rid)), None, at("g", crc, 0), 0.0)
    assert step.outputs == [] and p.store.get(rid) is not None


def test_a_refused_reroute_is_the_dead_letter_of_the_record_it_was_made_of(
    settings_factory: Callable[..., Settings], final_event: EventFactory
) -> None:
    rid = torn_id()
    crc = zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    off = at("rag.generation", crc, 41, ("x-tenant", b"acme"))
    (copy,) = p.on_message(G, dumps(final_event(rid)), None, off, 0.0).outputs
    letter = reroute_refused_output(
        copy, InputError("reroute-refused", "no WRITE"), failed_at=datetime.now(UTC)
    )
    record = DeadLetterRecord.from_headers(letter.headers)
    assert letter.destination is Destination.DLQ
    assert (record.reason, record.source_topic, record.source_partition, record.source_offset) == (
        "reroute-refused",
        "rag.generation",
        crc,
        41,
    )
    assert record.request_id == rid and letter.value == copy.value
    names = [k for k, _ in letter.headers]
    assert "x-tenant" in names and REROUTED_HEADER not in names


def test_a_record_whose_copy_would_have_one_header_too_many_is_joined_where_read(
    settings_factory: Callable[..., Settings], final_event: EventFactory
) -> None:
    rid = torn_id()
    crc = zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    many = [(f"h{i}", b"") for i in range(MAX_RECORD_HEADERS)]
    step = p.on_message(G, dumps(final_event(rid)), None, at("g", crc, 0, *many), 0.0)
    assert step.outputs == [] and p.store.get(rid) is not None and p.intake.rerouted == 0
    fewer = p.on_message(G, dumps(final_event(rid + "y")), None, at("g", 0, 1, *many[1:]), 0.0)
    assert p.intake.rerouted == (partition_for(rid + "y", N) != 0)
    assert len(fewer.outputs) == p.intake.rerouted


def test_a_rerouted_final_its_last_owner_finished_does_not_decide_its_request_here(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """A rebalance gives one replica both partitions: the handover says the original final
    (off its partition) was finished, but it was rerouted, not decided. Remembered as
    decided, the request's retrieval, read after, was dead-lettered ``after-final`` and
    its rerouted final taken for a duplicate: no verdict at all."""
    rid = torn_id()
    home, crc = partition_for(rid, N), zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    raw = dumps(final_event(rid))
    skipped = InputRef("g", crc, 3, finished=True, partitions=N)
    step = p.on_message(G, raw, rid.encode(), skipped, 0.0)
    assert step.outputs == [] and step.done == [skipped] and p.intake.handed_over == 0
    p.on_message(R, dumps(retrieval_event(rid)), rid.encode(), at("r", home, 0), 1.0)
    header = (REROUTED_HEADER, f"g/{crc}/3".encode())
    (verdict,) = verdicts(p.on_message(G, raw, rid.encode(), at("g", home, 8, header), 2.0))
    assert verdict.request_id == rid and verdict.decision != "incomplete"
    # a final on its own partition that a handover names is still remembered as decided
    q = processor(settings_factory)
    ok = "req-home"
    done = InputRef("g", partition_for(ok, N), 1, finished=True, partitions=N)
    q.on_message(G, dumps(final_event(ok)), ok.encode(), done, 0.0)
    assert q.intake.handed_over == 1


def test_a_rerouted_delta_overtaken_by_its_final_is_finished_not_dead_lettered(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """A round-robin producer spreads a request's deltas over every partition; the final,
    read directly on its request's partition, can come before a delta's copy. The final
    holds the whole answer: the copy is finished (counted), not dead-lettered after-final;
    a delta written there directly after the final still is."""
    rid = torn_id()
    home, crc = partition_for(rid, N), zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    p.on_message(G, dumps(final_event(rid)), None, at("g", home, 0), 0.0)  # waits for retrieval
    header = (REROUTED_HEADER, f"g/{crc}/4".encode())
    copy = p.on_message(G, dumps(delta_event(rid, 0, "x")), None, at("g", home, 1, header), 0.0)
    assert copy.outputs == [] and copy.done and p.intake.rerouted_late == 1
    direct = p.on_message(G, dumps(delta_event(rid, 1, "y")), None, at("g", home, 2), 0.0)
    assert [o.destination for o in direct.outputs] == [Destination.DLQ]
    (verdict,) = verdicts(p.on_message(R, dumps(retrieval_event(rid)), None, at("r", home, 0), 0.0))
    assert verdict.request_id == rid and verdict.decision != "incomplete"


def test_a_record_whose_partition_this_replica_reads_too_is_joined_here(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Sent round, a catch-up's copies land behind their partition's backlog and every
    request waits for its copy: a drain of 20,000 requests, every generation record off
    its partition, one replica, decided 10,000 ``incomplete`` (capacity). A replica that
    reads the request's partition too joins the record where it is (a partition
    mismatch, as before rerouting); a delta there after the final is finished."""
    rid = torn_id()
    home, crc = partition_for(rid, N), zlib.crc32(rid.encode()) % N
    p = processor(settings_factory)
    p.intake.local_partitions = frozenset({("g", home), ("g", crc), ("r", home), ("r", crc)})
    held = p.on_message(G, dumps(final_event(rid)), None, at("g", crc, 0), 0.0)
    assert held.outputs == [] and p.intake.rerouted == 0 and p.store.get(rid) is not None
    late = p.on_message(G, dumps(delta_event(rid, 0, "x")), None, at("g", home, 1), 0.0)
    assert late.outputs == [] and p.intake.rerouted_late == 1  # spread over two partitions
    (verdict,) = verdicts(p.on_message(R, dumps(retrieval_event(rid)), None, at("r", home, 0), 0.0))
    assert verdict.decision != "incomplete" and p.intake.partition_mismatches == 1
    # after the verdict: a record off its partition is finished, one on it dead-lettered
    off = p.on_message(G, dumps(delta_event(rid, 1, "y")), None, at("g", crc, 2), 0.0)
    assert off.outputs == [] and p.intake.rerouted_late == 2
    on = p.on_message(G, dumps(delta_event(rid, 2, "z")), None, at("g", home, 3), 0.0)
    assert [o.destination for o in on.outputs] == [Destination.DLQ]
    # a partition another replica reads: rerouted
    p.intake.local_partitions = frozenset({("g", crc)})
    other = torn_id() + "-2"
    while zlib.crc32(other.encode()) % N == partition_for(other, N):
        other += "x"
    where = zlib.crc32(other.encode()) % N
    p.intake.local_partitions = frozenset({("g", where)})
    sent = p.on_message(G, dumps(final_event(other)), None, at("g", where, 9), 0.0)
    assert [o.destination for o in sent.outputs] == [Destination.GENERATION]
