"""Importing guardrail_client pulls contracts and aiokafka, never the sidecar's serving stack."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

FORBIDDEN = ("faststream", "onnxruntime", "torch", "transformers", "qdrant_client", "tokenizers")
SERVING = (
    "sidecar.kafka",
    "sidecar.pipeline",
    "sidecar.policy",
    "sidecar.runtime",
    "sidecar.config",
    "sidecar.telemetry",
    "sidecar.claims",
    "sidecar.lookback",
    "sidecar.conformal",
    "sidecar.confidence",
)
PROBE = """
import sys
import guardrail_client
print("\\n".join(sorted(sys.modules)))
"""


def test_importing_the_client_imports_no_serving_or_heavy_module() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout.split()
    modules = set(out)
    assert "guardrail_client.verdicts" in modules and "aiokafka" in modules  # the probe worked
    assert sorted(m for m in modules if m.split(".")[0] in FORBIDDEN) == []
    # a package and its modules ("sidecar.kafka", "sidecar.kafka.app"; not "sidecar.kafka_logs")
    serving = [m for m in modules if any(m == s or m.startswith(s + ".") for s in SERVING)]
    assert sorted(serving) == []
    # the contracts package (its modules are the event records), the exceptions and the
    # Kafka client's log table (logging only: calm_kafka_logs) only
    assert (
        sorted(
            m
            for m in modules
            if m.startswith("sidecar.")
            and m not in {"sidecar.exceptions", "sidecar.contracts", "sidecar.kafka_logs"}
            and not m.startswith("sidecar.contracts.")
        )
        == []
    )
