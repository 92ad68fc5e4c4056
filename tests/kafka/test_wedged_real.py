"""A processor call that never returns, in a real ``sidecar run`` process on a real broker.

Audit: with ``Processor.on_batch`` hung for 70 s, verdicts stopped, ``/livez`` and
``/readyz`` answered 200 on all 100 probes, the lag gauge read 0 and nothing was logged;
a SIGTERM then left the process running for good (its processor thread is joined at
exit). Now the sidecar is not ready past ``processing_stall_s``, not live past
``processing_fatal_s``, says both, recovers when the call returns, and a SIGTERM
during a hang ends the process after the shutdown grace.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.verdict_client import sidecar_env
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import read_verdicts, settings_for

pytestmark = pytest.mark.connected

# the sidecar's own CLI, with Processor.on_part held while the hang file exists
HANGING_RUN = """
import os, sys, time
import sidecar.pipeline.processor as processor
served = processor.Processor.on_part
def on_part(self, items, start, now_ms, budget_ns):
    while os.path.exists(os.environ["TEST_HANG_FILE"]):
        time.sleep(0.05)
    return served(self, items, start, now_ms, budget_ns)
processor.Processor.on_part = on_part
from sidecar.cli.main import main
sys.exit(main(["run"]))
"""


def _probe(port: int, path: str) -> tuple[int, dict[str, bool]]:
    """The status and the checks of a health endpoint."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, json.loads(r.read())["checks"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["checks"]


def _until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


async def test_a_hung_processor_call_is_not_ready_then_not_live_and_sigterm_still_ends_it(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    hang = tmp_path / "hang"
    topics = {k: v for k, v in unique_topics.items() if k != "group"}
    env = {
        **sidecar_env(kafka_broker.bootstrap_servers, topics, unique_topics["group"]),
        "GUARDRAIL_HTTP__PROCESSING_STALL_S": "1",
        "GUARDRAIL_HTTP__PROCESSING_FATAL_S": "3",
        "GUARDRAIL_SHUTDOWN_GRACE_MS": "2000",
        "TEST_HANG_FILE": str(hang),
    }
    proc = SidecarProcess(env, tmp_path / "sidecar.log", argv=("-c", HANGING_RUN))
    await asyncio.to_thread(proc.start)
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
    await producer.start()

    async def publish(rid: str) -> None:
        t = settings.topics
        await producer.send_and_wait(t.retrieval, dumps(retrieval_event(rid)), key=rid.encode())
        await producer.send_and_wait(t.generation, dumps(final_event(rid)), key=rid.encode())

    try:
        hang.touch()
        await publish("held-1")
        await asyncio.to_thread(
            _until, lambda: _probe(proc.port, "/readyz")[1].get("processing") is False, 30,
            "not ready with processing false",
        )  # fmt: skip
        await asyncio.to_thread(
            _until, lambda: _probe(proc.port, "/livez")[1].get("processor_not_wedged") is False,
            30, "not live with processor_not_wedged false",
        )  # fmt: skip
        assert _probe(proc.port, "/livez")[0] == 503
        await asyncio.to_thread(
            _until, lambda: "not live, the pod restarts" in proc.tail(20_000), 10, "logged"
        )
        assert "no progress on its call for 1 s" in proc.tail(20_000)
        hang.unlink()  # the call returns: the request is decided, ready and live again
        [verdict] = await read_verdicts(settings, 1, timeout_s=60)
        assert verdict["request_id"] == "held-1"
        await asyncio.to_thread(
            _until, lambda: _probe(proc.port, "/readyz")[0] == 200, 30, "ready again"
        )
        assert _probe(proc.port, "/livez")[0] == 200
        await asyncio.to_thread(
            _until, lambda: "deciding again" in proc.tail(20_000), 10, "the recovery logged"
        )

        hang.touch()  # hung again, then SIGTERM: the grace is 2 s
        await publish("held-2")
        await asyncio.to_thread(
            _until, lambda: _probe(proc.port, "/readyz")[1].get("processing") is False, 30,
            "not ready again",
        )  # fmt: skip
        started = time.monotonic()
        code = await asyncio.to_thread(proc.signal, signal.SIGTERM, 30.0)
        took = time.monotonic() - started
    finally:
        hang.unlink(missing_ok=True)
        await producer.stop()
        if proc.pid is not None:
            proc.signal(signal.SIGKILL)
    assert code == 1, proc.tail()
    assert took < 15, took  # the 2 s grace, the clients' close: not forever
    assert "stopping took longer than the shutdown grace (2 s" in proc.tail()
