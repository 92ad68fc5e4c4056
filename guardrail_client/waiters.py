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
from collections import OrderedDict
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


def _decode(model: type[T], arrival: Arrival) -> Received[T] | None:
    try:
        return Received(model.model_validate_json(arrival.value), arrival.timestamp_ms)
    except ValidationError as exc:
        log.warning("skipped a %s that breaks the contract: %s", model.__name__, exc)
        return None


class _Recent:
    """Undecoded records by key, oldest forgotten first (count and age bounded)."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self._items: OrderedDict[str, tuple[float, list[Arrival]]] = OrderedDict()
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock

    def __len__(self) -> int:
        return len(self._items)

    def add(self, key: str, arrival: Arrival, *, replace: bool) -> None:
        now = self._clock()
        old = self._items.pop(key, None)
        kept = [] if replace or old is None else old[1]
        self._items[key] = (now, [*kept, arrival])
        while self._items and (
            len(self._items) > self._max_entries
            or now - next(iter(self._items.values()))[0] > self._ttl_s
        ):
            self._items.popitem(last=False)

    def get(self, key: str) -> list[Arrival]:
        item = self._items.get(key)
        if item is None or self._clock() - item[0] > self._ttl_s:
            return []
        return item[1]


class WaiterMap:
    """Verdict futures and claim queues by request id, plus the recent cache."""

    def __init__(
        self,
        *,
        recent_max_entries: int = 10_000,
        recent_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._verdicts: dict[str, list[asyncio.Future[Received[AnswerVerdict]]]] = {}
        self._claims: dict[str, list[asyncio.Queue[ClaimItem]]] = {}
        self._recent_verdicts = _Recent(recent_max_entries, recent_ttl_s, clock)
        self._recent_claims = _Recent(recent_max_entries, recent_ttl_s, clock)
        self.decoded = 0  # records decoded because someone here waited for them
        self.skipped = 0  # records nobody here waited for (kept undecoded)

    @property
    def waiting(self) -> int:
        return len(self._verdicts) + len(self._claims)

    # ------------------------------------------------------------------ waiting

    def wait_verdict(self, request_id: str) -> asyncio.Future[Received[AnswerVerdict]]:
        """A future resolved by the request's final verdict (at once when it came already)."""
        future: asyncio.Future[Received[AnswerVerdict]] = asyncio.get_running_loop().create_future()
        final = self._recent_final(request_id)
        if final is not None:
            future.set_result(final)
        else:
            self._verdicts.setdefault(request_id, []).append(future)
        return future

    def forget_verdict(
        self, request_id: str, future: asyncio.Future[Received[AnswerVerdict]]
    ) -> None:
        waiters = self._verdicts.get(request_id, [])
        if future in waiters:
            waiters.remove(future)
        if not waiters:
            self._verdicts.pop(request_id, None)

    def subscribe_claims(self, request_id: str) -> asyncio.Queue[ClaimItem]:
        """A queue of the request's claim verdicts, then its final verdict (the end marker)."""
        queue: asyncio.Queue[ClaimItem] = asyncio.Queue()
        for arrival in self._recent_claims.get(request_id):
            if (claim := _decode(ClaimVerdict, arrival)) is not None:
                queue.put_nowait(claim)
        final = self._recent_final(request_id)
        if final is not None:
            queue.put_nowait(final)
        self._claims.setdefault(request_id, []).append(queue)
        return queue

    def unsubscribe_claims(self, request_id: str, queue: asyncio.Queue[ClaimItem]) -> None:
        queues = self._claims.get(request_id, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            self._claims.pop(request_id, None)

    # ------------------------------------------------------------------ arrivals

    def offer_verdict(self, key: str, arrival: Arrival) -> None:
        self._recent_verdicts.add(key, arrival, replace=True)
        if key not in self._verdicts and key not in self._claims:
            self.skipped += 1
            return
        self.decoded += 1
        received = _decode(AnswerVerdict, arrival)
        if received is None or received.event.stage != "final":
            return  # a strict-mode stream verdict: the final one follows
        for future in self._verdicts.pop(key, []):
            if not future.done():
                future.set_result(received)
        for queue in self._claims.get(key, []):
            queue.put_nowait(received)

    def offer_claim(self, key: str, arrival: Arrival) -> None:
        self._recent_claims.add(key, arrival, replace=False)
        queues = self._claims.get(key)
        if not queues:
            self.skipped += 1
            return
        self.decoded += 1
        claim = _decode(ClaimVerdict, arrival)
        if claim is not None:
            for queue in queues:
                queue.put_nowait(claim)

    def _recent_final(self, request_id: str) -> Received[AnswerVerdict] | None:
        for arrival in reversed(self._recent_verdicts.get(request_id)):
            received = _decode(AnswerVerdict, arrival)
            if received is not None and received.event.stage == "final":
                return received
        return None
