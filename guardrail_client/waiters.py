"""The in-memory waiter map: who in this process waits for which request's verdict and claims.

No Kafka here. The consumer hands every record to ``offer_verdict`` /
``offer_claim`` with its key; a record nobody here waits for is kept, still
undecoded, in a bounded recent cache (a verdict can arrive before its caller
starts waiting) and costs a dict lookup, not a JSON parse. The cache is bounded
by count (keys, and records per key), age and bytes (across every key of both
topics, oldest first). A request announced with :meth:`WaiterMap.expect` has its
records kept apart, out of reach of the other replicas' traffic (their own count,
age and byte bounds). Only records a
caller waits for are decoded and validated; one that breaks the contract is
logged and skipped, never raised into the consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import ValidationError

from guardrail_client.exceptions import InvalidArgumentError
from sidecar.contracts.events import AnswerVerdict, ClaimVerdict

log = logging.getLogger("guardrail_client")

T = TypeVar("T", AnswerVerdict, ClaimVerdict)

RECENT_MAX_BYTES = 64 * 1024 * 1024  # the recent cache of both topics together
EXPECTED_MAX_ENTRIES = 100_000  # requests announced with expect(), per client
# What a kept record costs beyond its value (measured with tracemalloc on CPython 3.11):
# the bytes object's header, the Arrival and its deque slot; and what a kept key costs: the
# key string, its dict entry, its (time, deque) tuple and the deque's first block.
_RECORD_OVERHEAD_BYTES = 96
_KEY_OVERHEAD_BYTES = 768


@dataclass(frozen=True, slots=True)
class Arrival:
    """A record as consumed: its value and its Kafka timestamp (ms since the epoch)."""

    value: bytes
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Received(Generic[T]):
    """A decoded output event with its record timestamp."""

    event: T
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Stopped:
    """The end marker a claims queue gets when the consumer stops (``close()``)."""


ClaimItem = Received[ClaimVerdict] | Received[AnswerVerdict] | Stopped
CLAIMS_QUEUE_MAX = 1024  # as the recent cache's claims per request: a flood costs a bounded queue
VerdictFuture = asyncio.Future[Received[AnswerVerdict]]


def _decode(model: type[T], key: str, arrival: Arrival) -> Received[T] | None:
    try:
        event = model.model_validate_json(arrival.value)
    except ValidationError as exc:
        log.warning("skipped a %s keyed %r that breaks the contract: %s", model.__name__, key, exc)
        return None
    if event.request_id != key:  # a replay tool or producer that keyed it wrongly: not ours
        log.warning(
            "skipped a %s keyed %r whose request_id is %r", model.__name__, key, event.request_id
        )
        return None
    return Received(event, arrival.timestamp_ms)


def _put(queue: asyncio.Queue[ClaimItem], key: str, item: ClaimItem) -> None:
    try:
        queue.put_nowait(item)
    except asyncio.QueueFull:
        log.warning("dropped a claim verdict for %r: its caller's queue is full (a flood)", key)


def _cost(arrival: Arrival) -> int:
    return len(arrival.value) + _RECORD_OVERHEAD_BYTES


class _ByteBudget:
    """The bytes the recent caches hold together, and their bound: over it, the oldest
    record of the cache whose least recently written key is the oldest goes first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.caches: list[_Recent] = []

    def enforce(self) -> None:
        while self.used > self.max_bytes:
            holding = [c for c in self.caches if len(c)]
            if not holding:
                return
            min(holding, key=_Recent.oldest_time).forget_oldest_record()


