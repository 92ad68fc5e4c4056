"""Is compiled code the cheaper fast path? The sidecar's modules compiled by mypyc (#22).

Copies this checkout's ``sidecar/`` and ``pyproject.toml`` (mypy's configuration) to
``--out`` and compiles there, with mypyc at ``-O3``, every module of the packages the
fast path runs through that mypyc compiles as it stands; the rest stay Python
(:data:`REFUSED` says why each one is left out; a module that uses pydantic models is
left out as a class). The copy is importable with ``PYTHONPATH=OUT`` ahead of the
installed tree, so the benches that take a tree compare it with this one::

    .venv/bin/python bench/mypyc_tree.py --out /tmp/compiled          # ~3 min, 2 cores
    .venv/bin/python bench/mypyc_tree.py --out /tmp/compiled --measure 4 \\
        --json bench/results/mypyc_processor.json                     # processor, alternated
    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 4 --requests 10000 \\
        --b-env PYTHONPATH=/tmp/compiled --out bench/results/mypyc_drains.json

``--measure N`` runs ``bench/processor_batches.py`` (200-character chunks, batches of 50,
best of 5 passes) N times on each tree, alternated, each in a fresh process pinned to the
last core, and writes each run and the per-pair ratio compiled / Python. Not a shipped
build: the image and ``make setup`` run the Python modules.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sidecar.lab.bench.ratios import machine

ROOT = Path(__file__).resolve().parents[1]

# The packages and modules a fast-path request runs through (intake, scoring, deciding,
# the Kafka loop, telemetry); the claim check is not on the fast path.
PACKAGES = (
    "pipeline", "policy", "lookback", "confidence", "conformal", "contracts", "stats",
    "kafka", "dlq",
)  # fmt: skip
MODULES = ("stage_durations.py", "telemetry.py", "keyed_gauges.py", "lograte.py")

# What mypyc 2.4 refuses, by module (found by compiling them: the first error each gives).
REFUSED = {
    "kafka/app.py": "continue inside try/finally block is unimplemented",
    "kafka/assignor.py": 'cannot access instance attribute "version" through class object',
    "kafka/clients.py": "`del` of an unused argument: '\"topics\" cannot be deleted'",
    "kafka/dlq.py": "async generators are unimplemented",
    "kafka/scan.py": "async generators are unimplemented",
    "kafka/security.py": "inheriting from most builtin types is unimplemented",
}
PYDANTIC = (
    "uses pydantic: mypyc's C for its model classes does not compile "
    "('CPyModule_pydantic___main' undeclared)"
)

SETUP = """\
import sys
from mypyc.build import mypycify
from setuptools import setup

paths, sys.argv = sys.argv[3:], sys.argv[:3]  # build_ext --inplace, then the modules
setup(name="sidecar-mypyc", packages=[], ext_modules=mypycify(paths, opt_level="3"))
"""


def select(tree: Path) -> tuple[list[str], dict[str, str]]:
    """The modules of ``tree``'s ``sidecar/`` to compile, and those left out with why."""
    compiled: list[str] = []
    left: dict[str, str] = {}
    package = tree / "sidecar"
    files = [f for p in PACKAGES for f in sorted((package / p).glob("*.py"))]
    files += [package / m for m in MODULES]
    for path in files:
        rel = path.relative_to(package).as_posix()
        if path.name == "__init__.py":
            continue  # packages stay Python: their re-exports are what tests patch
        if rel in REFUSED:
            left[rel] = REFUSED[rel]
        elif "pydantic" in path.read_text(encoding="utf-8"):
            left[rel] = PYDANTIC
        else:
            compiled.append(f"sidecar/{rel}")
    return compiled, left


def build(out: Path) -> dict[str, Any]:
    """Copy the tree to ``out`` and compile :func:`select`'s modules in place."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(ROOT / "sidecar", out / "sidecar", ignore=shutil.ignore_patterns("*.so"))
    shutil.copy2(ROOT / "pyproject.toml", out / "pyproject.toml")
    compiled, left = select(out)
    (out / "setup_mypyc.py").write_text(SETUP, encoding="utf-8")
    argv = [sys.executable, "setup_mypyc.py", "build_ext", "--inplace", *compiled]
    print(f"compiling {len(compiled)} modules with mypyc (left out: {len(left)})", flush=True)
    done = subprocess.run(argv, cwd=out, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"mypyc build failed ({done.returncode})")
    built = sorted(p.relative_to(out).as_posix() for p in (out / "sidecar").rglob("*.so"))
    return {"compiled": compiled, "extensions": len(built), "left_out": left}


def _processor_ms(tree: Path | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    last_core = str((os.cpu_count() or 1) - 1)
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "r.json"
        argv = ["taskset", "-c", last_core, sys.executable, "bench/processor_batches.py"]
        argv += ["--chars", "200", "--out", str(result)]
        subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
        best: float = json.loads(result.read_text())["results"][0]["best_ms"]
    return best


def measure(tree: Path, pairs: int) -> dict[str, Any]:
    """``processor_batches`` on this tree and on ``tree``, alternated ``pairs`` times."""
    python: list[float] = []
    compiled: list[float] = []
    for p in range(pairs):
        for side in ("python", "compiled") if p % 2 == 0 else ("compiled", "python"):
            ms = _processor_ms(tree if side == "compiled" else None)
            (compiled if side == "compiled" else python).append(ms)
            print(p, side, ms, flush=True)
    ratios = [round(c / py, 3) for c, py in zip(compiled, python, strict=True)]
    return {
        "what": "processor.on_batch ms per request (batches of 50, 200-char chunks, best of "
        "5 passes), this tree's Python vs the mypyc-compiled copy, alternated",
        "python_ms": python,
        "compiled_ms": compiled,
        "compiled_vs_python": ratios,
        "compiled_vs_python_median": round(statistics.median(ratios), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the compiled copy goes")
    parser.add_argument("--measure", type=int, default=0, metavar="PAIRS")
    parser.add_argument("--json", type=Path, help="write the build and measurement here")
    args = parser.parse_args()

    report: dict[str, Any] = {"build": build(args.out.resolve())}
    if args.measure:
        report["processor"] = measure(args.out.resolve(), args.measure)
    report.update(machine())
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
