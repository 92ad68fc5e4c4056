"""A producer that invents a tenant per request (``tenancy.source=event`` trusts the event's)
costs bounded memory: every per-key store of the served processor has a key limit."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from sidecar import runtime
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.lab.bench.e2e import LoadShape, answer_events
from sidecar.lab.bench.stages import request_items
from sidecar.pipeline.processor import BatchItem, Processor

SHAPE = LoadShape(payload_chars=200)


def _batch(first: int, n: int, tenant: str | None) -> list[BatchItem]:
    items: list[BatchItem] = []
    for i in range(first, first + n):
        rid = f"r{i}"
        retrieval, deltas, final = answer_events(rid, SHAPE)
        retrieval["tenant"] = tenant or f"t{i}"  # the global calibration stands in for it
        items += request_items((retrieval, deltas, final), rid, i)
    return items


def _feed(processor: Processor, first: int, last: int, tenant: str | None = None) -> None:
    for b in range(first, last, 50):
        step = processor.on_batch(_batch(b, 50, tenant), float(b))
        assert len(step.outputs) >= 50  # every request decided (a verdict each)
        processor.on_tick(float(b))


@pytest.fixture(scope="module")
def served() -> Processor:
    return runtime.build_processor(
        Settings.load(signals={"claims": False}, coverage={"max_keys": 8})
    )


def test_the_coverage_monitor_keeps_max_keys_windows(served: Processor) -> None:
    _feed(served, 0, 500)
    coverage = served.signals.coverage
    assert isinstance(coverage, CoverageMonitor)
    assert len(coverage.tracker.keys()) == 8
    assert coverage.evicted_keys >= 500 - 8
    assert all(key.startswith("global[t") for key in coverage.tracker.keys())


def test_memory_per_invented_tenant_is_bounded(served: Processor) -> None:
    """Traced Python memory over 3,000 more requests, each with its own tenant, against
    the same requests under one tenant, once every per-key store is full (the m1 monitor
    and the score-order check keep 4,096 keys). Before the coverage key limit each new
    tenant kept ~2 KB more (7.2 MB here, 1.1 MB for one tenant); what stays is the
    decided-keys memory and the one tenant's windows."""
    grown = {}
    tracemalloc.start()  # from here: a store's evictions count as much as its additions
    try:
        _feed(served, 500, 5_000)
        for name, tenant in (("invented", None), ("one", "acme")):
            start = 10_000 if name == "invented" else 20_000  # ids not seen before
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            _feed(served, start, start + 3_000, tenant)
            gc.collect()
            grown[name] = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # one tenant's 3,000 requests fill its window; invented ones must cost no more than
    # that plus a margin (1 MB), never a store per tenant (~6 MB more)
    assert grown["invented"] < grown["one"] + 1_000_000, grown
