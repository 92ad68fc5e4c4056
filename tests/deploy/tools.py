"""The pinned deployment tools for the tests of this folder, and the chart rendered by them.

``helm`` and ``promtool`` are built into the git-ignored ``.tools/`` by
``scripts/lib/deploy-tools.sh`` (``go install`` at a pinned version, as
``make helm-check`` builds helm); the first run takes minutes, later ones reuse them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "guardrail-sidecar"
EXAMPLE = ROOT / "helm" / "example-llm-service"
DEPLOY_TOOLS = ROOT / "scripts" / "lib" / "deploy-tools.sh"
KUBE_VERSION = "1.31.0"
NAMESPACE = "rag"
# The first run builds a tool with `go install` (minutes); later runs reuse it.
HELM_BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 120


def deploy_tool(name: str, function: str) -> Path:
    """The binary ``name`` in .tools/bin, built by deploy-tools.sh's ``function`` when missing."""
    built = subprocess.run(
        [
            "bash",
            "-c",
            f'source "$1" && tools_init && {function} >&2 && command -v {name}',
            f"{name}-tool",
            str(DEPLOY_TOOLS),
        ],
        capture_output=True,
        text=True,
        timeout=HELM_BUILD_TIMEOUT_S,
        check=False,
    )
    assert built.returncode == 0, (
        f"could not build the pinned {name} (needs Go and the Go module proxy, as "
        f"`make helm-check` does):\n{built.stderr[-3000:]}"
    )
    return Path(built.stdout.strip().splitlines()[-1])


def helm_env() -> dict[str, str]:
    tools = ROOT / ".tools" / "helm-home"
    return os.environ | {
        "HELM_CACHE_HOME": str(tools / "cache"),
        "HELM_CONFIG_HOME": str(tools / "config"),
        "HELM_DATA_HOME": str(tools / "data"),
    }


def render(helm: Path, chart: Path, *args: str) -> list[dict[str, Any]]:
    """``helm template`` of ``chart`` (release ``guardrail``, or ``llm`` for the example)."""
    out = _template(helm, chart, *args)
    assert out.returncode == 0, f"helm template {chart.name} {args} failed:\n{out.stderr}"
    return [m for m in yaml.safe_load_all(out.stdout) if m]


def refusal(helm: Path, chart: Path, *args: str) -> str:
    """What ``helm template`` of ``chart`` with ``args`` says on stderr as it refuses them
    (an assertion error when it renders)."""
    out = _template(helm, chart, *args)
    assert out.returncode != 0, f"helm template {chart.name} {args} rendered:\n{out.stdout[-2000:]}"
    return out.stderr


def _template(helm: Path, chart: Path, *args: str) -> subprocess.CompletedProcess[str]:
    release = "llm" if chart.name == EXAMPLE.name else "guardrail"
    return subprocess.run(
        [
            str(helm),
            "template",
            release,
            str(chart),
            "-n",
            NAMESPACE,
            "--kube-version",
            KUBE_VERSION,
            *args,
        ],
        capture_output=True,
        text=True,
        env=helm_env(),
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
