"""The claim path in a fleet: a replica killed mid-verification, and replaced (real broker).

Two ``guardrail run`` processes with the claim check on share a group over three input
partitions (odd: the round-robin split the co-partition assignor prevents) or four;
answers stream in as deltas, a claim a delta, so claim verdicts go out while answers are
still open. Once claim verdicts are flowing one replica is killed (SIGKILL: no hand-over,
its inputs uncommitted) or stopped (SIGTERM: it stops within its grace, its open
requests left to the next owner) and a fresh one is started, as Kubernetes restarts a
pod; traffic goes on throughout. Every request must get one final answer verdict
(repeats, from the killed replica's uncommitted work, carry the same idempotency key),
none ``incomplete``, nothing dead-lettered, and a claim verdict for each of its claims;
a claim verdicted twice, once by the replica that went and once by the one that took its
partition, must say the same (label, score, key): the verifier's fp32 arithmetic gives
every replica the same logits. The LLM service, iterating each request's claims with the
client's ``VerdictClient.claims`` from before it sent the request, sees each claim once.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from guardrail_client import VerdictClient
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.lab.replay import send
from tests.kafka.harness import end_offsets, read_settled, wait_until
from tests.kafka.test_scale_out import (  # noqa: F401 - fleet: a fixture
    _env,
    _settings,
    fleet,
    interleaved,
    watch,
)

pytestmark = pytest.mark.connected

CLAIMS_PER_ANSWER = 3  # one sentence a delta, each a claim (``request_records``)
# a request torn apart would be decided ``incomplete`` after this; long enough that a slow
# machine's verifier backlog (fetching paused, the join clock held) is not mistaken for one
TTL_MS = 20_000


class Outputs:
    """Final answer verdicts and claim verdicts as they come, per request."""

    def __init__(self) -> None:
        self.finals: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.claims: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        self.claim_records = 0

    def add(self, verdict: dict[str, Any], now: float) -> None:
        if verdict["event_type"] == "claim.verdict":
            self.claims[(verdict["request_id"], verdict["claim_index"])].append(verdict)
            self.claim_records += 1
        elif verdict["stage"] == "final":
            self.finals[verdict["request_id"]].append(verdict)


@pytest.mark.parametrize(
    ("partitions", "sig", "backlog"),
    [(3, signal.SIGKILL, False), (4, signal.SIGTERM, False), (3, signal.SIGKILL, True)],
    ids=["3-kill", "4-term", "3-kill-backlog"],
)
async def test_a_replica_lost_mid_verification_and_replaced_loses_no_claim(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],  # noqa: F811 - the fixture
    partitions: int,
    sig: signal.Signals,
    backlog: bool,
) -> None:
    """``backlog``: every record sent at once, so the replicas have a queue of answers to
    verify when one goes; else paced over ~10 s."""
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions)
    await create_topics(settings)
    t = settings.topics
    env = {
        **_env(settings),
        "GUARDRAIL_SIGNALS__CLAIMS": "true",
        "GUARDRAIL_JOIN__TTL_MS": str(TTL_MS),
    }
    fleet += [SidecarProcess(env, tmp_path / f"sidecar-{i}.log") for i in range(2)]
    await asyncio.gather(*(asyncio.to_thread(p.start, 120.0) for p in fleet))
    await wait_until(lambda: all(p.ready() for p in fleet), 60, "both replicas ready")

    n = 45
    ids = [f"cf-{i}" for i in range(n)]
    # each answer over the 2 steps after its retrieval: several stream at once
    records = interleaved(settings, ids, spread=(2.0, 2.0), deltas=CLAIMS_PER_ANSWER)
    out = Outputs()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, out, stop, claims=True))
    # the LLM service's side: each request's claims iterated from before it is sent, as a
    # service that streams them to its user does (the client drops repeats by their key)
    service = VerdictClient(
        settings.kafka.bootstrap_servers, verdicts_topic=t.verdicts, claims_topic=t.claims
    )
    await service.start()

    async def streamed_to_user(rid: str) -> list[int]:
        return [c.claim_index async for c in service.claims(rid, timeout=240)]

    users = {rid: asyncio.create_task(streamed_to_user(rid)) for rid in ids}
    rate = None if backlog else len(records) / 10.0
    sender = asyncio.create_task(send(settings, records, rate_per_s=rate))
    try:
        # killed while it verifies: claim verdicts are going out and answers are still open
        await wait_until(lambda: out.claim_records >= 10, 90, "claim verdicts flowing")
        before, decided_before = out.claim_records, len(out.finals)
        if backlog:
            assert decided_before < n, "every answer was decided before the kill"
        else:
            assert not sender.done(), "the traffic ended before the kill: send it slower"
        code = await asyncio.to_thread(fleet[0].signal, sig)
        assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), fleet[0].tail()
        replacement = SidecarProcess(env, tmp_path / "sidecar-replacement.log")
        fleet.append(replacement)
        await asyncio.to_thread(replacement.start, 120.0)
        assert await sender == len(records)
        await wait_until(lambda: set(out.finals) >= set(ids), 180, "a final verdict for each")
        await wait_until(
            lambda: all((rid, c) in out.claims for rid in ids for c in range(CLAIMS_PER_ANSWER)),
            30,
            "a claim verdict for every claim",
        )
        await asyncio.sleep(2.0)  # late repeats, if any
        shown = {rid: await asyncio.wait_for(task, 60) for rid, task in users.items()}
    finally:
        stop.set()
        await watcher
        for task in users.values():
            task.cancel()
        await service.stop()

    survivors = fleet[1:]
    assert all(p.ready() for p in survivors), [p.tail() for p in survivors]
    sent = await end_offsets(
        settings.kafka.bootstrap_servers, [t.retrieval, t.generation], partitions
    )
    assert sum(sent.values()) == len(records)  # nothing written into an input topic
    assert set(out.finals) == set(ids)
    incomplete = [
        rid
        for rid, vs in out.finals.items()
        if any(r["code"] == "incomplete" for v in vs for r in v["reasons"])
    ]
    assert not incomplete, incomplete
    for verdicts in out.finals.values():
        # a repeat is the same decision on the same inputs, under the same key
        assert len({v["idempotency_key"] for v in verdicts}) == 1, verdicts
        assert len({v["decision"] for v in verdicts}) == 1, verdicts
        assert {v["signals"]["claims"]["n"] for v in verdicts} == {CLAIMS_PER_ANSWER}, verdicts
    for rid in ids:
        assert {c for (r, c) in out.claims if r == rid} == set(range(CLAIMS_PER_ANSWER)), rid
        # the service's user saw each claim once, repeats or not
        assert sorted(shown[rid]) == list(range(CLAIMS_PER_ANSWER)), (rid, shown[rid])
    repeated = 0
    for claims in out.claims.values():
        if len(claims) > 1:
            repeated += 1
        same = {(c["idempotency_key"], c["label"], c["text"]) for c in claims}
        assert len(same) == 1, claims  # one verdict, however many replicas gave it
        scores = [c["score"] for c in claims if c["score"] is not None]
        assert not scores or max(scores) - min(scores) <= 1e-6, claims
    dead = await read_settled(settings.kafka.bootstrap_servers, t.dlq)
    assert not dead, [d.headers for d in dead]
    repeats = Counter(len(v) for v in out.finals.values())
    print(  # the measurement the note quotes (pytest -s)
        f"\n2 replicas x {partitions} partitions, claims on, {sig.name} + replacement: {n} "
        f"requests, final verdicts by copies {dict(repeats)}, {out.claim_records} claim "
        f"verdicts for {len(out.claims)} claims ({repeated} given twice or more, each "
        f"identical); {before} claim verdicts and {decided_before} final ones out before "
        f"the {'backlog' if backlog else 'paced traffic'}'s {sig.name}"
    )
