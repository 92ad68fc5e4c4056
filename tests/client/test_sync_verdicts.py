"""``SyncVerdictClient`` without a broker: blocking waits on callers' threads, fallbacks,
claims, stop() under waiting threads, fork. aiokafka's consumer is replaced by the fake;
records are offered to the waiter map on the client's loop thread, as its consumer would."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from guardrail_client import (
    ClientAlreadyStartedError,
    Decision,
    InvalidArgumentError,
    SyncVerdictClient,
    VerdictClient,
    VerdictTimeoutError,
)
from guardrail_client.waiters import Arrival
from tests.client.fakes import FakeConsumer
from tests.client.test_waiters import claim, verdict

BOOTSTRAP = "127.0.0.1:1"  # never dialled: the fake stands in for aiokafka


def offer(client: SyncVerdictClient, key: str, arrival: Arrival, *, claims: bool = False) -> None:
    """What the consumer task does with a record, done on the client's loop thread."""
    waiters = client._client.waiters

    async def on_loop() -> None:
        (waiters.offer_claim if claims else waiters.offer_verdict)(key, arrival)

    client._runner.call(on_loop(), 5.0)


def wait_for_waiters(client: SyncVerdictClient, n: int) -> None:
    deadline = time.monotonic() + 10
    while client._client.waiters.waiting < n:
        assert time.monotonic() < deadline, "the waits never reached the loop"
        time.sleep(0.01)


def test_a_blocking_wait_returns_the_verdict_that_comes_while_it_waits(
    fake_consumers: list[FakeConsumer],
) -> None:
    with SyncVerdictClient(BOOTSTRAP) as client, ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.verdict, "r1", 10.0)
        wait_for_waiters(client, 1)
        offer(client, "r1", verdict("r1", decision=Decision.BLOCK))
        result = waiting.result(10)
    assert result.from_sidecar and result.decision is Decision.BLOCK
    assert result.verdict is not None and result.verdict.request_id == "r1"
    assert result.waited_s < 10
    assert fake_consumers[0].stopped


def test_many_threads_wait_at_once_and_each_gets_its_own_verdict(
    fake_consumers: list[FakeConsumer],
) -> None:
    rids = [f"r{i}" for i in range(24)]
    with SyncVerdictClient(BOOTSTRAP) as client, ThreadPoolExecutor(len(rids)) as pool:
        waiting = {rid: pool.submit(client.verdict, rid, 20.0) for rid in rids}
        wait_for_waiters(client, len(rids))
        for i, rid in enumerate(reversed(rids)):
            offer(client, rid, verdict(rid, decision=(Decision.ALLOW, Decision.CAVEAT)[i % 2]))
        results = {rid: f.result(20) for rid, f in waiting.items()}
    assert all(r.from_sidecar for r in results.values())
    assert all(r.verdict is not None and r.verdict.request_id == rid for rid, r in results.items())
    assert {r.decision for r in results.values()} == {Decision.ALLOW, Decision.CAVEAT}


def test_an_expected_verdict_that_came_first_is_there_when_asked_for(
    fake_consumers: list[FakeConsumer],
) -> None:
    with SyncVerdictClient(BOOTSTRAP, recent_max_entries=1) as client:
        client.expect("mine")
        offer(client, "mine", verdict("mine"))
        for i in range(5):  # another replica's traffic turns the recent cache over
            offer(client, f"other{i}", verdict(f"other{i}"))
        assert client.verdict("mine", 1.0).from_sidecar


@pytest.mark.parametrize(
    ("on_timeout", "decision"), [("allow", Decision.ALLOW), ("block", Decision.BLOCK)]
)
def test_without_a_verdict_the_wait_ends_at_its_timeout_with_the_fallback(
    fake_consumers: list[FakeConsumer], on_timeout: str, decision: Decision
) -> None:
    with SyncVerdictClient(BOOTSTRAP, on_timeout=on_timeout) as client:  # type: ignore[arg-type]
        started = time.monotonic()
        result = client.verdict("late", 0.3)
        took = time.monotonic() - started
    assert (result.source, result.decision, result.verdict) == ("timeout", decision, None)
    assert 0.3 <= took < 5.0  # not the loop margin: the async wait's own deadline answered


def test_before_start_and_after_stop_the_answer_is_unavailable_at_once(
    fake_consumers: list[FakeConsumer],
) -> None:
    client = SyncVerdictClient(BOOTSTRAP, on_timeout="block", timeout_s=30)
    before = client.verdict("r1")
    client.expect("r1")  # nothing to announce to: no error either
    client.start()
    was_running = client.running
    client.stop()
    assert was_running and not client.running
    after = client.verdict("r1")
    assert [(r.source, r.decision, r.waited_s) for r in (before, after)] == [
        ("unavailable", Decision.BLOCK, 0.0)
    ] * 2
    raising = SyncVerdictClient(BOOTSTRAP, on_timeout="raise")
    with pytest.raises(VerdictTimeoutError) as caught:
        raising.verdict("r1")
    assert caught.value.source == "unavailable"


def test_stop_answers_the_threads_still_waiting_at_once(
    fake_consumers: list[FakeConsumer],
) -> None:
    client = SyncVerdictClient(BOOTSTRAP, timeout_s=60)
    client.start()
    with ThreadPoolExecutor(4) as pool:
        waiting = [pool.submit(client.verdict, f"r{i}") for i in range(4)]
        wait_for_waiters(client, 4)
        started = time.monotonic()
        client.stop()
        results = [f.result(10) for f in waiting]
        took = time.monotonic() - started
    assert [r.source for r in results] == ["unavailable"] * 4
    assert took < 10  # not the 60 s timeout


