"""The shipped lookback models' golden outputs under an emulated AVX2 CPU (QEMU user mode).

onnxruntime picks its kernels by CPUID; ``qemu-x86_64 -cpu Haswell`` (QEMU 7.2
TCG: AVX2 and FMA, no AVX-512) makes it run the AVX2 kernels on a machine with
AVX-512. The claim verifier's check takes more than half an hour under
emulation, so it is not in the suite; by hand (docs/methods.md has the result):
``PYTHONPATH=. qemu-x86_64 -cpu Haswell .venv/bin/python -m sidecar golden check
models/verifier``. The batch-cut tests run there too: onnxruntime's AVX2 kernels also take
another path for a one-row matrix (the cw model's row 3e-8 away from its batch's).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

import pytest

from tests.claims.conftest import REPO

MODELS = [REPO / "models" / "lookback" / n for n in ("smollm2-135m-nq-cw", "smollm2-135m-nq-fc")]


def _under_haswell(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python argv...`` under ``qemu-x86_64 -cpu Haswell``, in the repository."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or platform.machine() != "x86_64":
        pytest.skip("needs an x86_64 host with qemu-user: apt-get install -y qemu-user")
    return subprocess.run(
        [qemu, "-cpu", "Haswell", sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.slow
def test_golden_outputs_hold_under_an_emulated_avx2_cpu() -> None:
    done = _under_haswell("-m", "sidecar", "golden", "check", *map(str, MODELS))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert [m["version"].split("@")[0] for m in report["models"]] == [p.name for p in MODELS]
    for model in report["models"]:
        assert model["max_drift"] is not None and model["max_drift"] <= model["tolerance"], model


@pytest.mark.slow
def test_scores_do_not_hang_on_the_batch_cut_under_an_emulated_avx2_cpu() -> None:
    """tests/lookback/test_batch_cuts.py and tests/confidence/test_batch_cuts.py (the
    shipped models, every cut bit for bit) under ``-cpu Haswell``."""
    files = [REPO / "tests" / d / "test_batch_cuts.py" for d in ("lookback", "confidence")]
    done = _under_haswell("-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, files))
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
