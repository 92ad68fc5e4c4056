"""A consumed batch worked on in parts (``Processor.on_part``): each part's step is
published before the next part, so a long batch streams its verdicts.

The parts of a batch must add up to the batch: the same verdicts, claim verdicts and
dead letters, every input finished exactly once, whatever the budget.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination, Step
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.runtime import build_policy, build_signals
from tests.conftest import REPO, EventFactory, dumps
from tests.jsonclose import same_json
from tests.pipeline.test_recorded_outputs import recorded_batches
from tests.pipeline.test_signal_wiring import make

WALL = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
R, G = InputKind.RETRIEVAL, InputKind.GENERATION


class Ticks:
    """A stage clock that moves ``step_ns`` at every reading."""

    def __init__(self, step_ns: int) -> None:
        self.now = 0
        self.step_ns = step_ns

    def __call__(self) -> int:
        self.now += self.step_ns
        return self.now


def _served(clock_ns: Callable[[], int]) -> Processor:
    settings = Settings.load(models={"dir": str(REPO / "models")})
    return Processor(
        settings,
        build_policy(settings),
        signals=build_signals(settings),
        wall_clock=lambda: WALL,
        clock_ns=clock_ns,
    )


def _in_parts(
    p: Processor, batch: list[BatchItem], now_ms: float, budget_ns: int | None
) -> list[tuple[Step, int]]:
    """Every part of ``batch``: its step and where the next part starts."""
    parts, start = [], 0
    while start < len(batch):
        step, start = p.on_part(batch, start, now_ms, budget_ns)
        parts.append((step, start))
    return parts


def _published(steps: list[Step]) -> tuple[dict[tuple[str, str], list[Any]], Counter[Any]]:
    """What the steps publish, by destination and key (each output's JSON, less what
    depends on how the batch was cut), and the inputs they finish, with how often."""
    out: dict[tuple[str, str], list[Any]] = {}
    done: Counter[tuple[str, int]] = Counter()
    for step in steps:
        for o in step.outputs:
            key = "" if o.key is None else o.key.decode()
            out.setdefault((o.destination.value, key), []).append(_comparable(o.value))
        done.update((ref.topic, ref.offset) for ref in step.done)
    return out, done


def _comparable(value: bytes) -> Any:
    """A verdict less its stage timings (the stage clock's readings) and the retrieval
    monitor's reading, which counts the requests decided before: a part decided earlier
    is counted by the next part's verdicts, a whole batch's are not (as across batches)."""
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value  # a dead letter's original bytes
    if isinstance(document, dict):
        document.pop("timings_ms", None)
        retrieval = document.get("signals", {}).get("retrieval", {})
        retrieval.pop("m1_mean", None)
        retrieval.pop("monitor", None)
    return document


@pytest.mark.parametrize("budget_ns", [1, 5, 40])
def test_the_parts_of_a_batch_publish_and_finish_what_the_whole_batch_does(
    budget_ns: int,
) -> None:
    """The recorded input (whole requests, split ones, a re-sent final, malformed JSON, a
    label, a half-request) once as whole batches and once in parts of a few records."""
    whole, parted = _served(Ticks(1)), _served(Ticks(1))
    whole_steps, parted_steps = [], []
    for n, batch in enumerate(recorded_batches(), start=1):
        whole_steps.append(whole.on_batch(batch, 1000.0 * n))
        parts = _in_parts(parted, batch, 1000.0 * n, budget_ns)
        assert [end for _, end in parts][-1] == len(batch)
        if budget_ns < len(batch):
            assert len(parts) > 1  # not vacuous: the batch was cut
        parted_steps += [step for step, _ in parts]
    whole_steps.append(whole.on_tick(10.0**9))
    parted_steps.append(parted.on_tick(10.0**9))
    parted_out, parted_done = _published(parted_steps)
    whole_out, whole_done = _published(whole_steps)
    assert parted_done == whole_done and set(parted_done.values()) == {1}  # each input once
    assert any(dest == "verdicts" for dest, _ in whole_out)
    # per key, in the same order (claim verdicts before their answer's verdict); across
    # keys a part's verdicts come before a later part's dead letters, where the whole
    # batch's came after all its dead letters
    assert sorted(parted_out) == sorted(whole_out)
    for key, documents in whole_out.items():
        # each request's scores are the same whatever shares its model calls: bit for bit
        same_json(parted_out[key], documents, str(key), rel_tol=0.0, abs_tol=0.0)
    assert whole.counters.consumed == parted.counters.consumed
    assert whole.counters.inputs.counts() == parted.counters.inputs.counts()


def test_a_part_ends_once_its_budget_is_spent() -> None:
    """A clock that moves 10 ns a reading, a budget of 25 ns: the part's first reading
    sets the deadline; it ends after the record at which a reading passed it."""
    p = _served(Ticks(10))
    batch = recorded_batches()[0]  # six whole requests, 24 records
    parts = _in_parts(p, batch, 1000.0, 25)
    ends = [end for _, end in parts]
    assert ends == sorted(set(ends)) and ends[-1] == len(batch)
    assert len(parts) >= 3
    assert p.on_part(batch, len(batch), 1000.0, 25)[1] == len(batch)  # nothing left: empty


def test_with_no_budget_a_part_is_the_rest_of_the_batch() -> None:
    p = _served(Ticks(10**9))  # a second a reading: any budget would cut every record
    batch = recorded_batches()[0]
    _, end = p.on_part(batch, 5, 1000.0, None)
    assert end == len(batch)
    assert p.counters.consumed == len(batch) - 5


def test_with_claims_on_a_completed_request_ends_its_part(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Its verification is the deciding's cost, and its verdict should not wait for the
    rest of the batch: the part ends at the final, with the request's claim verdicts and
    verdict in it; a generous budget does not keep the next request in the same part."""
    p = make(settings_factory)
    offsets = itertools.count()

    def item(kind: InputKind, event: dict[str, Any]) -> BatchItem:
        return (
            kind,
            dumps(event),
            event["request_id"].encode(),
            InputRef(kind.value, 0, next(offsets)),
        )

    batch: list[BatchItem] = []
    for rid in ("req-1", "req-2", "req-3"):
        batch += [
            item(R, retrieval_event(rid)),
            item(G, delta_event(rid, seq=0, text="Mary Shelley wrote it. ")),
            item(
                G,
                final_event(rid, answer="Mary Shelley wrote it. In 1818.", generator_model="gen-a"),
            ),
        ]
    parts = _in_parts(p, batch, 0.0, 10**12)
    assert [end for _, end in parts] == [3, 6, 9]
    for (step, _), rid in zip(parts, ("req-1", "req-2", "req-3"), strict=True):
        kinds = [o.destination for o in step.outputs]
        # the streamed claim, then the verdict
        assert kinds == [Destination.CLAIMS, Destination.VERDICTS]
        assert {orjson.loads(o.value)["request_id"] for o in step.outputs} == {rid}
        assert len(step.done) == 3


def test_with_claims_on_a_request_completed_by_its_retrieval_ends_its_part(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """A poll may hand the answers over before their retrievals: each retrieval then
    completes a request with none of its claims verified (no session could open without
    it), and all of them are verified as it is decided. Before, such a batch admitted
    every request within the budget and verified the whole backlog at the part's end."""
    p = make(settings_factory)
    offsets = itertools.count()

    def item(kind: InputKind, event: dict[str, Any]) -> BatchItem:
        ref = InputRef(kind.value, 0, next(offsets))
        return (kind, dumps(event), event["request_id"].encode(), ref)

    rids = ("req-1", "req-2", "req-3")
    answer = "Mary Shelley wrote it. It was 1818. "
    batch = [item(G, delta_event(rid, seq=0, text=answer)) for rid in rids]
    batch += [item(G, final_event(rid, answer=answer, generator_model="gen-a")) for rid in rids]
    batch += [item(R, retrieval_event(rid)) for rid in rids]
    parts = _in_parts(p, batch, 0.0, 10**12)
    assert [end for _, end in parts] == [7, 8, 9]
    for (step, _), rid in zip(parts, rids, strict=True):
        kinds = [o.destination for o in step.outputs]
        assert kinds == [Destination.CLAIMS, Destination.CLAIMS, Destination.VERDICTS]
        assert {orjson.loads(o.value)["request_id"] for o in step.outputs} == {rid}
