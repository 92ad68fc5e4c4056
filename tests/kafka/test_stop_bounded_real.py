"""A SIGTERM ends a real ``sidecar run`` process within its shutdown grace, whatever the
broker or the processor does meanwhile.

The kubelet SIGKILLs after ``terminationGracePeriodSeconds``: a stop that outlasts it
loses the final commit and its handover without a word. Each scenario starts the sidecar
as its own process on its own broker (this module's: it is frozen and killed here),
under traffic, then makes the broker or the processor fail as it does in production and
sends SIGTERM: the process ends within ``GUARDRAIL_SHUTDOWN_GRACE_MS`` plus
:data:`MARGIN_S` (telemetry's last export gets at least 0.5 s, then the clients'
teardown), with exit code 1 and one line saying what it could not finish.

Audit: with a processor call of a tick hung (a stuck claim check at a request's TTL)
and no batch in hand, ``stop()`` committed, then joined the processor thread on the
event loop (``ThreadPoolExecutor.shutdown(wait=True)``): the grace's timer never fired,
and the process was still running 90 s after SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from bench.verdict_client import sidecar_env
from sidecar.config import Settings
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from tests.conftest import EventFactory, dumps, kafka_lib
from tests.kafka.harness import read_verdicts, settings_for

pytestmark = pytest.mark.connected

GRACE_MS = 3000
# past the grace: telemetry's last export (at least 0.5 s, runtime.MIN_TELEMETRY_STOP_S),
# the health server, the tasks asyncio.run cancels, on a loaded 2-core machine
MARGIN_S = 3.0

# the sidecar's own CLI, with Processor.on_tick held while the hang file exists
HANGING_TICK_RUN = """
import os, sys, time
import sidecar.pipeline.processor as processor
served = processor.Processor.on_tick
def on_tick(self, *args, **kwargs):
    while os.path.exists(os.environ["TEST_HANG_FILE"]):
        time.sleep(0.05)
    return served(self, *args, **kwargs)
processor.Processor.on_tick = on_tick
from sidecar.cli.main import main
sys.exit(main(["run"]))
"""

# the sidecar's own CLI, its start held before the output topics' limits are read until the
# go file exists (the test freezes the broker meanwhile)
HELD_START_RUN = """
import asyncio, os, sys
import sidecar.kafka.publish as publish
served = publish.Publisher.read_topic_limits
async def read_topic_limits(self):
    hook = os.environ["TEST_HOOK"]
    open(hook + ".at", "w").close()
    while not os.path.exists(hook + ".go"):
        await asyncio.sleep(0.05)
    return await served(self)
publish.Publisher.read_topic_limits = read_topic_limits
from sidecar.cli.main import main
sys.exit(main(["run"]))
"""


def _thaw(broker: LocalKafka) -> None:
    """SIGCONT to the broker a test may have frozen (a stopped one is left alone)."""
    pid = broker.pid()
    if pid is not None:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A broker for this module alone: its tests freeze it and kill it."""
    instance = tmp_path_factory.mktemp("kafka-stop")
    broker = LocalKafka(instance, kafka_lib(), port=free_port(), controller_port=free_port())
    broker.start()
    try:
        yield broker
    finally:
        _thaw(broker)
        broker.stop(kill=True)
        shutil.rmtree(instance, ignore_errors=True)


@pytest.fixture
def broker(own_broker: LocalKafka) -> Iterator[LocalKafka]:
    """The module's broker, serving (started again after a test killed it); thawed after."""
    own_broker.start()
    try:
        yield own_broker
    finally:
        _thaw(own_broker)


class Running:
    """A sidecar process, and requests sent to it until :meth:`quiet`."""

    def __init__(self, proc: SidecarProcess, settings: Settings, producer: AIOKafkaProducer):
        self.proc = proc
        self.settings = settings
        self.producer = producer
        self.sent = 0
        self._sending: asyncio.Task[None] | None = None

    def send(self, retrieval: EventFactory, final: EventFactory) -> None:
        async def traffic() -> None:
            topics = self.settings.topics
            while True:
                rid = f"r-{self.sent}"
                key = rid.encode()
                await self.producer.send(topics.retrieval, dumps(retrieval(rid)), key=key)
                await self.producer.send(topics.generation, dumps(final(rid)), key=key)
                self.sent += 1
                await asyncio.sleep(0.02)

        self._sending = asyncio.create_task(traffic())

    async def quiet(self) -> None:
        if self._sending is not None:
            self._sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sending

    async def sigterm(self) -> tuple[int, float]:
        return await sigterm(self.proc)


async def sigterm(proc: SidecarProcess) -> tuple[int, float]:
    """Exit code and seconds from SIGTERM to exit (SIGKILL and fail past 60 s)."""
    started = time.monotonic()
    try:
        code = await asyncio.to_thread(proc.signal, signal.SIGTERM, 60.0)
    except subprocess.TimeoutExpired:
        proc.signal(signal.SIGKILL)
        pytest.fail(f"still running 60 s after SIGTERM:\n{proc.tail()}")
    return code, time.monotonic() - started


@contextlib.asynccontextmanager
async def running(
    broker: LocalKafka,
    names: dict[str, str],
    tmp_path: Path,
    retrieval: EventFactory,
    final: EventFactory,
) -> AsyncIterator[Running]:
    """A sidecar process under traffic, with some verdicts out (and committed)."""
    settings = settings_for(names, broker.bootstrap_servers)
    await create_topics(settings)
    env = {
        **sidecar_env(
            broker.bootstrap_servers,
            {k: v for k, v in names.items() if k != "group"},
            names["group"],
        ),
        "GUARDRAIL_SHUTDOWN_GRACE_MS": str(GRACE_MS),
        "GUARDRAIL_HTTP__PROCESSING_STALL_S": "1",
        "TEST_HANG_FILE": str(tmp_path / "hang"),
    }
    proc = SidecarProcess(env, tmp_path / "sidecar.log", argv=("-c", HANGING_TICK_RUN))
    await asyncio.to_thread(proc.start, 90.0)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    run = Running(proc, settings, producer)
    try:
        run.send(retrieval, final)
        await read_verdicts(settings, 20, timeout_s=60)
        yield run
    finally:
        await run.quiet()
        if proc.pid is not None:
            proc.signal(signal.SIGKILL)
        pid = broker.pid()
        if pid is not None:  # its pending sends are dropped when it does not answer
            os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 10)


