"""The runtime image's Python environment, built the way the Dockerfile builds it.

The Dockerfile's builder stage makes a venv without pip and installs the
project into it with another interpreter's pip (``pip --python <venv> install
<project root>``): runtime dependencies only. These tests repeat exactly that in
a temporary directory, then check that the serving path works and stays light:

* ``guardrail run --check`` exits 0 with no broker reachable (it validates the
  configuration and loads the models without connecting to Kafka);
* neither torch, transformers nor the training stack is installed, and the
  check never even tries to import them (an import spy on ``sys.meta_path``);
* running it writes nothing into the venv - the image's root filesystem is
  read-only, only /tmp is writable.

No Docker engine is needed (or available); pip's cache keeps the install to
about a minute once the wheels have been downloaded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Distributions and modules that belong to the `train` / `ml` extras only.
FORBIDDEN_DISTRIBUTIONS = {
    "torch",
    "transformers",
    "scikit-learn",
    "skl2onnx",
    "matplotlib",
    "safetensors",
    "gguf",
}
FORBIDDEN_MODULES = {"torch", "transformers", "sklearn", "skl2onnx", "matplotlib", "safetensors"}

INSTALL_TIMEOUT_S = 900
RUN_TIMEOUT_S = 120

# Runs inside the runtime venv: `guardrail run --check` in-process, with a
# meta-path finder that records every attempt to import a forbidden module
# (an ImportError-guarded `import torch` would otherwise go unnoticed).
_SPY = """
import importlib.abc, json, sys
forbidden = set(sys.argv[2].split(","))
attempted = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in forbidden:
            attempted.append(name)
        return None
sys.meta_path.insert(0, Spy())
from sidecar.cli.main import main
code = main(["run", "--check"])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "attempted": sorted(set(attempted)), "loaded": loaded}, out)
"""


def _closed_port() -> int:
    """A local port nothing listens on: a broker address that cannot connect."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _image_env(venv: Path, tmp: Path) -> dict[str, str]:
    """The container's environment (Dockerfile ENV) plus a broker that is not there.

    Nothing is inherited from the test process, so no GUARDRAIL_* variable of
    the developer's shell leaks in.
    """
    return {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.defpath}",
        "HOME": str(tmp),
        "TMPDIR": str(tmp),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{_closed_port()}",
        "GUARDRAIL_HTTP__PORT": "0",
        # the models volume the chart mounts read-only at /models
        "GUARDRAIL_MODELS__DIR": str(ROOT / "models"),
    }


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv holding what the Dockerfile's builder stage installs (CPU variant)."""
    venv = tmp_path_factory.mktemp("runtime") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--disable-pip-version-check",
            "--quiet",
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert install.returncode == 0, (
        f"pip install {ROOT} failed:\n{install.stdout}\n{install.stderr}"
    )
    yield venv


@pytest.mark.timeout(INSTALL_TIMEOUT_S + RUN_TIMEOUT_S)
def test_runtime_venv_has_no_training_stack(runtime_venv: Path) -> None:
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(runtime_venv / "bin" / "python"),
            "list",
            "--format",
            "json",
            "--disable-pip-version-check",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=True,
    )
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}
    assert "rag-guardrail-sidecar" in installed
    assert "onnxruntime" in installed, "the CPU image scores with onnxruntime"
    assert not installed & FORBIDDEN_DISTRIBUTIONS, (
        f"runtime dependencies pull in {sorted(installed & FORBIDDEN_DISTRIBUTIONS)}"
    )
    # No pip in the runtime venv either: the Dockerfile installs from outside it.
    assert "pip" not in installed


@pytest.mark.timeout(INSTALL_TIMEOUT_S + RUN_TIMEOUT_S)
def test_run_check_exits_zero_without_a_broker(runtime_venv: Path, tmp_path: Path) -> None:
    before = _tree(runtime_venv)
    proc = subprocess.run(
        [str(runtime_venv / "bin" / "guardrail"), "run", "--check"],
        env=_image_env(runtime_venv, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, (
        f"guardrail run --check exited {proc.returncode}\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    assert _tree(runtime_venv) == before, "run --check wrote into the (read-only) install"


@pytest.mark.timeout(INSTALL_TIMEOUT_S + RUN_TIMEOUT_S)
def test_run_check_never_imports_torch_or_transformers(runtime_venv: Path, tmp_path: Path) -> None:
    report = tmp_path / "imports.json"
    proc = subprocess.run(
        [
            str(runtime_venv / "bin" / "python"),
            "-c",
            _SPY,
            str(report),
            ",".join(sorted(FORBIDDEN_MODULES)),
        ],
        env=_image_env(runtime_venv, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result = json.loads(report.read_text())
    assert result["code"] == 0
    assert result["attempted"] == [], f"the serving path tried to import {result['attempted']}"
    assert result["loaded"] == []
