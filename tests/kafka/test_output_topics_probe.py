"""The probe's watch on the output topics, and the producer's throttled metadata refresh."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from sidecar.config import Settings
from sidecar.kafka.clients import MetadataThrottle
from sidecar.kafka.readiness import BrokerProbe, LoopState
from sidecar.runtime import _Started


class Clock:
    """The probe's clock, moved by hand; on ``time.monotonic``'s scale, which ``LoopState``
    reads its clocks against."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


INPUTS = ("rag.retrieval", "rag.generation")
OUTPUTS = ("rag.verdicts", "rag.claims", "rag.dlq")


def test_an_output_topic_deleted_under_the_loop_is_unready_then_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    state = LoopState()
    probe = BrokerProbe(state, INPUTS, OUTPUTS, clock=clock)
    caplog.set_level(logging.WARNING, logger="sidecar.kafka")
    everything = dict.fromkeys(INPUTS + OUTPUTS, 3)
    probe.check_outputs(everything)
    assert state.outputs_missing == {}
    gone = {t: n for t, n in everything.items() if t != "rag.verdicts"}
    probe.check_outputs(gone)
    assert state.outputs_missing == {"rag.verdicts": clock.now}
    clock.now += 2.0
    probe.check_outputs(gone)  # the clock runs from the first time it was missed
    assert state.outputs_missing == {"rag.verdicts": clock.now - 2.0}
    assert (state.live, state.fatal) == (True, None)
    clock.now += state.missing_topic_fatal_s
    probe.check_outputs(gone)
    probe.check_outputs(gone)
    assert (state.live, state.publishing) == (False, False)
    assert state.fatal is not None and "rag.verdicts" in state.fatal
    fatal = [r.getMessage() for r in caplog.records if "FATAL" in r.getMessage()]
    assert len(fatal) == 1 and "rag.verdicts" in fatal[0]
    gone_lines = [r for r in caplog.records if "no longer exists" in r.getMessage()]
    assert len(gone_lines) == 1  # once, not on every probe
    probe.check_outputs(everything)
    assert state.outputs_missing == {}


def test_a_missing_output_topic_is_fatal_when_liveness_is_read_past_its_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Between two probes: checked only when a probe found the topic missing, the deadline
    passed unseen until the next one (2 s apart, plus the metadata round trip), and a
    topic missing for 15 s made the loop not live 16.6-17.1 s after the probe found it."""
    state = LoopState()
    probe = BrokerProbe(state, INPUTS, OUTPUTS)
    caplog.set_level(logging.WARNING, logger="sidecar.kafka")
    probe.check_outputs(dict.fromkeys(INPUTS + OUTPUTS, 3))
    probe.check_outputs(dict.fromkeys(INPUTS, 3))
    assert (state.live, state.fatal) == (True, None)
    for topic in state.outputs_missing:  # found missing that long ago; no probe since
        state.outputs_missing[topic] -= state.missing_topic_fatal_s
    sidecar = _Started(Settings.load(http={"enabled": False}))
    sidecar.service = SimpleNamespace(state=state)  # type: ignore[assignment]
    assert sidecar.liveness()["no_fatal_publish_error"] is False  # what /livez answers
    assert state.live is False
    assert state.fatal is not None and "rag.verdicts" in state.fatal
    fatal = [r.getMessage() for r in caplog.records if "FATAL" in r.getMessage()]
    assert len(fatal) == 1  # read twice, logged once


def test_a_missing_output_topic_makes_publishing_false_after_the_stall_time() -> None:
    state = LoopState(publish_stall_s=0.2)
    probe = BrokerProbe(state, INPUTS, OUTPUTS)
    probe.check_outputs(dict.fromkeys(INPUTS + OUTPUTS, 1))
    probe.check_outputs(dict.fromkeys(INPUTS, 1))
    assert state.publishing  # a topic re-created a moment later costs nothing
    state.outputs_missing = {t: since - 0.3 for t, since in state.outputs_missing.items()}
    assert (state.publishing, state.live) == (False, True)


def test_an_output_topic_never_seen_is_left_to_the_publishes() -> None:
    """A topic created after the sidecar started (or one nothing is published to yet) is
    not a failure until a publish to it fails."""
    state = LoopState()
    probe = BrokerProbe(state, INPUTS, OUTPUTS)
    probe.check_outputs(dict.fromkeys(INPUTS, 1))
    assert state.outputs_missing == {} and state.publishing


class FakeClient:
    """The part of ``AIOKafkaClient`` the throttle wraps: each call is one metadata request."""

    def __init__(self) -> None:
        self.requests = 0

    def force_metadata_update(self) -> asyncio.Future[Any]:
        self.requests += 1
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done


async def test_metadata_refreshes_are_throttled_to_one_per_backoff() -> None:
    """aiokafka's sender asks again as soon as an answer without the topic's leader is in:
    17-20 CPU seconds in 30 s and ~2,700 log lines a second for a deleted topic."""
    client = FakeClient()
    MetadataThrottle.install(client, backoff_s=0.05)
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() - start < 0.5:  # the sender's loop: ask, wait for the answer, ask again
        assert await client.force_metadata_update() is True
    assert 5 <= client.requests <= 12  # ~0.5 s / 0.05 s, not thousands
    throttle = client.force_metadata_update
    assert isinstance(throttle, MetadataThrottle) and throttle.refreshes == client.requests


async def test_callers_within_the_backoff_share_the_next_refresh() -> None:
    client = FakeClient()
    MetadataThrottle.install(client, backoff_s=0.05)
    await client.force_metadata_update()  # the first goes at once
    waiting = [client.force_metadata_update() for _ in range(5)]
    assert client.requests == 1
    waiting[0].cancel()  # one caller giving up leaves the others their answer
    results = await asyncio.gather(*waiting[1:])
    assert results == [True] * 4 and client.requests == 2


class SlowClient:
    """A client whose refresh takes a while, and says so (``_md_update_fut``) meanwhile."""

    def __init__(self) -> None:
        self.requests = 0
        self._md_update_fut: asyncio.Future[Any] | None = None

    def force_metadata_update(self) -> asyncio.Future[Any]:
        if self._md_update_fut is None:
            self.requests += 1
            loop = asyncio.get_running_loop()
            self._md_update_fut = under_way = loop.create_future()
            loop.call_later(0.02, self._answer, under_way)
        return asyncio.shield(self._md_update_fut)

    def _answer(self, under_way: asyncio.Future[Any]) -> None:
        self._md_update_fut = None
        under_way.set_result(True)


async def test_a_call_while_a_refresh_is_under_way_shares_it_without_waiting() -> None:
    """A producer's first send to a topic asks twice at once (``add_topic``, then its wait
    for the topic's metadata): the second shares the first answer, no backoff added."""
    client = SlowClient()
    MetadataThrottle.install(client, backoff_s=10.0)
    first = client.force_metadata_update()
    second = client.force_metadata_update()
    assert list(await asyncio.wait_for(asyncio.gather(first, second), 1.0)) == [True, True]
    assert client.requests == 1
    later = client.force_metadata_update()  # none under way, within the backoff: waits
    await asyncio.sleep(0.05)
    assert not later.done() and client.requests == 1
    later.cancel()


