"""Stopping telemetry is bounded: an OTLP endpoint that never answers cannot hold the process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

_STOP_PROBE = """
import time
from opentelemetry import metrics, trace
from sidecar.telemetry_setup import configure_from_env

setup = configure_from_env()
tracer = trace.get_tracer("probe")
for _ in range(5000):
    with tracer.start_as_current_span("s"):
        pass
metrics.get_meter("probe").create_counter("c").add(1)
started = time.monotonic()
setup.shutdown(1.0)
print(f"{time.monotonic() - started:.2f}", flush=True)
"""


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP port that accepts connections and never answers (a hung collector)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_silent_otlp_endpoint_holds_the_stop_no_longer_than_it_is_given(
    protocol: str, silent_endpoint: str
) -> None:
    """Audit: with the collector unreachable or silent a SIGTERM took 42-49 s to end the
    sidecar (the SDK's 30 s per provider and 10 s per export), past its shutdown grace
    (10 s) and the pod's termination grace (30 s)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": silent_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _STOP_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 2.0, done.stderr[-2000:]
    assert took < 20, f"the process took {took:.1f} s to end"
    assert "telemetry export did not finish within 1.0 s" in done.stderr
