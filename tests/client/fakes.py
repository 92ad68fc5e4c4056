"""Stand-ins for aiokafka's producer and consumer: the client's lifecycle without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.structs import TopicPartition


class _FakeMetadata:
    def __init__(self, topics: set[str]) -> None:
        self._topics = topics

    def topics(self) -> set[str]:
        return set(self._topics)


class _FakeClient:
    """The producer's ``client``: the topics the publisher writes exist."""

    def __init__(self) -> None:
        self.topics = {"rag.retrieval", "rag.generation"}

    async def fetch_all_metadata(self) -> _FakeMetadata:
        return _FakeMetadata(self.topics)

    def get_random_node(self) -> int:
        return 0

    async def send(self, node_id: int, request: Any) -> _Authorised:
        """The authorised-operations metadata a broker without ACLs gives."""
        return _Authorised(self.topics)


class _Authorised:
    def __init__(self, topics: set[str]) -> None:
        self.topics = topics

    def to_object(self) -> dict[str, Any]:
        every = sum(1 << op for op in (2, 3, 4, 5, 6, 7, 8, 10, 11))  # a topic's operations
        return {
            "topics": [
                {"error_code": 0, "name": t, "topic_authorized_operations": every}
                for t in sorted(self.topics)
            ]
        }


class FakeProducer:
    """``AIOKafkaProducer`` as the publisher uses it; every send is confirmed at once.

    ``on_stop`` runs inside ``stop()``, before the producer counts as stopped: a test puts
    there what must happen while the publisher stops.
    """

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.started = self.stopped = False
        self.sent: list[tuple[str, bytes]] = []
        self.on_stop: Callable[[], Awaitable[None]] | None = None
        self.client = _FakeClient()

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        if self.on_stop is not None:
            await self.on_stop()
        self.stopped = True

    async def flush(self) -> None:
        return None

    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[None]:
        self.sent.append((topic, value))
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered


class FakeConsumer:
    """``AIOKafkaConsumer`` as the verdict client uses it: the topics exist, nothing comes."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.stopped = False
        self._topics: list[str] = []
        self._client = _FakeClient()  # asked for the authorised operations on the topics
        self._client.topics = {"rag.verdicts", "rag.claims"}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.stopped = True

    async def topics(self) -> set[str]:
        return {"rag.verdicts", "rag.claims"}

    def subscribe(self, topics: list[str]) -> None:
        self._topics = list(topics)

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(topic, 0) for topic in self._topics}

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        return None

    async def position(self, tp: TopicPartition) -> int:
        return 0

    async def getmany(self, timeout_ms: int = 0) -> dict[TopicPartition, list[Any]]:
        await asyncio.sleep(timeout_ms / 1000)
        return {}
