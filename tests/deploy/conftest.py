"""The pinned helm and promtool, built once per session (tests/deploy/tools.py)."""

from __future__ import annotations

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
