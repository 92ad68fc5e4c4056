"""onnxruntime's usage telemetry is off in the sidecar's processes, and only there.

onnxruntime 1.32 starts it at import: the first session wrote a device id and an event
database under ``$HOME/.cache/Microsoft/DeveloperTools/`` and a ``.ses`` file into the
working directory. The sidecar imports onnxruntime through ``sidecar.onnxrt``, which sets
``ORT_DISABLE_TELEMETRY=1`` unless the environment says otherwise; the guardrail client,
which an LLM service imports, leaves that variable alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from packaging.version import Version

from tests.conftest import REPO

LOAD_SHIPPED_MODELS = """
from importlib.metadata import version
from pathlib import Path

from packaging.version import Version
from sidecar.claims.verifier import OnnxVerifier
from sidecar.lookback.serving import OnnxLookbackScorer
models = Path({models!r})
OnnxVerifier.load(models / "verifier")
OnnxLookbackScorer.from_dir(models / "lookback" / "smollm2-135m-nq-cw")
"""


# onnxruntime 1.32 keeps its telemetry off where one of these says it runs under CI (found
# in its library's strings; ``CI`` by trying), and writes under XDG_CACHE_HOME when set. A
# CI runner's environment would make the tests below pass whatever the sidecar did, so the
# child processes run without them.
CI_MARKERS = (
    "CI",
    "TF_BUILD",
    "GITHUB_ACTIONS",
    "GITLAB_CI",
    "CIRCLECI",
    "TRAVIS",
    "JENKINS_URL",
    "CODEBUILD_BUILD_ID",
    "BUILDKITE",
    "TEAMCITY_VERSION",
    "APPVEYOR",
    "BITBUCKET_BUILD_NUMBER",
)


def _written_by(code: str, home: Path, **env: str) -> list[str]:
    """Files ``code`` leaves under ``home`` (its HOME, cache home and working directory),
    run as it would be outside CI."""
    dropped = {"ORT_DISABLE_TELEMETRY", *CI_MARKERS}
    base = {k: v for k, v in os.environ.items() if k not in dropped}
    cache = {"XDG_CACHE_HOME": str(home / ".cache")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=base | {"HOME": str(home), "PYTHONPATH": str(REPO)} | cache | env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())


def test_loading_the_shipped_models_writes_nothing(tmp_path: Path) -> None:
    code = LOAD_SHIPPED_MODELS.format(models=str(REPO / "models"))
    assert _written_by(code, tmp_path) == []


def test_a_deployment_that_wants_the_telemetry_keeps_it(tmp_path: Path) -> None:
    """``ORT_DISABLE_TELEMETRY=0`` set by the deployment is not overridden; with the
    onnxruntime this was measured on, the files then appear (what the default prevents)."""
    code = LOAD_SHIPPED_MODELS.format(models=str(REPO / "models"))
    code += "import os; open('variable', 'w').write(os.environ['ORT_DISABLE_TELEMETRY'])\n"
    written = _written_by(code, tmp_path, ORT_DISABLE_TELEMETRY="0")
    assert (tmp_path / "variable").read_text() == "0"
    if Version(version("onnxruntime")) >= Version("1.32"):
        assert any("onnxruntime" in name for name in written), written


def test_the_client_leaves_the_services_environment_alone(tmp_path: Path) -> None:
    code = "import os, guardrail_client; print(os.environ.get('ORT_DISABLE_TELEMETRY'))"
    base = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=base | {"PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "None"