class _Recent:
    """Undecoded records by key, oldest forgotten first (count, age and bytes bounded).

    At most ``per_key`` records are kept per key (the newest): a flood of records under
    one key costs a bounded list, not a growing one. The ``budget`` is shared with the
    other topic's cache: a flood of keys costs bounded bytes, not only a bounded count.
    """

    def __init__(
        self,
        max_entries: int,
        ttl_s: float,
        clock: Callable[[], float],
        per_key: int,
        budget: _ByteBudget,
    ) -> None:
        self._items: OrderedDict[str, tuple[float, deque[Arrival]]] = OrderedDict()
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._per_key = per_key
        self._budget = budget
        budget.caches.append(self)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, key: str, arrival: Arrival) -> None:
        now = self._clock()
        old = self._items.pop(key, None)
        if old is None:
            kept: deque[Arrival] = deque()
            self._budget.used += _KEY_OVERHEAD_BYTES
        else:
            kept = old[1]
        kept.append(arrival)
        self._budget.used += _cost(arrival)
        if len(kept) > self._per_key:
            self._budget.used -= _cost(kept.popleft())
        self._items[key] = (now, kept)
        while self._items and (
            len(self._items) > self._max_entries or now - self.oldest_time() > self._ttl_s
        ):
            self._forget_oldest_key()
        self._budget.enforce()

    def oldest_time(self) -> float:
        """When the least recently written key was last written (the cache is not empty)."""
        return next(iter(self._items.values()))[0]

    def forget_oldest_record(self) -> None:
        key, (_, kept) = next(iter(self._items.items()))
        self._budget.used -= _cost(kept.popleft())
        if not kept:
            del self._items[key]
            self._budget.used -= _KEY_OVERHEAD_BYTES

    def _forget_oldest_key(self) -> None:
        self.discard(next(iter(self._items)))

    def get(self, key: str) -> list[Arrival]:
        item = self._items.get(key)
        if item is None or self._clock() - item[0] > self._ttl_s:
            return []
        return list(item[1])

    def discard(self, key: str) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self._budget.used -= _KEY_OVERHEAD_BYTES + sum(_cost(a) for a in item[1])


class ClientStopped(Exception):
    """The verdict consumer stopped while a caller waited."""


def _ours(event: AnswerVerdict | ClaimVerdict, tenant: str | None) -> bool:
    """Whether ``event`` may be the waiter's: no tenant asked, or none named, or the same.

    With header (or fixed) tenancy the sidecar scopes request ids by tenant, but its
    outputs are keyed by request id: another tenant can provoke a verdict under yours.
    """
    return tenant is None or event.tenant is None or event.tenant == tenant


