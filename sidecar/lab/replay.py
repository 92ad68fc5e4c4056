"""Produce recorded events to the input topics (``guardrail replay``, the demo, tests).

A replay file has one JSON object per line, either
  * an event (it has ``event_type``): sent to the retrieval, generation or feedback
    topic by its type, keyed by its ``request_id``, as the line's own bytes (a
    verdict's idempotency key is drawn from them: a replay of recorded traffic is
    recognised as the same requests); or
  * an envelope ``{"topic": "retrieval"|"generation"|"feedback", "key": str, "raw": str,
    "headers": {str: str}}``: ``raw`` is sent byte for byte (UTF-8), which is how
    recordings carry broken input on purpose.

A file is streamed (:func:`iter_file`): ``guardrail replay`` checks every line first,
so that a bad one stops it before anything is sent, then reads the file again as it
sends, awaiting the broker's confirmations as it goes. Before, the whole file was held
as records (a 212 MB recording took 1.28 GB before its first record was sent).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from sidecar.config import Settings
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.security import aiokafka_client_args


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def parse_line(line: str, settings: Settings, where: str) -> Record:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not a JSON object ({exc})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    topics = {
        "retrieval": settings.topics.retrieval,
        "generation": settings.topics.generation,
        "feedback": settings.topics.feedback,
    }
    if "event_type" in obj:
        kind = obj["event_type"] if obj["event_type"] in ("retrieval", "feedback") else "generation"
        rid = obj.get("request_id")
        key = rid.encode("utf-8") if isinstance(rid, str) else None
        return Record(topics[kind], key, line.strip().encode("utf-8"))
    if obj.get("topic") in topics and isinstance(obj.get("raw"), str):
        raw_headers = obj.get("headers") or {}
        if not isinstance(raw_headers, dict):
            raise ConfigError(f"{where}: headers must be an object of name: value")
        headers = [(str(k), str(v).encode("utf-8")) for k, v in raw_headers.items()]
        key = obj.get("key")
        return Record(
            topics[obj["topic"]],
            key.encode("utf-8") if isinstance(key, str) else None,
            obj["raw"].encode("utf-8"),
            headers,
        )
    raise ConfigError(
        f"{where}: a line is either an event (with event_type) or an envelope "
        '{"topic": "retrieval"|"generation"|"feedback", "key": ..., "raw": "..."}'
    )


MAX_UNCONFIRMED: Final = 10_000
"""Records sent and not yet confirmed by the broker, at most (their futures are held)."""


def iter_file(path: Path, settings: Settings) -> Iterator[Record]:
    """The records of a replay file, one line at a time (``ConfigError`` at a bad line)."""
    if not path.is_file():
        raise ConfigError(f"{path} is not a file (JSON lines: one event or envelope per line)")
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{path}:{n}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})"
                ) from None
            if line.strip() and not line.lstrip().startswith("//"):
                yield parse_line(line, settings, f"{path}:{n}")


def load_file(path: Path, settings: Settings) -> list[Record]:
    """Every record of a small file (the demo's recording, tests); a replay streams."""
    return list(iter_file(path, settings))


async def send(
    settings: Settings,
    records: Iterable[Record],
    rate_per_s: float | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 10_000,
    topics: Collection[str] = (),
) -> int:
    """Send records in order (idempotent producer, acks=all); returns how many.

    ``records`` is consumed as it is sent; at most :data:`MAX_UNCONFIRMED` records wait
    for the broker's confirmation. ``progress(sent)`` every ``progress_every`` records.
    ``topics`` (those the records go to) must all exist, or nothing is sent: a missing one
    is ``ConfigError`` at once, not a wait of the producer's metadata timeout."""
    producer = AIOKafkaProducer(
        **aiokafka_client_args(settings.kafka),
        acks="all",
        enable_idempotence=True,
        max_request_size=settings.topics.max_message_bytes + 65_536,
    )
    try:
        await producer.start()
    except KafkaError as exc:
        await producer.stop()
        raise BrokerError(
            f"cannot reach Kafka at {settings.kafka.bootstrap_servers}: {exc} "
            "(GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS)"
        ) from None
    sent = 0
    started = time.monotonic()
    try:
        if topics:
            missing = sorted(set(topics) - (await producer.client.fetch_all_metadata()).topics())
            if missing:
                raise ConfigError(
                    f"topic(s) {', '.join(missing)} do not exist on "
                    f"{settings.kafka.bootstrap_servers}; create them first "
                    "(`guardrail topics create`); nothing was sent"
                )
        futures: deque[Any] = deque()
        for record in records:
            if rate_per_s:
                delay = started + sent / rate_per_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            futures.append(
                await producer.send(
                    record.topic, record.value, key=record.key, headers=record.headers
                )
            )
            sent += 1
            while len(futures) > MAX_UNCONFIRMED:
                await futures.popleft()
            if progress is not None and sent % progress_every == 0:
                progress(sent)
        await producer.flush()
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return sent