def test_bad_arguments_raise_on_the_callers_thread(fake_consumers: list[FakeConsumer]) -> None:
    with SyncVerdictClient(BOOTSTRAP) as client:
        for call in (
            lambda: client.verdict("bad id\n"),
            lambda: client.verdict("r1", float("nan")),
            lambda: client.verdict("r1", -1.0),
            lambda: client.expect(""),
            lambda: client.claims("r1", float("inf")),
        ):
            with pytest.raises(InvalidArgumentError):
                call()
        assert client.running  # nothing of it reached the loop


def test_claims_come_on_the_callers_thread_and_end_with_the_final_verdict(
    fake_consumers: list[FakeConsumer],
) -> None:
    with SyncVerdictClient(BOOTSTRAP) as client:
        client.expect("r1")
        for index in (0, 1):
            offer(client, "r1", claim("r1", index), claims=True)
        offer(client, "r1", verdict("r1"))
        got = list(client.claims("r1", 10.0))
        assert [c.claim_index for c in got] == [0, 1]
        assert client.verdict("r1", 1.0).from_sidecar


def test_closing_the_claims_iterator_early_ends_the_wait_on_the_loop(
    fake_consumers: list[FakeConsumer],
) -> None:
    with SyncVerdictClient(BOOTSTRAP) as client:
        offer(client, "r1", claim("r1", 0), claims=True)
        claims = client.claims("r1", 60.0)
        assert next(claims).claim_index == 0
        waiters = client._client.waiters
        assert waiters._claims  # subscribed on the loop
        claims.close()  # the caller breaks out of its loop
        deadline = time.monotonic() + 5
        while waiters._claims and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not waiters._claims, "the async iteration was left waiting for 60 s"


def test_a_second_start_raises_and_a_stopped_client_starts_again(
    fake_consumers: list[FakeConsumer],
) -> None:
    client = SyncVerdictClient(BOOTSTRAP)
    client.start()
    with pytest.raises(ClientAlreadyStartedError, match="stop"):
        client.start()
    assert len(fake_consumers) == 1
    client.stop()
    client.stop()  # a second stop() is nothing
    client.start()
    assert client.running and len(fake_consumers) == 2
    client.stop()
    assert all(c.stopped for c in fake_consumers)
    assert not [t for t in threading.enumerate() if t.name == "guardrail-verdicts-loop"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_gets_the_fallback_at_once_and_leaves_the_parents_client_alone(
    fake_consumers: list[FakeConsumer],
) -> None:
    """gunicorn ``--preload``: the child has no loop thread; a wait there must not hang."""
    client = SyncVerdictClient(BOOTSTRAP, on_timeout="block", timeout_s=30)
    client.start()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        code = 1
        try:
            result = client.verdict("r1")
            code = 0 if (result.source, result.decision) == ("unavailable", "block") else 2
            client.start()  # a worker's own client, after the fork (gunicorn post_fork)
            offer(client, "r2", verdict("r2"))
            code = code or (0 if client.verdict("r2", 5.0).from_sidecar else 4)
            client.stop()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.running and not fake_consumers[0].stopped
    offer(client, "r1", verdict("r1"))
    assert client.verdict("r1", 1.0).from_sidecar
    client.stop()


def test_the_sync_client_takes_the_async_ones_arguments() -> None:
    sync = inspect.signature(SyncVerdictClient).parameters
    native = inspect.signature(VerdictClient).parameters
    assert list(sync) == list(native)
    assert all(sync[n].annotation == native[n].annotation for n in native)
    assert all(sync[n].default == native[n].default for n in native)


def test_stop_with_the_loop_blocked_returns_and_the_client_starts_again(
    fake_consumers: list[FakeConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit: stop() blocked 20 s, raised RuntimeError (closing a running loop) and left a
    client that could not start again; expect() raised a bare TimeoutError."""
    monkeypatch.setattr("guardrail_client.sync_verdicts.LOOP_MARGIN_S", 0.5)
    client = SyncVerdictClient(BOOTSTRAP)
    client.start()
    release = threading.Event()

    async def block() -> None:
        release.wait(10)  # a blocking call on the loop: nothing else runs there

    assert client._runner.loop is not None
    asyncio.run_coroutine_threadsafe(block(), client._runner.loop)
    started = time.monotonic()
    client.expect("r1")  # gives up after the margin, quietly
    waited = client.verdict("r1", 0.1)
    client.stop()
    took = time.monotonic() - started
    release.set()
    assert waited.source == "timeout" and took < 3.0, took
    client.start()  # a fresh loop and consumer
    offer(client, "r2", verdict("r2"))
    assert client.verdict("r2", 2.0).from_sidecar
    client.stop()


def test_calls_racing_stop_and_start_answer_within_their_timeout(
    fake_consumers: list[FakeConsumer],
) -> None:
    """Audit: a call submitted while stop() ended the loop waited the whole margin (5 s)
    for 'timeout' instead of 'unavailable' at once, and expect() raised."""
    client = SyncVerdictClient(BOOTSTRAP)
    client.start()
    done = threading.Event()
    took: list[float] = []
    errors: list[BaseException] = []

    def wait_in_a_loop() -> None:
        while not done.is_set():
            started = time.monotonic()
            try:
                client.expect("r1")
                client.verdict("r1", 0.2)
            except BaseException as exc:
                errors.append(exc)
            took.append(time.monotonic() - started)

    with ThreadPoolExecutor(6) as pool:
        for _ in range(6):
            pool.submit(wait_in_a_loop)
        for _ in range(10):
            client.stop()
            client.start()
        done.set()
    client.stop()
    assert errors == []
    assert max(took) < 1.5, max(took)  # the 0.2 s timeout, never the 5 s margin
