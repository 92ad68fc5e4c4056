"""The interpreter and import path the pod's user starts the sidecar with.

The test runs the checkout's project on the checkout's venv, as the pod's uid.
A checkout that uid cannot read - ``mktemp -d`` makes a 0700 directory, and
the venv beneath it is out of reach with it - is staged instead, the way the
image has it: the project's packages and the site-packages files of every
runtime dependency (the project's requirements without extras, closed over
theirs, as the Dockerfile installs them into ``/opt/venv``) are copied, hard
linked where the filesystem allows, under a directory any uid can traverse.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT_DIST = "rag-guardrail-sidecar"
PROJECT_PACKAGES = ("sidecar", "guardrail_client")
SERVING_IMPORTS = "import sidecar.runtime, sidecar.cli.main, numpy, onnxruntime, tokenizers"


@dataclass(frozen=True)
class PodPython:
    """``argv`` starts Python; ``pythonpath`` finds the project and, if staged, its dependencies."""

    argv: tuple[str, ...]
    pythonpath: str
    staged: bool


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_distributions() -> list[metadata.Distribution]:
    """The project's runtime requirements (no extras), closed over their own, as installed."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [PROJECT_DIST]
    while todo:
        name = todo.pop()
        if _key(name) in seen:
            continue
        dist = metadata.distribution(name)
        seen[_key(name)] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [d for k, d in seen.items() if k != _key(PROJECT_DIST)]


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    """A hard link when the file is world-readable (a link shares its mode), else a copy."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if Path(src).stat().st_mode & stat.S_IROTH:
        try:
            os.link(src, dst)
        except OSError:  # another filesystem, or links not allowed there
            pass
        else:
            return
    shutil.copy2(src, dst)
    dst.chmod(dst.stat().st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def stage(root: Path) -> Path:
    """Copy the project and its runtime site-packages under ``root``; returns the import path."""
    site = root / "site-packages"
    for dist in runtime_distributions():
        base = Path(str(dist.locate_file(""))).resolve()
        for rel in dist.files or []:
            src = Path(str(dist.locate_file(rel))).resolve()
            if src.is_file() and src.is_relative_to(base) and src.suffix != ".pth":
                _link_or_copy(src, site / src.relative_to(base))
    project = root / "project"
    for package in PROJECT_PACKAGES:
        shutil.copytree(
            ROOT / package,
            project / package,
            copy_function=_link_or_copy,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    return root


def _imports(argv_prefix: tuple[str, ...], python: tuple[str, ...], pythonpath: str) -> bool:
    probe = subprocess.run(
        [*argv_prefix, *python, "-c", SERVING_IMPORTS],
        env={"PATH": os.defpath, "PYTHONPATH": pythonpath},
        cwd="/",
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def pod_python(argv_prefix: tuple[str, ...], stage_root: Path) -> PodPython:
    """The checkout's venv when the pod's user can import from it, else a staged copy."""
    if _imports(argv_prefix, (sys.executable,), str(ROOT)):
        return PodPython((sys.executable,), str(ROOT), staged=False)
    stage(stage_root)
    # The venv's python sits in the unreadable checkout: its interpreter, found by path.
    python = (os.path.realpath(sys.executable), "-s")
    pythonpath = os.pathsep.join([str(stage_root / "project"), str(stage_root / "site-packages")])
    if not _imports(argv_prefix, python, pythonpath):
        raise AssertionError(f"the staged project in {stage_root} does not import as the pod user")
    return PodPython(python, pythonpath, staged=True)
