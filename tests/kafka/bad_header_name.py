"""Publish one record whose header name is not UTF-8, as a Go or C producer may.

aiokafka's pure-Python record builder writes a header name as whatever its
``encode()`` returns; its C builder cannot be made to, so this runs in a process
of its own with ``AIOKAFKA_NO_EXTENSIONS=1``:

    AIOKAFKA_NO_EXTENSIONS=1 python -m tests.kafka.bad_header_name BOOTSTRAP TOPIC KEY FILE
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiokafka import AIOKafkaProducer

BAD_NAME = b"\xff\xfe-name"


class RawName(str):
    """A header name whose encoding is given bytes."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawName:
        name = super().__new__(cls, "x")
        name.raw = raw
        return name

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        del encoding, errors
        return self.raw


async def main(bootstrap: str, topic: str, key: str, value_file: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        value = Path(value_file).read_bytes()
        headers = [(RawName(BAD_NAME), b"v")]
        await producer.send_and_wait(topic, value, key=key.encode(), headers=headers)
    finally:
        await producer.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
