"""Build the serving sidecar from settings and run it until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

from sidecar.config import Settings
from sidecar.health import HealthServer
from sidecar.kafka.app import SidecarService
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy, Policy
from sidecar.telemetry import configure_from_env

log = logging.getLogger("sidecar")


def build_policy(settings: Settings) -> Policy:
    """The decision policy. Until signal models are configured: the placeholder."""
    del settings
    return PlaceholderPolicy()


def check(settings: Settings) -> dict[str, object]:
    """Everything ``run`` would load, loaded and validated, without touching Kafka."""
    policy = build_policy(settings)
    Processor(settings, policy)
    return {"config": "ok", "policy": policy.name, "models": {}}


async def serve(settings: Settings) -> None:
    shutdown_telemetry = configure_from_env(settings.metrics.prometheus_port)
    service = SidecarService(settings, Processor(settings, build_policy(settings)))
    health: HealthServer | None = None
    if settings.http.enabled:
        health = HealthServer(
            settings.http.host,
            settings.http.port,
            lambda: {
                "broker_connected": service.state.broker_ok,
                "models_loaded": True,
                **(
                    {"partitions_assigned": bool(service.state.assigned)}
                    if settings.http.ready_requires_assignment
                    else {}
                ),
            },
        )
        await health.start()
        log.info("health endpoints on %s:%d", settings.http.host, health.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    log.info(
        "sidecar consuming %s + %s as group %s on %s",
        settings.topics.retrieval,
        settings.topics.generation,
        settings.kafka.group_id,
        settings.kafka.bootstrap_servers,
    )
    await stop.wait()
    log.info("stopping: finishing in-flight work and committing")
    try:
        await asyncio.wait_for(service.stop(), timeout=settings.shutdown_grace_ms / 1000.0 or None)
    finally:
        if health is not None:
            await health.stop()
        shutdown_telemetry()
    log.info("stopped")
