"""The pinned helm and promtool, built once per session (tests/deploy/tools.py)."""

from __future__ import annotations

import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.tools import deploy_tool


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
