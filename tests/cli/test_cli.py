from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from sidecar.cli.main import main


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "replay", "demo", "topics", "kafka", "config", "schemas"):
        assert f"    {command} " in out


def test_python_dash_m_runs_the_same_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "run", "--check"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = orjson.loads(out.stdout)
    assert report["config"] == "ok"
    assert report["policy"] == "default/1"
    assert "certifier" in report["models"]


def test_check_does_not_import_torch() -> None:
    code = (
        "import sys; from sidecar.cli.main import main; main(['run', '--check']); "
        "bad = [m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