def test_unequal_input_partition_counts_are_logged_once_per_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A topic grown alone (``kafka-topics --alter`` on one of them) is an error until the
    others follow: logged when it starts and when the counts change, not every probe (audit:
    one ERROR line every 2 s per replica for as long as it lasted)."""
    state = LoopState()
    probe = BrokerProbe(state, INPUTS, OUTPUTS)
    caplog.set_level(logging.ERROR, logger="sidecar.kafka")
    probe.check_partition_counts(dict.fromkeys(INPUTS, 3))
    for _ in range(5):
        probe.check_partition_counts({"rag.retrieval": 5, "rag.generation": 3})
    assert [state.topics_ok] == [False]  # a list: mypy would narrow the attribute for good
    probe.check_partition_counts({"rag.retrieval": 6, "rag.generation": 3})
    probe.check_partition_counts({"rag.retrieval": 6, "rag.generation": 3})
    errors = [r.getMessage() for r in caplog.records if "input topics" in r.getMessage()]
    assert len(errors) == 2, errors
    assert probe.check_partition_counts(dict.fromkeys(INPUTS, 6))  # grown together: read them
    assert state.topics_ok
    probe.check_partition_counts({"rag.retrieval": 7, "rag.generation": 6})
    errors = [r.getMessage() for r in caplog.records if "input topics" in r.getMessage()]
    assert len(errors) == 3, errors


class _Metadata:
    """A consumer whose metadata answers are scripted, one per probe."""

    def __init__(self, answers: list[dict[str, int]]) -> None:
        self.answers = answers
        self.refreshes = 0

    async def fetch_partitions(self, topics: Any) -> dict[str, int]:
        del topics
        return self.answers.pop(0)

    def refresh_metadata(self) -> None:
        self.refreshes += 1


async def test_an_input_topic_is_gone_when_two_metadata_answers_in_a_row_lack_it() -> None:
    """One answer without a topic may be a metadata glitch: forgetting a live topic's
    pending offsets would commit past requests still open (review). Deleted: seen before,
    then missing twice in a row; reported once, and read again at once when it is back."""
    both = dict.fromkeys(INPUTS, 3) | dict.fromkeys(OUTPUTS, 3)
    lacking = {t: n for t, n in both.items() if t != "rag.generation"}
    consumer = _Metadata([lacking, both, lacking, both, lacking, lacking, lacking, both])
    gone: list[set[str]] = []
    probe = BrokerProbe(LoopState(), INPUTS, OUTPUTS, on_inputs_gone=gone.append)
    for _ in range(4):  # never seen yet, then missing once at a time: nothing forgotten
        await probe.probe(consumer)  # type: ignore[arg-type]
    assert gone == []
    for _ in range(3):
        await probe.probe(consumer)  # type: ignore[arg-type]
    assert gone == [{"rag.generation"}]
    refreshes = consumer.refreshes
    await probe.probe(consumer)  # type: ignore[arg-type]
    assert consumer.refreshes == refreshes + 1  # back: the group reads it now


async def test_the_probe_loop_ends_when_cancelled_as_its_metadata_answer_arrives() -> None:
    """Python 3.11's ``asyncio.wait_for`` returns the result when its awaitable is done by the
    time the cancellation reaches it, and drops the cancellation: the probe loop went on
    probing, the ticker that cancels it in its ``finally`` waited for it for good, and a
    ticker ended by a bug never made the sidecar not live (CI: "timed out after 30s waiting
    for liveness to drop")."""
    answer: asyncio.Future[dict[str, int]] = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()

    class Consumer:
        async def fetch_partitions(self, topics: Any) -> dict[str, int]:
            asked.set()
            return await answer

    probe = BrokerProbe(LoopState(), INPUTS, OUTPUTS)
    prober = asyncio.create_task(probe.run(Consumer(), asyncio.Event()))  # type: ignore[arg-type]
    await asked.wait()
    loop = asyncio.get_running_loop()
    answer.set_result(dict.fromkeys(INPUTS + OUTPUTS, 3))
    loop.call_soon(prober.cancel)  # the answer's task completes first, in the same pass
    done, _ = await asyncio.wait({prober}, timeout=2.0)
    if not done:
        prober.cancel()
    assert done == {prober} and prober.cancelled()
