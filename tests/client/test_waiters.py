"""The waiter map without Kafka: early verdicts, stream verdicts, foreign and broken records."""

from __future__ import annotations

import asyncio
import tracemalloc
from datetime import UTC, datetime

import pytest

from guardrail_client.waiters import Arrival, ClaimItem, Received, WaiterMap
from sidecar.contracts.codec import encode
from sidecar.contracts.events import AnswerVerdict, ClaimLabel, ClaimVerdict, Decision

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def verdict(
    rid: str,
    stage: str = "final",
    decision: Decision = Decision.ALLOW,
    tenant: str | None = None,
) -> Arrival:
    event = AnswerVerdict(
        request_id=rid,
        idempotency_key=f"{rid}-{stage}-{tenant}",
        tenant=tenant,
        decision=decision,
        reasons=[],
        stage=stage,  # type: ignore[arg-type]
        policy="p",
        produced_at=NOW,
        sidecar_version="0",
    )
    return Arrival(encode(event), 1000)


def received(item: ClaimItem) -> Received[ClaimVerdict] | Received[AnswerVerdict]:
    """A claims queue's item that is a record (not the ``Stopped`` end marker)."""
    assert isinstance(item, Received), item
    return item


def claim(rid: str, index: int, tenant: str | None = None) -> Arrival:
    event = ClaimVerdict(
        request_id=rid,
        idempotency_key=f"{rid}-{index}-{tenant}",
        tenant=tenant,
        claim_index=index,
        span=(0, 1),
        text="x",
        label=ClaimLabel.SUPPORTED,
        score=0.9,
        verifier_version="v",
        produced_at=NOW,
    )
    return Arrival(encode(event), 1000)


async def test_a_verdict_that_came_before_the_wait_is_found_in_the_recent_cache() -> None:
    waiters = WaiterMap()
    waiters.offer_verdict("r1", verdict("r1", decision=Decision.BLOCK))
    future = waiters.wait_verdict("r1")
    assert future.done() and future.result().event.decision is Decision.BLOCK
    assert waiters.decoded == 0 and waiters.skipped == 1  # nobody waited: not decoded on arrival


async def test_a_stream_verdict_does_not_wake_the_waiter_the_final_does() -> None:
    waiters = WaiterMap()
    future = waiters.wait_verdict("r1")
    waiters.offer_verdict("r1", verdict("r1", stage="stream", decision=Decision.BLOCK))
    await asyncio.sleep(0)
    assert not future.done()
    waiters.offer_verdict("r1", verdict("r1", decision=Decision.CAVEAT))
    assert (await future).event.decision is Decision.CAVEAT
    assert waiters.waiting == 0


async def test_foreign_and_broken_records_never_raise_and_foreign_ones_are_not_decoded() -> None:
    waiters = WaiterMap()
    future = waiters.wait_verdict("mine")
    waiters.offer_verdict("theirs", verdict("theirs"))
    waiters.offer_verdict("mine", Arrival(b'{"not": "a verdict"}', 1))
    assert not future.done()
    assert (waiters.decoded, waiters.skipped) == (1, 1)
    waiters.offer_verdict("mine", verdict("mine"))
    assert (await future).event.request_id == "mine"


async def test_claims_arrive_in_order_early_ones_replayed_then_the_final_verdict() -> None:
    waiters = WaiterMap()
    waiters.offer_claim("r1", claim("r1", 0))
    queue = waiters.subscribe_claims("r1")
    waiters.offer_claim("r1", claim("r1", 1))
    waiters.offer_claim("r2", claim("r2", 0))
    waiters.offer_verdict("r1", verdict("r1"))
    items = [received(queue.get_nowait()).event for _ in range(queue.qsize())]
    assert [type(e).__name__ for e in items] == ["ClaimVerdict", "ClaimVerdict", "AnswerVerdict"]
    assert [e.claim_index for e in items if isinstance(e, ClaimVerdict)] == [0, 1]
    waiters.unsubscribe_claims("r1", queue)
    assert waiters.waiting == 0


async def test_the_recent_cache_is_bounded_by_count_and_age() -> None:
    now = [0.0]
    waiters = WaiterMap(recent_max_entries=2, recent_ttl_s=10.0, clock=lambda: now[0])
    for rid in ("a", "b", "c"):
        waiters.offer_verdict(rid, verdict(rid))
    assert not waiters.wait_verdict("a").done()  # pushed out by count
    assert waiters.wait_verdict("c").done()
    now[0] = 11.0
    assert not waiters.wait_verdict("c").done()  # too old


