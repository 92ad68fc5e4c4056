"""Running the reference service: Kafka producer, verdict waiter and HTTP site, up and down."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from aiokafka import AIOKafkaProducer

from examples.rag_service.app import Answerer, RagService
from examples.rag_service.config import ServiceSettings
from examples.rag_service.verdicts import VerdictWaiter

__all__ = ["READY_LINE", "running", "serve"]

READY_LINE = "rag-service ready on"


@asynccontextmanager
async def running(settings: ServiceSettings, answerer: Answerer) -> AsyncIterator[str]:
    """The service, listening; yields its base URL (port 0 picks a free one)."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all")
    waiter = VerdictWaiter(settings.bootstrap_servers, settings.verdict_topic)
    await producer.start()
    try:
        await waiter.start()
        runner = web.AppRunner(RagService(settings, answerer, producer, waiter).app())
        await runner.setup()
        try:
            site = web.TCPSite(runner, settings.host, settings.port)
            await site.start()
            port = runner.addresses[0][1]
            yield f"http://{settings.host}:{port}"
        finally:
            await runner.cleanup()
            await waiter.stop()
    finally:
        await producer.stop()


async def serve(settings: ServiceSettings, answerer: Answerer) -> None:
    """Serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running(settings, answerer) as url:
        sys.stdout.write(f"{READY_LINE} {url}\n")
        sys.stdout.flush()
        await stop.wait()
