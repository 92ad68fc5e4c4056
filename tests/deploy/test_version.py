"""``guardrail --version`` names the package's version (the image check compares it).

``make image-check`` runs ``guardrail --version`` inside the built image and
compares it with pyproject.toml; this keeps the CLI, ``sidecar.__version__``
and the packaging metadata in step without building anything.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sidecar import __version__
from sidecar.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_flag_prints_the_pyproject_version(capsys: pytest.CaptureFixture[str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"guardrail {project['version']}"
    assert project["version"] == __version__