async def test_a_verdict_another_tenant_provoked_under_my_request_id_is_ignored() -> None:
    """Header tenancy scopes request ids by tenant, outputs are keyed by request id: the
    planted BLOCK of tenant "evil" must not reach acme's waiter, before or after it waits."""
    waiters = WaiterMap()
    waiters.offer_verdict("r1", verdict("r1", decision=Decision.CAVEAT, tenant="acme"))
    waiters.offer_verdict("r1", verdict("r1", decision=Decision.BLOCK, tenant="evil"))
    early = waiters.wait_verdict("r1", tenant="acme")  # both already came, evil's last
    assert early.done() and early.result().event.decision is Decision.CAVEAT
    assert waiters.wait_verdict("r1").result().event.tenant == "evil"  # no tenant: the latest

    later = waiters.wait_verdict("r2", tenant="acme")
    claims = waiters.subscribe_claims("r2", tenant="acme")
    waiters.offer_verdict("r2", verdict("r2", decision=Decision.BLOCK, tenant="evil"))
    waiters.offer_claim("r2", claim("r2", 0, tenant="evil"))
    await asyncio.sleep(0)
    assert not later.done() and claims.empty()
    waiters.offer_claim("r2", claim("r2", 0, tenant="acme"))
    waiters.offer_verdict("r2", verdict("r2", decision=Decision.ALLOW, tenant="acme"))
    assert (await later).event.decision is Decision.ALLOW
    first, last = received(claims.get_nowait()), received(claims.get_nowait())
    assert (first.event.tenant, last.event.tenant) == ("acme", "acme")
    assert claims.empty()
    # a verdict that names no tenant (an older sidecar) is taken as it always was
    unnamed = waiters.wait_verdict("r3", tenant="acme")
    waiters.offer_verdict("r3", verdict("r3"))
    assert (await unnamed).event.tenant is None


async def test_a_flood_of_records_under_one_key_keeps_a_bounded_cache() -> None:
    waiters = WaiterMap()
    for i in range(5000):
        waiters.offer_claim("r1", claim("r1", i))
        waiters.offer_verdict("r1", verdict("r1", tenant=f"t{i}"))
    queue = waiters.subscribe_claims("r1")
    assert queue.qsize() == 1024 + 1  # the newest claims, then the final verdict
    assert waiters.wait_verdict("r1", tenant="t0").done() is False  # forgotten, not kept


async def test_closing_wakes_every_verdict_waiter_at_once() -> None:
    """VerdictClient.stop() closes the map: a caller still waiting gets its fallback now,
    not when its timeout runs out."""
    from guardrail_client.waiters import ClientStopped

    waiters = WaiterMap()
    futures = [waiters.wait_verdict("r1"), waiters.wait_verdict("r2", tenant="acme")]
    waiters.close()
    for future in futures:
        with pytest.raises(ClientStopped):
            await future
    assert waiters.waiting == 0


async def test_over_the_byte_bound_the_oldest_records_go_first_across_both_topics() -> None:
    size = len(claim("r1", 0).value)
    bound = 15 * (size + 96) + 2 * 768  # 15 claims under 2 keys
    waiters = WaiterMap(recent_max_bytes=bound)
    waiters.offer_verdict("old", verdict("old"))
    for rid in ("r1", "r2"):
        for i in range(10):
            waiters.offer_claim(rid, claim(rid, i))
    assert waiters.recent_bytes <= bound
    assert not waiters.wait_verdict("old").done()  # the oldest record went first
    kept = waiters.subscribe_claims("r1")  # then r1's oldest claims: its newest 5 stay
    events = [received(kept.get_nowait()).event for _ in range(kept.qsize())]
    assert [e.claim_index for e in events if isinstance(e, ClaimVerdict)] == [5, 6, 7, 8, 9]
    assert waiters.subscribe_claims("r2").qsize() == 10  # the newest key is whole


async def test_a_flood_of_keys_keeps_the_recent_cache_within_its_byte_bound() -> None:
    """3,000 keys x 30 claims held ~41 MB before the bound (the count bounds allow 10,000
    keys); now what the cache counts stays under ``recent_max_bytes``, the newest kept."""
    values = [claim("r2999", i).value for i in range(30)]  # only r2999's are decoded
    waiters = WaiterMap(recent_max_bytes=1_000_000)
    for k in range(3_000):
        for i in range(30):
            waiters.offer_claim(f"r{k}", Arrival(values[i], 1000))
        assert waiters.recent_bytes <= 1_000_000
    newest = waiters.subscribe_claims("r2999")
    assert newest.qsize() == 30
    assert waiters.subscribe_claims("r0").empty()


def test_the_byte_bound_is_close_to_the_memory_the_cache_really_holds() -> None:
    """The count is of value bytes plus an estimate of the bookkeeping: measured, the
    cache holds no more than the bound (plus a margin for the estimate)."""
    values = [claim("r", i).value for i in range(30)]
    bound = 2_000_000
    tracemalloc.start()
    try:
        waiters = WaiterMap(recent_max_bytes=bound)
        before = tracemalloc.get_traced_memory()[0]
        for k in range(1_000):
            for i in range(30):  # a copy per record, as records consumed from Kafka are
                waiters.offer_claim(f"r{k}", Arrival(bytes(bytearray(values[i])), 1000))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert waiters.recent_bytes <= bound
    assert held <= 1.2 * bound  # 1,000 keys x 30 claims unbounded: ~14 MB


