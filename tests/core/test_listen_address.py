"""The health and metrics endpoints bind the configured address: "::" serves IPv6-only pods."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import urllib.request

import pytest

from sidecar.health import HealthServer
from sidecar.lab.localkafka.broker import free_port


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")


def _status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=2) as r:
        return int(r.status)


async def test_the_health_endpoints_answer_over_ipv6_when_bound_to_the_any_address() -> None:
    server = HealthServer("::", 0, lambda: {"ok": True}, lambda: {"ok": True})
    await server.start()
    try:
        url = f"http://[::1]:{server.port}"
        assert await _in_thread(f"{url}/livez") == 200
        assert await _in_thread(f"{url}/readyz") == 200
    finally:
        await server.stop()


async def _in_thread(url: str) -> int:
    return await asyncio.to_thread(_status, url)


def test_the_metrics_endpoint_binds_the_configured_address() -> None:
    port = free_port()
    code = (
        "import urllib.request\n"
        "from sidecar.telemetry_setup import configure_from_env\n"
        f"setup = configure_from_env({port}, '::')\n"
        f"r = urllib.request.urlopen('http://[::1]:{port}/metrics', timeout=5)\n"
        "assert r.status == 200, r.status\n"
        "setup.shutdown()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
