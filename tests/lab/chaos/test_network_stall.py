"""The network-stall chaos scenario against the real broker, behind the throttling proxy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.lab.chaos.faults import network_stall
from sidecar.lab.chaos.harness import Chaos

pytestmark = pytest.mark.connected


async def _advertised_ports(bootstrap: str) -> set[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        cluster: dict[str, Any] = await admin.describe_cluster()
    finally:
        await admin.close()
    return {int(b["port"]) for b in cluster["brokers"]}


def test_network_stall_loses_nothing_and_readiness_recovers(tmp_path: Path) -> None:
    with Chaos(tmp_path, seed=7, quick=True) as chaos:
        broker, proxy = chaos.broker, chaos.proxy
        proxied = broker.proxied_bootstrap_servers
        assert proxied == proxy.address
        # clients that bootstrap at the proxy are told to stay there; the others go direct
        before = proxy.stats().connections
        assert asyncio.run(_advertised_ports(proxied)) == {proxy.port}
        assert proxy.stats().connections > before
        assert asyncio.run(_advertised_ports(broker.bootstrap_servers)) == {broker.port}

        result = asyncio.run(network_stall(chaos))

    assert result.name == "network-stall"
    assert result.requests > 0
    assert result.sent == 4 * result.requests  # retrieval, two deltas, final
    assert result.lost == 0, result
    assert result.verdicts >= result.requests, result  # every request has a verdict
    assert result.key_conflicts == 0, result  # duplicates carry the same idempotency key
    assert result.dlq == 0, result
    assert result.not_ready_during_outage is True, result  # /readyz followed the stall
    assert result.ready_after_outage is True, result
    assert result.recovery_s is not None, result
    assert result.max_lag > 0, result  # input piled up during the stall
    assert result.seconds < 90, result
