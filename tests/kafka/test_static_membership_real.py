"""Static group membership (KIP-345) across a pod restart, for real (real broker only).

The chart's ``kafka.staticMembership`` gives each pod its name as
``GUARDRAIL_KAFKA__GROUP_INSTANCE_ID``, and the README says a restart within the session
timeout keeps the pod's partitions without a rebalance. Two sidecar processes share a
group over three partitions while an LLM service (the guardrail client) sends requests;
one is stopped (SIGTERM, as the kubelet does) and started again with the same
environment. With static ids, the other member is never reassigned and the restarted one
gets the partitions it had; the control, dynamic membership, reassigns the other member
(once or twice: the leave, the return), so the test that says static membership avoids it
can fail. Either way every
request is decided once, none ``incomplete``, and every wait ends with the sidecar's verdict.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import pytest

from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from tests.kafka.harness import wait_until
from tests.kafka.test_cluster_restarts_real import _spread, _traffic
from tests.kafka.test_scale_out import Seen, _env, _settings, fleet, watch

pytestmark = pytest.mark.connected

__all__ = ["fleet"]  # the fixture, shared with test_scale_out

SESSION_MS = 30_000  # longer than the restart takes
ASSIGNED = re.compile(r"INFO sidecar\.kafka: Consumer \S+ assigned to partitions: (.*)$", re.M)


def assignments(log: Path) -> list[set[str]]:
    """Each assignment this member logged, in order (its partitions)."""
    found = ASSIGNED.findall(log.read_text(errors="replace"))
    return [
        {f"{t}[{n}]" for t, n in re.findall(r"topic='([^']+)', partition=(\d+)", a)} for a in found
    ]


@pytest.mark.parametrize("membership", ["static", "dynamic"])
async def test_a_member_restarted_within_its_session_keeps_its_partitions_when_static(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],
    membership: str,
) -> None:
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, 3)
    await create_topics(settings)
    base = _env(settings) | {
        "GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS": str(SESSION_MS),
        "GUARDRAIL_JOIN__TTL_MS": "30000",
    }
    env = [
        base
        | ({"GUARDRAIL_KAFKA__GROUP_INSTANCE_ID": f"pod-{i}"} if membership == "static" else {})
        for i in range(2)
    ]
    logs = [tmp_path / "pod-0.log", tmp_path / "pod-1.log", tmp_path / "pod-0-again.log"]
    fleet += [SidecarProcess(env[i], logs[i]) for i in range(2)]
    await asyncio.gather(*(asyncio.to_thread(p.start) for p in fleet))
    await wait_until(lambda: all(p.ready() for p in fleet), 60, "both pods ready")

    def settled() -> bool:  # each holds its share: the last assignments split all nine
        last = [a[-1] if (a := assignments(log)) else set() for log in logs[:2]]
        return all(last) and not last[0] & last[1] and len(last[0] | last[1]) == 9

    await wait_until(settled, 30, "the group settled, each member with its share")

    ids: list[str] = []
    seen = Seen()
    done_sending, done_watching = asyncio.Event(), asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, done_watching))
    sender = asyncio.create_task(_traffic(settings, ids, done_sending))
    await asyncio.sleep(3.0)
    other_before = len(assignments(logs[1]))  # one, or two when it joined first
    stopping = time.monotonic()
    assert await asyncio.to_thread(fleet[0].signal, signal.SIGTERM) == 0, fleet[0].tail()
    restarted = SidecarProcess(env[0], logs[2])  # the same pod's environment, a new process
    fleet.append(restarted)
    await asyncio.to_thread(restarted.start)
    back_s = time.monotonic() - stopping
    await asyncio.sleep(5.0)
    done_sending.set()
    waited = await sender
    await wait_until(lambda: set(seen.count) >= set(ids), 60, "a verdict for every request")
    await asyncio.sleep(1.0)  # late repeats, if any
    done_watching.set()
    await watcher

    assert set(seen.count) == set(ids) and not seen.incomplete
    assert all(len(keys) == 1 for keys in seen.keys.values())  # repeats carry the same key
    assert all(w.from_sidecar for w in waited)
    before, other, after = (assignments(log) for log in logs)
    if membership == "static":
        assert back_s < SESSION_MS / 1000
        assert len(other) == other_before, other  # the other member was not reassigned
        assert after == [before[-1]]  # the restarted one has its partitions again
        assert seen.duplicates == 0
    else:  # the control: the leave and the return rebalance the group (once, when the
        # return comes before the other member's next heartbeat; else twice)
        assert len(other) > other_before, other
    print(  # the measurement the closing note quotes (pytest -s)
        f"\n{membership}: back in {back_s:.1f} s; the other member assigned "
        f"{len(other) - other_before} time(s) since; {len(ids)} requests, "
        f"{seen.duplicates} repeats; the client waited "
        f"{_spread(waited)}"
    )
