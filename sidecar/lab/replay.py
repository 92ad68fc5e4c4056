"""Produce recorded events to the input topics (``guardrail replay``, the demo, tests).

A replay file has one JSON object per line, either
  * an event (it has ``event_type``): sent to the retrieval, generation or feedback
    topic by its type, keyed by its ``request_id``; or
  * an envelope ``{"topic": "retrieval"|"generation"|"feedback", "key": str, "raw": str,
    "headers": {str: str}}``: ``raw`` is sent byte for byte (UTF-8), which is how
    recordings carry broken input on purpose.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        return Record(topics[kind], key, orjson.dumps(obj))
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


def load_file(path: Path, settings: Settings) -> list[Record]:
    if not path.is_file():
        raise ConfigError(f"{path} is not a file (JSON lines: one event or envelope per line)")
    records = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{path}:{n}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})"
                ) from None
            if line.strip() and not line.lstrip().startswith("//"):
                records.append(parse_line(line, settings, f"{path}:{n}"))
    return records


async def send(
    settings: Settings, records: Iterable[Record], rate_per_s: float | None = None
) -> int:
    """Send records in order (idempotent producer, acks=all); returns how many."""
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
        futures: list[Any] = []
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
        await producer.flush()
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return sent
