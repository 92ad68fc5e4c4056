"""Publisher and verdict client lifecycles without a broker: stop() under load, a loop that
ended, a second start(), timeouts out of range. aiokafka is replaced by the fakes."""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from guardrail_client import (
    ClientAlreadyStartedError,
    ClientBrokerError,
    ClientError,
    ClientNotStartedError,
    GuardrailPublisher,
    InvalidArgumentError,
    PublisherStats,
    SyncGuardrailPublisher,
    VerdictClient,
)
from tests.client.fakes import FakeConsumer, FakeProducer

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = "127.0.0.1:1"  # never dialled: the fakes stand in for aiokafka


def accounted(stats: PublisherStats) -> int:
    """Events whose fate the stats report."""
    return stats.delivered + stats.failed + stats.dropped


# ---------------------------------------------------------------------- stop() under load


def test_a_call_racing_sync_stop_is_refused_never_accepted_and_lost(
    fake_producers: list[FakeProducer],
) -> None:
    """A call made on another thread while stop() runs (here: while the producer closes)
    raises; before the fix it was accepted and its record reached a closed publisher."""
    pub = SyncGuardrailPublisher(BOOTSTRAP, generator_model="g")
    pub.start()
    pub.delta("r1", "before stop")
    raced: list[BaseException | None] = []

    def publish() -> None:
        try:
            pub.delta("r1", "while stopping")
            raced.append(None)
        except ClientNotStartedError as exc:
            raced.append(exc)

    async def publish_while_stopping() -> None:
        await asyncio.to_thread(publish)

    fake_producers[0].on_stop = publish_while_stopping
    pub.stop()
    assert len(raced) == 1 and isinstance(raced[0], ClientNotStartedError)
    assert pub.stats == PublisherStats(queued=1, delivered=1)
    with pytest.raises(ClientNotStartedError, match="after stop"):
        pub.delta("r1", "after stop")


