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
    assert sorted(m for m in modules if m.startswith(SERVING)) == []
    # the contracts package (its modules are the event records) and the exceptions only
    assert (
        sorted(
            m
            for m in modules
            if m.startswith("sidecar.")
            and m not in {"sidecar.exceptions", "sidecar.contracts"}
            and not m.startswith("sidecar.contracts.")
        )
        == []
    )