class WaiterMap:
    """Verdict futures and claim queues by request id, plus the recent cache.

    The recent cache keeps at most ``recent_max_entries`` keys per topic (8 verdicts and
    1,024 claims each), for ``recent_ttl_s``, and ``recent_max_bytes`` for both topics
    together: record values plus an estimate of their bookkeeping, which is close to the
    memory they hold. Over a bound, the least recently written key's oldest records go.
    Every replica's client reads the whole topic, so under a busy fleet a record can
    leave that cache within seconds; the records of requests announced with
    :meth:`expect` (this replica's own) are kept apart, with the same bounds of their own
    (``expected_max_entries`` requests), for ``recent_ttl_s`` after the announcement.
    """

    def __init__(
        self,
        *,
        recent_max_entries: int = 10_000,
        recent_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        recent_max_bytes: int = RECENT_MAX_BYTES,
        expected_max_entries: int = EXPECTED_MAX_ENTRIES,
    ) -> None:
        if recent_max_bytes < 1:
            raise InvalidArgumentError(f"recent_max_bytes must be >= 1, got {recent_max_bytes}")
        for name, value in (
            ("recent_max_entries", recent_max_entries),
            ("expected_max_entries", expected_max_entries),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
        self._verdicts: dict[str, list[tuple[VerdictFuture, str | None]]] = {}
        self._claims: dict[str, list[tuple[asyncio.Queue[ClaimItem], str | None]]] = {}
        self._recent_bytes = _ByteBudget(recent_max_bytes)
        self._recent_verdicts = _Recent(
            recent_max_entries, recent_ttl_s, clock, per_key=8, budget=self._recent_bytes
        )
        self._recent_claims = _Recent(
            recent_max_entries, recent_ttl_s, clock, per_key=1024, budget=self._recent_bytes
        )
        # requests announced by expect(): when, oldest first; their records kept apart
        self._expected: OrderedDict[str, float] = OrderedDict()
        self._answered: set[str] = set()  # announced requests a caller got the verdict of
        self._expected_max = expected_max_entries
        self._ttl_s = recent_ttl_s
        self._clock = clock
        self._kept_bytes = _ByteBudget(recent_max_bytes)
        self._kept_verdicts = _Recent(
            expected_max_entries, recent_ttl_s, clock, per_key=8, budget=self._kept_bytes
        )
        self._kept_claims = _Recent(
            expected_max_entries, recent_ttl_s, clock, per_key=1024, budget=self._kept_bytes
        )
        self.expectations_dropped = 0  # announced requests forgotten early (over the count)
        self.decoded = 0  # records decoded because someone here waited for them
        self.skipped = 0  # records nobody here waited for (kept undecoded)

    @property
    def waiting(self) -> int:
        return len(self._verdicts) + len(self._claims)

    @property
    def recent_bytes(self) -> int:
        """What the recent cache holds now, as counted against ``recent_max_bytes``."""
        return self._recent_bytes.used

    @property
    def expected(self) -> int:
        """Requests announced with :meth:`expect` and not yet forgotten."""
        self._expire(self._clock())
        return len(self._expected)

    @property
    def kept_bytes(self) -> int:
        """What the announced requests' records hold now (their own ``recent_max_bytes``)."""
        return self._kept_bytes.used

    # ------------------------------------------------------------------ announcing

    def expect(self, request_id: str) -> None:
        """This replica will wait for ``request_id``: its verdicts and claims are kept
        apart from the recent cache, so other replicas' traffic cannot push them out
        before ``recent_ttl_s`` (counted from now) has passed."""
        now = self._clock()
        self._expire(now)
        if request_id in self._answered:  # announced again after its verdict: a new request
            self._release(request_id)  # under a reused id, whose old verdict must not answer it
            self._recent_verdicts.discard(request_id)
            self._recent_claims.discard(request_id)
        self._expected.pop(request_id, None)
        self._expected[request_id] = now
        for recent, kept in (
            (self._recent_verdicts, self._kept_verdicts),
            (self._recent_claims, self._kept_claims),
        ):  # announced late: what came already moves over
            for arrival in recent.get(request_id):
                kept.add(request_id, arrival)
            recent.discard(request_id)
        while len(self._expected) > self._expected_max:
            oldest, _ = self._expected.popitem(last=False)
            self._release(oldest)
            self.expectations_dropped += 1
            if self.expectations_dropped == 1 or self.expectations_dropped % 10_000 == 0:
                log.warning(
                    "%d announced request(s) forgotten before recent_ttl_s: more than "
                    "expected_max_entries=%d announced at once",
                    self.expectations_dropped, self._expected_max,
                )  # fmt: skip

    def _expecting(self, key: str) -> bool:
        if not self._expected:
            return False
        self._expire(self._clock())
        return key in self._expected

    def _expire(self, now: float) -> None:
        while self._expected:
            key, since = next(iter(self._expected.items()))
            if now - since <= self._ttl_s:
                return
            del self._expected[key]
            self._release(key)

    def _release(self, key: str) -> None:
        self._kept_verdicts.discard(key)
        self._kept_claims.discard(key)
        self._answered.discard(key)

    def answered(self, request_id: str) -> None:
        """A caller got ``request_id``'s verdict from the sidecar: announcing the id again
        (:meth:`expect`) starts a new request, and drops what came for the old one."""
        if request_id in self._expected:
            self._answered.add(request_id)

    # ------------------------------------------------------------------ waiting

    def wait_verdict(self, request_id: str, tenant: str | None = None) -> VerdictFuture:
        """A future resolved by the request's final verdict (at once when it came already).

        ``tenant``: only a verdict for this tenant (or one that names none) resolves it.
        """
        future: VerdictFuture = asyncio.get_running_loop().create_future()
        final = self._recent_final(request_id, tenant)
        if final is not None:
            future.set_result(final)
        else:
            self._verdicts.setdefault(request_id, []).append((future, tenant))
        return future

    def forget_verdict(self, request_id: str, future: VerdictFuture) -> None:
        waiters = [w for w in self._verdicts.get(request_id, []) if w[0] is not future]
        if waiters:
            self._verdicts[request_id] = waiters
        else:
            self._verdicts.pop(request_id, None)

    def subscribe_claims(
        self, request_id: str, tenant: str | None = None
    ) -> asyncio.Queue[ClaimItem]:
        """A queue of the request's claim verdicts, then its final verdict (the end marker)."""
        queue: asyncio.Queue[ClaimItem] = asyncio.Queue(CLAIMS_QUEUE_MAX + 2)
        for arrival in self._kept_claims.get(request_id) or self._recent_claims.get(request_id):
            claim = _decode(ClaimVerdict, request_id, arrival)
            if claim is not None and _ours(claim.event, tenant):
                _put(queue, request_id, claim)
        final = self._recent_final(request_id, tenant)
        if final is not None:
            _put(queue, request_id, final)
        self._claims.setdefault(request_id, []).append((queue, tenant))
        return queue

    def unsubscribe_claims(self, request_id: str, queue: asyncio.Queue[ClaimItem]) -> None:
        queues = [q for q in self._claims.get(request_id, []) if q[0] is not queue]
        if queues:
            self._claims[request_id] = queues
        else:
            self._claims.pop(request_id, None)

    def close(self) -> None:
        """The consumer stopped: every verdict waiter is woken with :class:`ClientStopped`,
        every claims queue gets the :class:`Stopped` end marker."""
        for waiters in self._verdicts.values():
            for future, _ in waiters:
                if not future.done():
                    future.set_exception(ClientStopped())
        self._verdicts.clear()
        for queues in self._claims.values():
            for queue, _ in queues:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(Stopped())

    # ------------------------------------------------------------------ arrivals

    def offer_verdict(self, key: str, arrival: Arrival) -> None:
        if self._expecting(key):
            self._kept_verdicts.add(key, arrival)
        else:
            self._recent_verdicts.add(key, arrival)
        if key not in self._verdicts and key not in self._claims:
            self.skipped += 1
            return
        self.decoded += 1
        received = _decode(AnswerVerdict, key, arrival)
        if received is None or received.event.stage != "final":
            return  # a strict-mode stream verdict: the final one follows
        waiting = []
        for future, tenant in self._verdicts.pop(key, []):
            if not _ours(received.event, tenant):
                waiting.append((future, tenant))  # another tenant's verdict: keep waiting
            elif not future.done():
                future.set_result(received)
        if waiting:
            self._verdicts[key] = waiting
        for queue, tenant in self._claims.get(key, []):
            if _ours(received.event, tenant):
                _put(queue, key, received)

    def offer_claim(self, key: str, arrival: Arrival) -> None:
        if self._expecting(key):
            self._kept_claims.add(key, arrival)
        else:
            self._recent_claims.add(key, arrival)
        queues = self._claims.get(key)
        if not queues:
            self.skipped += 1
            return
        self.decoded += 1
        claim = _decode(ClaimVerdict, key, arrival)
        if claim is not None:
            for queue, tenant in queues:
                if _ours(claim.event, tenant):
                    _put(queue, key, claim)

    def _recent_final(self, request_id: str, tenant: str | None) -> Received[AnswerVerdict] | None:
        kept = self._kept_verdicts.get(request_id) or self._recent_verdicts.get(request_id)
        for arrival in reversed(kept):
            received = _decode(AnswerVerdict, request_id, arrival)
            if (
                received is not None
                and received.event.stage == "final"
                and _ours(received.event, tenant)
            ):
                return received
        return None
