"""The native floor's library, compiled once per test session (cargo, crates.io)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.lab.bench import native_floor


@pytest.fixture(scope="session")
def native_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if native_floor.cargo() is None:
        pytest.skip("no cargo here: the native floor (a bench lever, not the sidecar) needs it")
    return native_floor.build(tmp_path_factory.mktemp("native") / "native_floor.so")
