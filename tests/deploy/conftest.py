"""The pinned helm and promtool, built once per session (tests/deploy/tools.py); the pod's
filesystem root and the example chart with its dependency built."""

from __future__ import annotations

import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.tools import CHART, EXAMPLE, RUN_TIMEOUT_S, deploy_tool, helm_env


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm binary, built by scripts/lib/deploy-tools.sh when missing."""
    return deploy_tool("helm", "helm_tool")


@pytest.fixture(scope="session")
def promtool() -> Path:
    """The pinned promtool (Prometheus' rule checker), built by deploy-tools.sh when missing."""
    return deploy_tool("promtool", "promtool_tool")


@pytest.fixture
def pod_root() -> Iterator[Path]:
    """The pod's filesystem: a directory any uid can traverse (tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="guardrail-pod-"))
    root.chmod(0o755)
    yield root
    for p in [root, *root.rglob("*")]:  # read-only copies, writable again to be removed
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    shutil.rmtree(root)


@pytest.fixture(scope="session")
def example_chart(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """helm/example-llm-service with its dependency built, in a copy (the tree stays clean)."""
    root = tmp_path_factory.mktemp("charts")
    shutil.copytree(CHART, root / "charts" / CHART.name)
    example = root / "helm" / EXAMPLE.name
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("charts"))
    built = subprocess.run(
        [str(helm), "dependency", "build", "--skip-refresh", str(example)],
        capture_output=True,
        text=True,
        env=helm_env(),
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return example
