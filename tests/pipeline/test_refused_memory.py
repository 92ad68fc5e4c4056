"""A refused record costs that record, and only until it is dead-lettered: nothing a bad
record brings (its bytes, its batch's items) waits for the cyclic garbage collector.

Each hostile case of the chaos suite goes through the served processor with the
collector off; then a collection must find nothing unreachable. Before the fix, an
``InputError``'s traceback held the frames from ``on_batch`` down, with the record's
bytes and the whole batch's items, in a cycle with its ``Rejected`` admission.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator, Sequence

import pytest

from sidecar import runtime
from sidecar.config import Settings
from sidecar.kafka.records import input_headers, input_kinds
from sidecar.lab.chaos.expectations import HostileRecord, Outcome
from sidecar.lab.chaos.harness import HOSTILE_LIMITS, TENANT_HEADER, _attention_shape
from sidecar.lab.chaos.hostile import HostileFactory
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.processor import BatchItem, Processor


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings.load(
        signals={"claims": False},
        limits=HOSTILE_LIMITS.model_dump(),
        tenancy={"source": "header", "header": TENANT_HEADER},
    )


@pytest.fixture(scope="module")
def processor(settings: Settings) -> Processor:
    return runtime.build_processor(settings)


@pytest.fixture(scope="module")
def factory(settings: Settings) -> HostileFactory:
    return HostileFactory(
        settings.topics,
        HOSTILE_LIMITS,
        tenant_header=TENANT_HEADER,
        attention=_attention_shape(settings),
        seed=11,
    )


class _Offsets:
    def __init__(self) -> None:
        self.next = 0

    def items(self, settings: Settings, records: Sequence[HostileRecord]) -> list[BatchItem]:
        kinds = input_kinds(settings.topics)
        out: list[BatchItem] = []
        for h in records:
            r = h.record
            self.next += 1
            ref = InputRef(r.topic, 0, self.next, headers=input_headers(r.headers))
            out.append((kinds[r.topic], r.value, r.key, ref))
        return out


def _cases(factory: HostileFactory) -> Iterator[tuple[str, list[HostileRecord]]]:
    victims = ["victim-1", "victim-2"]
    yield "victims", [h for rid in victims for h in _ordinary(factory, rid)]
    for gen in (
        factory.absurd_numbers("a-"),
        factory.bad_bytes("b-"),
        factory.sizes("s-"),
        factory.request_ids("i-"),
        factory.tenancy("t-", victims),
    ):
        for records in gen:
            yield records[0].case, records
    yield "labels", factory.labels("l-", victims, 20)
    yield "oversize", factory.oversize("o-") + factory.oversize("p-")


def _ordinary(factory: HostileFactory, rid: str) -> list[HostileRecord]:
    return [HostileRecord("ordinary", r, Outcome.ANSWER) for r in factory.ordinary(rid)]


def test_no_hostile_record_leaves_garbage_for_the_cyclic_collector(
    settings: Settings, processor: Processor, factory: HostileFactory
) -> None:
    offsets = _Offsets()
    cycles: dict[str, int] = {}
    now = 0.0
    gc.collect()
    gc.disable()
    try:
        for case, records in _cases(factory):
            now += 10.0
            processor.on_batch(offsets.items(settings, records), now)
            processor.on_tick(now)
            if found := gc.collect():
                cycles[case] = found
    finally:
        gc.enable()
    assert cycles == {}


def test_a_flood_of_oversize_records_is_freed_as_it_is_refused(
    settings: Settings, processor: Processor, factory: HostileFactory
) -> None:
    """300 records over the message limit (~33 KB each, ~10 MB in all), one batch each,
    with the collector off: what stays is under one batch's worth."""
    offsets = _Offsets()
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(300):
            records = factory.message_bytes(f"flood-{i}", 1)
            processor.on_batch(offsets.items(settings, records), 1_000.0 + i)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        gc.enable()
    assert held < 1_000_000, held
