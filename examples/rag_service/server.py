"""Running the reference service: the kit's publisher and verdict client, the HTTP site."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from examples.rag_service.app import Answerer, RagService
from examples.rag_service.config import ServiceSettings
from guardrail_client import GuardrailPublisher, VerdictClient

__all__ = ["READY_LINE", "running", "serve"]

READY_LINE = "rag-service ready on"


@asynccontextmanager
async def running(settings: ServiceSettings, answerer: Answerer) -> AsyncIterator[str]:
    """The service, listening; yields its base URL (port 0 picks a free one).

    The verdict client starts before the site takes requests, so no request's
    verdict comes before it reads; it waits ``verdict_timeout_ms`` and then
    falls back to ``settings.on_timeout`` (``RAG_SERVICE_FAIL_OPEN``).
    """
    publisher = GuardrailPublisher(
        settings.bootstrap_servers,
        generator_model=answerer.generator_model,
        retrieval_topic=settings.retrieval_topic,
        generation_topic=settings.generation_topic,
    )
    verdicts = VerdictClient(
        settings.bootstrap_servers,
        verdicts_topic=settings.verdict_topic,
        claims_topic=None,
        on_timeout=settings.on_timeout,
        timeout_s=settings.verdict_timeout_ms / 1000,
    )
    async with publisher, verdicts:
        runner = web.AppRunner(RagService(settings, answerer, publisher, verdicts).app())
        await runner.setup()
        try:
            site = web.TCPSite(runner, settings.host, settings.port)
            await site.start()
            port = runner.addresses[0][1]
            yield f"http://{settings.host}:{port}"
        finally:
            await runner.cleanup()


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