def test_the_byte_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="recent_max_bytes must be >= 1"):
        WaiterMap(recent_max_bytes=0)


async def test_a_record_whose_request_id_is_not_its_key_wakes_no_one() -> None:
    """A replay tool or producer that keys a verdict wrongly must not answer another request."""
    waiters = WaiterMap()
    future = waiters.wait_verdict("mine")
    waiters.offer_verdict("mine", verdict("someone-else"))
    assert not future.done()
    waiters.offer_verdict("mine", verdict("mine"))
    assert future.done() and future.result().event.request_id == "mine"


async def test_closing_ends_every_claims_queue_and_a_flood_keeps_it_bounded() -> None:
    from guardrail_client.waiters import CLAIMS_QUEUE_MAX, Stopped

    waiters = WaiterMap()
    queue = waiters.subscribe_claims("r")
    for i in range(CLAIMS_QUEUE_MAX + 500):
        waiters.offer_claim("r", claim("r", i))
    assert queue.qsize() <= CLAIMS_QUEUE_MAX + 2
    other = waiters.subscribe_claims("s")
    waiters.close()
    assert isinstance(other.get_nowait(), Stopped)


async def test_an_announced_request_outlives_the_fleets_traffic_through_the_recent_cache() -> None:
    """Every replica's client reads the whole verdict topic: with 10,000 keys per topic,
    a verdict that beat its caller was gone after 10,000 verdicts of other replicas
    (2 s of a 5,000 answers/s fleet). An announced request's records are kept apart."""
    now = [0.0]
    waiters = WaiterMap(recent_max_entries=100, recent_ttl_s=60.0, clock=lambda: now[0])
    waiters.expect("mine")
    waiters.offer_claim("mine", claim("mine", 0))
    waiters.offer_verdict("mine", verdict("mine", decision=Decision.BLOCK))
    for i in range(1_000):  # the fleet's traffic
        waiters.offer_verdict(f"other-{i}", verdict(f"other-{i}"))
        waiters.offer_claim(f"other-{i}", claim(f"other-{i}", 0))
    assert not waiters.wait_verdict("other-0").done()  # the recent cache turned over
    now[0] = 59.0
    future = waiters.wait_verdict("mine")
    assert future.done() and future.result().event.decision is Decision.BLOCK
    queue = waiters.subscribe_claims("mine")
    items = [received(queue.get_nowait()).event for _ in range(queue.qsize())]
    assert [type(e).__name__ for e in items] == ["ClaimVerdict", "AnswerVerdict"]
    now[0] = 61.0  # recent_ttl_s after the announcement: forgotten
    assert not waiters.wait_verdict("mine").done()
    assert waiters.expected == 0 and waiters.kept_bytes == 0


async def test_announced_late_what_came_already_moves_over() -> None:
    waiters = WaiterMap(recent_max_entries=10)
    waiters.offer_verdict("mine", verdict("mine", decision=Decision.CAVEAT))
    waiters.expect("mine")
    for i in range(50):
        waiters.offer_verdict(f"other-{i}", verdict(f"other-{i}"))
    future = waiters.wait_verdict("mine")
    assert future.done() and future.result().event.decision is Decision.CAVEAT


async def test_announcements_are_bounded_by_count_and_their_records_by_bytes() -> None:
    waiters = WaiterMap(expected_max_entries=3, recent_max_bytes=20_000)
    for i in range(5):
        waiters.expect(f"r{i}")
    assert waiters.expected == 3 and waiters.expectations_dropped == 2
    for _ in range(200):  # a flood under an announced id: its own byte bound holds
        waiters.offer_claim("r4", claim("r4", 0))
        assert waiters.kept_bytes <= 20_000
    waiters.offer_verdict("r4", verdict("r4", decision=Decision.BLOCK))
    assert waiters.wait_verdict("r4").result().event.decision is Decision.BLOCK


def test_the_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="expected_max_entries must be an int >= 1"):
        WaiterMap(expected_max_entries=0)
    with pytest.raises(ValueError, match="recent_max_entries must be an int >= 1"):
        WaiterMap(recent_max_entries=True)


async def test_announcing_an_answered_id_again_drops_its_old_verdict() -> None:
    """Audit: an id reused for a second answer got the first answer's verdict back at once,
    as ``source="sidecar"`` (the sidecar dead-letters the second one's events)."""
    waiters = WaiterMap()
    waiters.expect("dup")
    waiters.offer_verdict("dup", verdict("dup", decision=Decision.ALLOW))
    assert waiters.wait_verdict("dup").done()
    waiters.expect("dup")  # announced again, but nobody got its verdict yet: kept
    assert waiters.wait_verdict("dup").done()
    waiters.answered("dup")  # a caller got it
    waiters.expect("dup")  # a new request under the same id
    assert not waiters.wait_verdict("dup").done()
    waiters.offer_verdict("dup", verdict("dup", decision=Decision.BLOCK))  # its own, later
    assert waiters.wait_verdict("dup").result().event.decision is Decision.BLOCK