def _ended_within_grace(run: Running, code: int, took: float) -> str:
    """Assert the bounded stop; the line that says what was not finished."""
    log = run.proc.tail(20_000)
    assert code == 1, log
    assert took < GRACE_MS / 1000 + MARGIN_S, (took, log)
    [line] = [x for x in log.splitlines() if "stopping took longer than the shutdown grace" in x]
    assert "input record(s) not finished are left to the next owner" in line
    return line


def _freeze(broker: LocalKafka) -> None:
    """SIGSTOP: connections stay open and nothing answers (a hung broker, a partition)."""
    pid = broker.pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)


def _kill(broker: LocalKafka) -> None:
    """SIGKILL: connections refused, the group coordinator gone (the next test starts it)."""
    assert broker.stop(kill=True)


@pytest.mark.parametrize("fault", [_freeze, _kill], ids=["hung", "gone"])
async def test_sigterm_with_the_broker_hung_or_gone_ends_within_the_grace(
    broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    fault: Callable[[LocalKafka], None],
) -> None:
    async with running(broker, unique_topics, tmp_path, retrieval_event, final_event) as run:
        fault(broker)
        await asyncio.sleep(1.0)  # the verdicts and commits of the traffic now hang
        code, took = await run.sigterm()
        await run.quiet()
        line = _ended_within_grace(run, code, took)
    assert "the final commit was not confirmed" in line, line


async def test_sigterm_with_the_broker_hanging_while_it_stops_ends_within_the_grace(
    broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """The broker freezes right after SIGTERM: the stop's confirmations and final commit
    go out to a broker that answered a moment before."""
    async with running(broker, unique_topics, tmp_path, retrieval_event, final_event) as run:
        pid = broker.pid()
        assert pid is not None
        assert run.proc.proc is not None
        started = time.monotonic()
        run.proc.proc.send_signal(signal.SIGTERM)
        os.kill(pid, signal.SIGSTOP)
        try:
            code = await asyncio.to_thread(run.proc.proc.wait, 60.0)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after SIGTERM:\n{run.proc.tail()}")
        finally:
            await run.quiet()
        took = time.monotonic() - started
        log = run.proc.tail(20_000)
        if code == 0:  # it was through before the broker froze: stopped cleanly
            assert "stopped" in log, log
            assert took < GRACE_MS / 1000 + MARGIN_S, (took, log)
        else:
            _ended_within_grace(run, code, took)


async def test_sigterm_with_a_processor_call_hung_ends_within_the_grace(
    broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """A tick's call that never returns (a stuck claim check of a request at its TTL), no
    batch in hand: the final commit goes through, then the process still ends (it used to
    wait for the call on the event loop, for good)."""
    async with running(broker, unique_topics, tmp_path, retrieval_event, final_event) as run:
        await run.quiet()
        await read_verdicts(run.settings, run.sent, timeout_s=60)  # nothing left in hand
        (tmp_path / "hang").touch()
        deadline = time.monotonic() + 30
        while "no progress on its call" not in run.proc.tail(20_000):  # the tick is held
            assert time.monotonic() < deadline, run.proc.tail()
            await asyncio.sleep(0.1)
        code, took = await run.sigterm()
        line = _ended_within_grace(run, code, took)
    assert "at waiting for the processor's last calls" in line, line
    assert "the final commit was confirmed" in line, line


async def test_sigterm_while_starting_against_a_hung_broker_ends_within_the_grace(
    broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    """The broker freezes while the clients start (the output topics' limits are read, the
    producer bootstraps), and the pod is deleted: the start is cut short. It used to wait
    for each client in turn, each ``request_timeout_ms`` (59.7 s with a 4 s grace)."""
    settings = settings_for(unique_topics, broker.bootstrap_servers)
    await create_topics(settings)
    hook = tmp_path / "hook"
    env = {
        **sidecar_env(
            broker.bootstrap_servers,
            {k: v for k, v in unique_topics.items() if k != "group"},
            unique_topics["group"],
        ),
        "GUARDRAIL_SHUTDOWN_GRACE_MS": str(GRACE_MS),
        "TEST_HOOK": str(hook),
    }
    proc = SidecarProcess(env, tmp_path / "sidecar.log", argv=("-c", HELD_START_RUN))
    with proc.log.open("ab") as out:
        proc.proc = subprocess.Popen(  # not proc.start(): it waits for /readyz
            [sys.executable, *proc.argv], env=proc.env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 90
        while not Path(f"{hook}.at").exists():
            assert proc.proc.poll() is None, proc.tail()
            assert time.monotonic() < deadline, proc.tail()
            await asyncio.sleep(0.05)
        pid = broker.pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        Path(f"{hook}.go").touch()
        await asyncio.sleep(0.5)  # the limits' read is sent to the frozen broker
        code, took = await sigterm(proc)
    finally:
        if proc.pid is not None:
            proc.signal(signal.SIGKILL)
    log = proc.tail(20_000)
    assert code == 0, log
    assert took < GRACE_MS / 1000 + MARGIN_S, (took, log)
    assert "stopped while starting" in log, log