def test_after_sync_stop_every_event_accepted_under_load_is_delivered_or_counted(
    fake_producers: list[FakeProducer],
) -> None:
    """Threads keep publishing while stop() runs: each call is accepted (and then delivered
    or counted) or refused, whatever the interleaving. Before the fix ~7% vanished."""
    pub = SyncGuardrailPublisher(BOOTSTRAP, generator_model="g", max_queued_events=500)
    pub.start()
    threads, per_thread = 6, 300
    accepted = [0] * threads
    warmed_up = threading.Barrier(threads + 1)

    def publish(t: int) -> None:
        n = 0
        while True:
            if n == per_thread:
                warmed_up.wait()  # stop() comes once every thread is well under way
            try:
                pub.delta(f"t{t}-r{n // 50}", "x")
            except ClientNotStartedError:
                return
            accepted[t] += 1
            n += 1

    workers = [threading.Thread(target=publish, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    warmed_up.wait()
    pub.stop()
    for w in workers:
        w.join()
    assert sum(accepted) >= threads * per_thread
    assert accounted(pub.stats) == sum(accepted)
    assert pub.stats.queued + pub.stats.dropped == sum(accepted)


async def test_a_call_while_the_async_publisher_stops_is_refused(
    fake_producers: list[FakeProducer],
) -> None:
    pub = GuardrailPublisher(BOOTSTRAP, generator_model="g")
    await pub.start()
    await pub.delta("r1", "a")

    async def publish_while_stopping() -> None:
        with pytest.raises(ClientNotStartedError):
            await pub.delta("r1", "b")

    fake_producers[0].on_stop = publish_while_stopping
    await pub.stop()
    assert pub.stats == PublisherStats(queued=1, delivered=1)


# ---------------------------------------------------------------------- a loop that ended


def test_a_publisher_whose_loop_ended_refuses_events_and_stop_counts_what_it_held(
    fake_producers: list[FakeProducer],
) -> None:
    """Started under one ``asyncio.run``: once that loop is gone its send task is gone too.
    Before the fix the next calls were queued (stats.queued grew) and never sent."""
    pub = GuardrailPublisher(BOOTSTRAP, generator_model="g")

    async def start_and_publish() -> None:
        await pub.start()
        await pub.delta("r1", "queued, then the loop ends")

    asyncio.run(start_and_publish())
    with pytest.raises(ClientNotStartedError, match="event loop it was started on is closed"):
        asyncio.run(pub.delta("r1", "after the loop ended"))
    asyncio.run(pub.stop())  # on another loop: counts what the ended one held
    assert pub.stats.queued == accounted(pub.stats) == 1  # sent before the end, or dropped

    async def restart() -> None:  # stopped, it starts again on the running loop
        async with pub:
            await pub.delta("r2", "x")

    before = pub.stats.delivered
    asyncio.run(restart())
    assert pub.stats.queued == accounted(pub.stats) == 2
    assert pub.stats.delivered == before + 1


def test_a_sync_publisher_whose_loop_thread_ended_refuses_events(
    fake_producers: list[FakeProducer],
) -> None:
    pub = SyncGuardrailPublisher(BOOTSTRAP, generator_model="g")
    pub.start()
    pub.delta("r1", "accepted while the loop ran")
    loop, thread = pub._runner.loop, pub._runner._thread
    assert loop is not None and thread is not None
    loop.call_soon_threadsafe(loop.stop)  # the loop ends under the publisher
    thread.join()
    with pytest.raises(ClientNotStartedError, match="loop thread has ended"):
        pub.delta("r1", "after the loop ended")
    pub.stop(flush_timeout_s=5.0)  # stops the publisher on this thread instead
    assert pub.stats == PublisherStats(queued=1, delivered=1)
    assert fake_producers[0].stopped and loop.is_closed()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_refuses_events_and_leaves_the_parents_publisher_alone(
    fake_producers: list[FakeProducer],
) -> None:
    """After fork() (gunicorn ``--preload``, multiprocessing) the child has no loop thread:
    its calls raise; its stop() counts and closes nothing the parent still uses."""
    pub = SyncGuardrailPublisher(BOOTSTRAP, generator_model="g")
    pub.start()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        code = 1
        try:
            pub.delta("r1", "child")
        except ClientNotStartedError as exc:
            code = 0 if "forked" in str(exc) else 2
        try:
            pub.stop()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pub.delta("r1", "parent")
    pub.stop()
    assert pub.stats == PublisherStats(queued=1, delivered=1)


# ---------------------------------------------------------------------- a second start()


async def test_a_second_start_of_the_async_publisher_raises_and_creates_no_producer(
    fake_producers: list[FakeProducer],
) -> None:
    pub = GuardrailPublisher(BOOTSTRAP, generator_model="g")
    await pub.start()
    with pytest.raises(ClientAlreadyStartedError, match="stop"):
        await pub.start()
    assert len(fake_producers) == 1
    await pub.stop()
    await pub.start()  # after stop(), a fresh start
    await pub.stop()
    assert len(fake_producers) == 2 and all(p.stopped for p in fake_producers)


def test_a_second_start_of_the_sync_publisher_raises_and_creates_no_producer(
    fake_producers: list[FakeProducer],
) -> None:
    pub = SyncGuardrailPublisher(BOOTSTRAP, generator_model="g")
    before = threading.active_count()
    pub.start()
    with pytest.raises(ClientAlreadyStartedError, match="stop"):
        pub.start()
    assert len(fake_producers) == 1
    pub.stop()
    assert fake_producers[0].stopped and threading.active_count() == before


async def test_a_second_start_of_the_verdict_client_raises_and_creates_no_consumer(
    fake_consumers: list[FakeConsumer],
) -> None:
    client = VerdictClient(BOOTSTRAP)
    await client.start()
    with pytest.raises(ClientAlreadyStartedError, match="stop"):
        await client.start()
    assert len(fake_consumers) == 1
    await client.stop()
    assert fake_consumers[0].stopped


async def test_a_consumer_that_fails_wakes_its_callers_logs_and_can_be_restarted(
    fake_consumers: list[FakeConsumer], caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected error out of getmany() (aiokafka's UnicodeDecodeError on a header name
    that is not UTF-8 was one) ended the task silently: waiting callers fell back only at
    their timeout, stop() re-raised the error and left the consumer open, start() refused."""
    client = VerdictClient(BOOTSTRAP, timeout_s=30.0)
    await client.start()
    waiting = asyncio.create_task(client.verdict("r1"))
    await asyncio.sleep(0.05)

    async def poisoned(timeout_ms: int = 0) -> dict[Any, list[Any]]:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    fake_consumers[0].getmany = poisoned  # type: ignore[method-assign]
    result = await asyncio.wait_for(waiting, 5.0)
    assert result.source == "unavailable" and result.waited_s < 5.0
    assert "verdict consumer stopped" in caplog.text
    assert (await client.verdict("r2")).source == "unavailable"  # at once, not at a timeout
    await client.stop()  # does not raise
    assert fake_consumers[0].stopped
    await client.start()  # and it can start again
    assert client.running
    await client.stop()


async def test_a_caller_cancelled_as_its_verdict_arrives_is_cancelled(
    fake_consumers: list[FakeConsumer],
) -> None:
    """Python 3.11's ``asyncio.wait_for`` returned the verdict and dropped the caller's
    cancellation when both came in the same pass of the loop: a web handler cancelled (its
    client gone, a deadline) went on as if it had not been."""
    client = VerdictClient(BOOTSTRAP, timeout_s=30.0)
    await client.start()
    waiting = asyncio.create_task(client.verdict("r1"))
    await asyncio.sleep(0.05)
    [(future, _)] = client.waiters._verdicts["r1"]
    event = SimpleNamespace(decision="allow")
    future.set_result(SimpleNamespace(event=event, timestamp_ms=0))  # type: ignore[arg-type]
    asyncio.get_running_loop().call_soon(waiting.cancel)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 2.0)
    assert waiting.cancelled()
    await client.stop()


async def test_stop_ends_a_waiting_claims_iterator_at_once(
    fake_consumers: list[FakeConsumer],
) -> None:
    client = VerdictClient(BOOTSTRAP, timeout_s=30.0)
    await client.start()

    async def drain() -> int:
        return len([c async for c in client.claims("r1")])

    task = asyncio.create_task(drain())
    await asyncio.sleep(0.05)
    await client.stop()
    assert await asyncio.wait_for(task, 2.0) == 0


# ---------------------------------------------------------------------- timeouts


BAD_TIMEOUTS = [math.nan, math.inf, -math.inf, -0.5, "1"]


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS)
async def test_verdict_and_claims_refuse_a_timeout_out_of_range(timeout: Any) -> None:
    """Before the fix ``nan`` timed out after an arbitrary 0.2-0.4 s, ``inf`` never did and
    a negative one fell back at once: none of them said the argument was wrong."""
    client = VerdictClient(BOOTSTRAP, on_timeout="block")
    with pytest.raises(InvalidArgumentError, match=r"timeout must be a finite .* >= 0"):
        await client.verdict("r1", timeout=timeout)
    with pytest.raises(InvalidArgumentError, match=r"timeout must be a finite .* >= 0"):
        [c async for c in client.claims("r1", timeout=timeout)]
    assert (await client.verdict("r1", timeout=0)).source == "unavailable"  # 0 is allowed


@pytest.mark.parametrize("timeout", [*BAD_TIMEOUTS, 0.0])
def test_constructor_timeouts_out_of_range_raise_a_value_error(timeout: Any) -> None:
    with pytest.raises(ValueError, match=r"timeout_s must be a finite number of seconds > 0"):
        VerdictClient(BOOTSTRAP, timeout_s=timeout)


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS)
async def test_publisher_flush_and_stop_refuse_a_timeout_out_of_range(
    fake_producers: list[FakeProducer], timeout: Any
) -> None:
    pub = GuardrailPublisher(BOOTSTRAP, generator_model="g")
    async with pub:
        with pytest.raises(InvalidArgumentError, match="timeout_s must be a finite"):
            await pub.flush(timeout)
        with pytest.raises(InvalidArgumentError, match="flush_timeout_s must be a finite"):
            await pub.stop(timeout)
    sync = SyncGuardrailPublisher(BOOTSTRAP, generator_model="g")
    with pytest.raises(InvalidArgumentError, match="timeout_s must be a finite"):
        sync.start(timeout)


async def test_stop_returns_when_the_kafka_client_raises_cancelled_error_as_it_stops(
    fake_consumers: list[FakeConsumer],
) -> None:
    """Audit: with the broker gone, aiokafka's fetcher cancels its fetch tasks and awaits
    them inside ``consumer.stop()``: ``CancelledError`` came out of ``VerdictClient.stop()``
    (``asyncio.run`` ended with it, and the publisher's stop after it never ran)."""
    client = VerdictClient(BOOTSTRAP)
    await client.start()
    real_stop = fake_consumers[0].stop

    async def cancelled_inside() -> None:
        await real_stop()
        raise asyncio.CancelledError

    fake_consumers[0].stop = cancelled_inside  # type: ignore[method-assign]
    await client.stop()  # returns
    assert fake_consumers[0].stopped and not client.running
    # a cancellation aimed at the caller still goes through
    await client.start()
    gate = asyncio.Event()

    async def slow_stop() -> None:
        await gate.wait()

    fake_consumers[1].stop = slow_stop  # type: ignore[method-assign]
    stopping = asyncio.create_task(client.stop())
    await asyncio.sleep(0.01)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping


@pytest.mark.parametrize("request_id", ["réq-1", "req 1", "req/1", "", "x" * 129, "..", None])
async def test_verdict_calls_refuse_a_request_id_no_event_can_carry(request_id: Any) -> None:
    """Audit: ``verdict("réq-1")`` waited its whole timeout and fell back, although no event
    with that id can be published (the builder refuses it)."""
    client = VerdictClient(BOOTSTRAP)
    with pytest.raises(InvalidArgumentError, match="request_id must be 1 to 128 characters"):
        client.expect(request_id)
    with pytest.raises(InvalidArgumentError, match="request_id must be"):
        await client.verdict(request_id, timeout=0)
    with pytest.raises(InvalidArgumentError, match="request_id must be"):
        [c async for c in client.claims(request_id, timeout=0)]


# ---------------------------------------------------------------------- drops, options, exit


async def test_a_burst_past_the_queue_drops_whole_requests(
    fake_producers: list[FakeProducer],
) -> None:
    """Audit: 1,000 requests of 14 events at once through a 10,000-event queue dropped
    23 % of the events one here and one there: 964 requests lost an event and timed out,
    none of them told. Now every request either gets all its events sent or is reported
    by ``was_dropped``, and some finish: the newer half of the requests under way gives
    up at each step the queue climbs past 80 %."""
    publisher = GuardrailPublisher(BOOTSTRAP, generator_model="g", max_queued_events=500)
    await publisher.start()
    send = fake_producers[0].send

    async def slow(*args: Any, **kwargs: Any) -> asyncio.Future[None]:
        await asyncio.sleep(0)  # Kafka slower than the burst: ~1 record a loop turn
        return await send(*args, **kwargs)

    fake_producers[0].send = slow  # type: ignore[method-assign]
    ids = [f"r{i}" for i in range(100)]
    hit = {"chunk_id": "c", "doc_id": "d", "score": 0.5, "text": "t"}

    async def turns(n: int) -> None:  # the service's own work between two rounds of tokens
        for _ in range(n):
            await asyncio.sleep(0)

    rng = random.Random(0)
    for rid in ids:
        await publisher.retrieval(rid, "q", [hit], tenant="t", collection="c")
    for piece in range(12):  # interleaved streams, in no fixed order, as concurrent ones
        await turns(15)
        for rid in rng.sample(ids, len(ids)):
            await publisher.delta(rid, f"{piece} ")
    await turns(15)
    for rid in rng.sample(ids, len(ids)):
        await publisher.final(rid, "".join(f"{p} " for p in range(12)))
    await publisher.stop()
    sent: dict[str, int] = {}
    for _, value in fake_producers[0].sent:
        rid = orjson.loads(value)["request_id"]
        sent[rid] = sent.get(rid, 0) + 1
    whole = {rid for rid in ids if sent.get(rid) == 14}
    dropped = {rid for rid in ids if publisher.was_dropped(rid)}
    assert whole and dropped and whole | dropped == set(ids) and not whole & dropped
    assert publisher.stats.delivered == sum(sent.values())


def test_an_option_aiokafka_does_not_take_is_refused_at_construction() -> None:
    """Audit: ``max_queue_events=5`` passed the constructor and failed at ``start()`` with
    a ``TypeError`` from aiokafka."""
    with pytest.raises(InvalidArgumentError, match="did you mean 'max_queued_events'"):
        GuardrailPublisher(BOOTSTRAP, generator_model="g", max_queue_events=5)
    with pytest.raises(InvalidArgumentError, match="did you mean 'recent_ttl_s'"):
        VerdictClient(BOOTSTRAP, recent_ttl=5)
    with pytest.raises(InvalidArgumentError, match="did you mean 'compression_type'"):
        SyncGuardrailPublisher(BOOTSTRAP, generator_model="g", compresion_type="gzip")
    GuardrailPublisher(BOOTSTRAP, generator_model="g", compression_type="gzip")
    VerdictClient(BOOTSTRAP, security_protocol="SSL")


def test_the_sync_publisher_takes_the_async_ones_arguments() -> None:
    """It took ``**options: Any``: mypy passed a missing ``generator_model`` and a typo."""
    sync = inspect.signature(SyncGuardrailPublisher).parameters
    native = inspect.signature(GuardrailPublisher).parameters
    assert list(sync) == list(native)
    assert all(sync[n].annotation == native[n].annotation for n in native)
    assert all(sync[n].default == native[n].default for n in native)


def test_a_sync_publisher_left_running_at_exit_delivers_what_it_accepted(tmp_path: Path) -> None:
    """Audit: 200 accepted events, the process exited without ``stop()`` (a worker recycled):
    none reached Kafka, and nothing was logged."""
    script = tmp_path / "exits.py"
    sent = tmp_path / "sent.txt"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, logging
            import guardrail_client.publisher as publisher
            from tests.client.fakes import FakeProducer

            class Slow(FakeProducer):
                async def send(self, topic, value, key=None, headers=None):
                    await asyncio.sleep(0.001)  # still sending when the process exits
                    with open({str(sent)!r}, "a") as out:
                        out.write("x")
                    return await super().send(topic, value, key, headers)

            publisher.AIOKafkaProducer = Slow
            logging.basicConfig(level=logging.WARNING)
            from guardrail_client import SyncGuardrailPublisher
            pub = SyncGuardrailPublisher("127.0.0.1:1", generator_model="g")
            pub.start()
            for i in range(200):
                pub.final(f"r{{i}}", "answer")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert len(sent.read_text()) == 200
    assert "was not stopped before the process exits" in done.stderr
    assert "at exit: 200 events delivered, 0 failed, 0 dropped" in done.stderr


async def test_a_publisher_says_at_start_which_topics_are_missing_and_closes_its_producer(
    fake_producers: list[FakeProducer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit: with no ``rag.retrieval`` the publisher accepted every call, aiokafka logged
    ``not found in cluster metadata`` 10 times a second, and ``stop()`` counted the events
    dropped; nothing said the topic was missing. A bad address left the producer open."""
    made = FakeProducer()
    made.client.topics = {"rag.generation"}
    monkeypatch.setattr("guardrail_client.publisher.AIOKafkaProducer", lambda **_: made)
    publisher = GuardrailPublisher(BOOTSTRAP, generator_model="g")
    with pytest.raises(ClientBrokerError, match=r"\['rag.retrieval'\] do not exist") as info:
        await publisher.start()
    assert "guardrail topics create" in str(info.value) and isinstance(info.value, ClientError)
    assert made.stopped
    broken = FakeProducer()

    async def bad_address() -> None:
        raise ValueError("invalid literal for int() with base 10: '39092x'")

    broken.start = bad_address  # type: ignore[method-assign]
    monkeypatch.setattr("guardrail_client.publisher.AIOKafkaProducer", lambda **_: broken)
    with pytest.raises(ValueError, match="39092x"):
        await publisher.start()
    assert broken.stopped


async def test_stops_warning_counts_every_event_it_dropped(
    fake_producers: list[FakeProducer], caplog: pytest.LogCaptureFixture
) -> None:
    """Audit: the warning said 2 queued events were dropped while ``stats.dropped`` was 3
    (the one the send task held was counted when it was cancelled)."""
    publisher = GuardrailPublisher(BOOTSTRAP, generator_model="g")
    await publisher.start()
    stuck = asyncio.Event()

    async def never(*args: Any, **kwargs: Any) -> asyncio.Future[None]:
        await stuck.wait()  # Kafka never answers
        raise AssertionError("unreachable")

    fake_producers[0].send = never  # type: ignore[method-assign]
    for i in range(3):
        await publisher.final(f"r{i}", "answer")
    await asyncio.sleep(0.01)  # the send task takes the first one
    await publisher.stop(flush_timeout_s=0.05)
    assert publisher.stats.dropped == 3
    assert "stop(): 3 queued events counted as dropped" in caplog.text
