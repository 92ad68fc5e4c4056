"""Ports for the tests' brokers and sidecars: free, and out of the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

from sidecar.lab.localkafka.broker import free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_a_free_port_is_free_and_no_outgoing_connection_can_take_it() -> None:
    """A port the kernel picked (bind to 0) lies in the ephemeral range: before the sidecar
    listened on it, a Kafka client's outgoing connection took it once in a full run
    (``address already in use`` on the health port)."""
    first_ephemeral = int(RANGE.read_text().split()[0]) if RANGE.is_file() else 65_536
    ports = [free_port() for _ in range(200)]
    assert all(1_024 < p < first_ephemeral for p in ports)
    assert len(set(ports)) > 150  # spread out, not one port handed to every caller
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[-1]))  # free: it binds
