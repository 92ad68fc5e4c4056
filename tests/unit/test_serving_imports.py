"""The serving process imports nothing from the lab (training, datasets, reports, benches)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

LAB_PACKAGES = (
    "sidecar.report",
    "sidecar.bench",
    "sidecar.chaos",
    "sidecar.localkafka",
    "sidecar.retrieval",
    "sidecar.generator",
    "sidecar.demo",
    "sidecar.replay",
)
LAB_MODULE_NAMES = ("training", "datasets", "dataset", "evaluate", "evaluation", "outcomes")
HEAVY = ("torch", "transformers", "sklearn", "matplotlib", "qdrant_client", "tqdm")

PROBE = """
import sys
from sidecar.config import Settings
from sidecar import runtime
import sidecar.cli.main, sidecar.cli.run, sidecar.kafka.app, sidecar.health
sidecar.cli.main.build_parser()  # `guardrail run` builds the whole command line first
runtime.check(Settings.load())
print("\\n".join(sorted(sys.modules)))
"""


def test_guardrail_run_imports_no_lab_module() -> None:
    env = {
        **os.environ,
        "GUARDRAIL_SIGNALS__CLAIMS": "true",
        "GUARDRAIL_MODELS__DIR": str(REPO / "models"),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env, cwd=REPO
    )
    loaded = set(out.stdout.split())
    assert "sidecar.kafka.app" in loaded and "sidecar.claims.verifier" in loaded  # it ran
    lab = sorted(
        m
        for m in loaded
        if m.startswith(LAB_PACKAGES)
        or (m.startswith("sidecar.") and m.rsplit(".", 1)[-1] in LAB_MODULE_NAMES)
    )
    assert lab == []
    assert sorted(m for m in HEAVY if m in loaded) == []
