"""The in-memory waiter map: who in this process waits for which request's verdict and claims.

No Kafka here. The consumer hands every record to ``offer_verdict`` /
``offer_claim`` with its key; a record nobody here waits for is kept, still
undecoded, in a bounded recent cache (a verdict can arrive before its caller
starts waiting) and costs a dict lookup, not a JSON parse. Only records a
caller waits for are decoded and validated; one that breaks the contract is
logged and skipped, never raised into the consumer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import ValidationError

from sidecar.contracts.events import AnswerVerdict, ClaimVerdict

log = logging.getLogger("guardrail_client")

T = TypeVar("T", AnswerVerdict, ClaimVerdict)


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


ClaimItem = Received[ClaimVerdict] | Received[AnswerVerdict]
VerdictFuture = asyncio.Future[Received[AnswerVerdict]]


def _decode(model: type[T], arrival: Arrival) -> Received[T] | None:
    try:
        return Received(model.model_validate_json(arrival.value), arrival.timestamp_ms)
    except ValidationError as exc:
        log.warning("skipped a %s that breaks the contract: %s", model.__name__, exc)
        return None


class _Recent:
    """Undecoded records by key, oldest forgotten first (count and age bounded).

    At most ``per_key`` records are kept per key (the newest): a flood of records under
    one key costs a bounded list, not a growing one.
    """

    def __init__(
        self, max_entries: int, ttl_s: float, clock: Callable[[], float], per_key: int
    ) -> None:
        self._items: OrderedDict[str, tuple[float, deque[Arrival]]] = OrderedDict()
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._per_key = per_key

    def __len__(self) -> int:
        return len(self._items)

    def add(self, key: str, arrival: Arrival) -> None:
        now = self._clock()
        old = self._items.pop(key, None)
        kept = deque(maxlen=self._per_key) if old is None else old[1]
        kept.append(arrival)
        self._items[key] = (now, kept)
        while self._items and (
            len(self._items) > self._max_entries
            or now - next(iter(self._items.values()))[0] > self._ttl_s
        ):
            self._items.popitem(last=False)

    def get(self, key: str) -> list[Arrival]:
        item = self._items.get(key)
        if item is None or self._clock() - item[0] > self._ttl_s:
            return []
        return list(item[1])


class ClientStopped(Exception):
    """The verdict consumer stopped while a caller waited."""


def _ours(event: AnswerVerdict | ClaimVerdict, tenant: str | None) -> bool:
    """Whether ``event`` may be the waiter's: no tenant asked, or none named, or the same.

    With header (or fixed) tenancy the sidecar scopes request ids by tenant, but its
    outputs are keyed by request id: another tenant can provoke a verdict under yours.
    """
    return tenant is None or event.tenant is None or event.tenant == tenant


class WaiterMap:
    """Verdict futures and claim queues by request id, plus the recent cache."""

    def __init__(
        self,
        *,
        recent_max_entries: int = 10_000,
        recent_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._verdicts: dict[str, list[tuple[VerdictFuture, str | None]]] = {}
        self._claims: dict[str, list[tuple[asyncio.Queue[ClaimItem], str | None]]] = {}
        self._recent_verdicts = _Recent(recent_max_entries, recent_ttl_s, clock, per_key=8)
        self._recent_claims = _Recent(recent_max_entries, recent_ttl_s, clock, per_key=1024)
        self.decoded = 0  # records decoded because someone here waited for them
        self.skipped = 0  # records nobody here waited for (kept undecoded)

    @property
    def waiting(self) -> int:
        return len(self._verdicts) + len(self._claims)

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
        queue: asyncio.Queue[ClaimItem] = asyncio.Queue()
        for arrival in self._recent_claims.get(request_id):
            claim = _decode(ClaimVerdict, arrival)
            if claim is not None and _ours(claim.event, tenant):
                queue.put_nowait(claim)
        final = self._recent_final(request_id, tenant)
        if final is not None:
            queue.put_nowait(final)
        self._claims.setdefault(request_id, []).append((queue, tenant))
        return queue

    def unsubscribe_claims(self, request_id: str, queue: asyncio.Queue[ClaimItem]) -> None:
        queues = [q for q in self._claims.get(request_id, []) if q[0] is not queue]
        if queues:
            self._claims[request_id] = queues
        else:
            self._claims.pop(request_id, None)

    def close(self) -> None:
        """The consumer stopped: every verdict waiter is woken with :class:`ClientStopped`."""
        for waiters in self._verdicts.values():
            for future, _ in waiters:
                if not future.done():
                    future.set_exception(ClientStopped())
        self._verdicts.clear()

    # ------------------------------------------------------------------ arrivals

    def offer_verdict(self, key: str, arrival: Arrival) -> None:
        self._recent_verdicts.add(key, arrival)
        if key not in self._verdicts and key not in self._claims:
            self.skipped += 1
            return
        self.decoded += 1
        received = _decode(AnswerVerdict, arrival)
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
                queue.put_nowait(received)

    def offer_claim(self, key: str, arrival: Arrival) -> None:
        self._recent_claims.add(key, arrival)
        queues = self._claims.get(key)
        if not queues:
            self.skipped += 1
            return
        self.decoded += 1
        claim = _decode(ClaimVerdict, arrival)
        if claim is not None:
            for queue, tenant in queues:
                if _ours(claim.event, tenant):
                    queue.put_nowait(claim)

    def _recent_final(self, request_id: str, tenant: str | None) -> Received[AnswerVerdict] | None:
        for arrival in reversed(self._recent_verdicts.get(request_id)):
            received = _decode(AnswerVerdict, arrival)
            if (
                received is not None
                and received.event.stage == "final"
                and _ours(received.event, tenant)
            ):
                return received
        return None
