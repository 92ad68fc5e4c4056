"""Start-up objects are frozen out of the cyclic garbage collector (latency tail), and its
young generation is not walked for every consumed batch (CPU per request)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Callable, Iterator

import pytest

from sidecar import runtime
from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.kafka.permissions import Need
from sidecar.lab.bench.e2e import LoadShape, answer_events
from sidecar.lab.bench.stages import request_items
from sidecar.pipeline.ports import SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.runtime import build_processor, collect_young_after, freeze_startup_objects
from sidecar.telemetry import Telemetry


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_freeze_moves_live_objects_to_the_permanent_generation() -> None:
    kept = [[k] for k in range(1000)]  # tracked containers alive at "start-up"
    before = len(gc.get_objects())
    frozen = freeze_startup_objects()
    # the permanent generation only shrinks after the freeze: a frozen object that
    # another thread of the suite releases leaves it (CI saw 681,440 -> 681,438)
    still = gc.get_freeze_count()
    assert frozen - len(kept) < still <= frozen
    assert frozen >= len(kept)
    assert len(gc.get_objects()) < before - len(kept)  # no generation holds them any more
    # what request handling creates afterwards is still collected
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


def test_gc_freeze_is_on_by_default_and_can_be_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.load().gc_freeze is True
    monkeypatch.setenv("GUARDRAIL_GC_FREEZE", "false")
    assert Settings.load().gc_freeze is False


@pytest.fixture
def young_threshold() -> Iterator[None]:
    """The suite's young-generation threshold, given back after the test."""
    young = gc.get_threshold()[0]
    yield
    collect_young_after(young)


def _young_collections(run: Callable[[], object]) -> int:
    """How many collections of the youngest generation ``run`` sets off."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            seen.append(1)

    gc.collect()  # the count of young objects starts from 0
    gc.callbacks.append(note)
    try:
        run()
    finally:
        gc.callbacks.remove(note)
    return len(seen)


@pytest.mark.usefixtures("young_threshold")
def test_a_consumed_batch_sets_off_no_young_collection_at_the_default_threshold() -> None:
    """A batch of ``max_poll_records`` records (whole bench requests: a retrieval, a delta
    and a final each) holds its objects until its verdicts are out: at CPython's 700 the
    young generation was walked (and its objects promoted) several times per batch."""
    settings = Settings.load(signals={"claims": False})
    processor = build_processor(settings)
    records = settings.kafka.max_poll_records
    requests = [
        request_items(answer_events(f"gc-{i}", LoadShape()), f"gc-{i}", i)
        for i in range(2 * (records // 3))
    ]
    items = [item for request in requests for item in request]
    half = len(items) // 2
    batches = [items[:half], items[half:]]  # whole requests, max_poll_records or a bit less
    processor.on_batch(request_items(answer_events("warm", LoadShape()), "warm", 10**6), 0.0)

    collect_young_after(700)  # CPython's default, as before
    assert _young_collections(lambda: processor.on_batch(batches[0], 0.0)) >= 3
    collect_young_after(settings.gc_young_threshold)
    assert _young_collections(lambda: processor.on_batch(batches[1], 0.0)) == 0


@pytest.mark.usefixtures("young_threshold")
def test_the_young_threshold_is_set_and_given_back() -> None:
    before = gc.get_threshold()
    assert collect_young_after(12_345) == before[0]
    assert gc.get_threshold() == (12_345, *before[1:])  # the older generations as they were
    assert collect_young_after(before[0]) == 12_345
    assert gc.get_threshold() == before


def test_the_young_threshold_defaults_above_a_batch_and_refuses_less_than_cpythons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.load().gc_young_threshold == 50_000
    monkeypatch.setenv("GUARDRAIL_GC_YOUNG_THRESHOLD", "700")
    assert Settings.load().gc_young_threshold == 700
    monkeypatch.setenv("GUARDRAIL_GC_YOUNG_THRESHOLD", "699")
    with pytest.raises(ConfigError, match="greater than or equal to 700"):
        Settings.load()
    monkeypatch.setenv("GUARDRAIL_GC_YOUNG_THRESHOLD", "1000001")  # the young GC all but off
    with pytest.raises(ConfigError, match="less than or equal to 1000000"):
        Settings.load()


@pytest.mark.usefixtures("young_threshold")
def test_serve_walks_the_young_generation_at_the_setting_while_it_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``guardrail run`` sets the threshold before it consumes and gives it back at the end."""
    seen: list[int] = []

    class Service:
        """The Kafka service, left out: started (noting the threshold), then SIGTERM."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            del args, kwargs

        async def start(self) -> None:
            seen.append(gc.get_threshold()[0])
            os.kill(os.getpid(), signal.SIGTERM)  # serve()'s handler sets its stop event

        async def stop(self) -> None:
            pass

    class Setup:
        def shutdown(self, timeout_s: float) -> None:
            del timeout_s

    async def counts(settings: Settings) -> dict[str, int]:
        return {settings.topics.retrieval: 1, settings.topics.generation: 1}

    async def allowed(settings: Settings, processor: object) -> list[Need]:
        del settings, processor
        return []

    monkeypatch.setenv("GUARDRAIL_HTTP__ENABLED", "false")
    monkeypatch.setenv("GUARDRAIL_GC_FREEZE", "false")
    monkeypatch.setenv("GUARDRAIL_GC_YOUNG_THRESHOLD", "23456")
    monkeypatch.setattr(runtime, "verify_topics", counts)
    monkeypatch.setattr(runtime, "_check_permissions", allowed)  # no broker here
    monkeypatch.setattr(runtime, "SidecarService", Service)
    monkeypatch.setattr(runtime, "configure_from_env", lambda *args: Setup())
    monkeypatch.setattr(Telemetry, "from_setup", staticmethod(lambda *a, **k: None))
    before = gc.get_threshold()
    settings = Settings.load()
    processor = Processor(settings, PlaceholderPolicy(), signals=SignalSuite())
    asyncio.run(asyncio.wait_for(runtime.serve(settings, processor), 30))
    assert seen == [23456]
    assert gc.get_threshold() == before  # given back
