"""The serving process imports nothing from the lab (training, datasets, reports, benches)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator

from tests.conftest import REPO

LAB = "sidecar.lab"  # the whole lab: fits, datasets, reports, benches, chaos, the local broker
LAB_MODULE_NAMES = ("training", "datasets", "dataset", "evaluate", "evaluation", "outcomes")
HEAVY = ("torch", "transformers", "sklearn", "matplotlib", "qdrant_client", "tqdm")

PROBE = """
import sys
from sidecar.config import Settings
from sidecar import runtime
import sidecar.cli.main, sidecar.cli.run, sidecar.kafka.app, sidecar.health
sidecar.cli.main.build_parser()  # `guardrail run` builds the whole command line first
runtime.check(Settings.load())
print("\\n".join(sorted(sys.modules)))
"""


def test_guardrail_run_imports_no_lab_module() -> None:
    env = {
        **os.environ,
        "GUARDRAIL_SIGNALS__CLAIMS": "true",
        "GUARDRAIL_MODELS__DIR": str(REPO / "models"),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env, cwd=REPO
    )
    loaded = set(out.stdout.split())
    assert "sidecar.kafka.app" in loaded and "sidecar.claims.verifier" in loaded  # it ran
    assert sorted(m for m in loaded if m == LAB or m.startswith(LAB + ".")) == []
    lab_named = sorted(
        m for m in loaded if m.startswith("sidecar.") and m.rsplit(".", 1)[-1] in LAB_MODULE_NAMES
    )
    assert lab_named == []
    assert sorted(m for m in HEAVY if m in loaded) == []


def _lab_imports(tree: ast.Module) -> Iterator[tuple[ast.stmt, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == LAB or name.startswith(LAB + "."):
                yield node, name
                break


def _lazy_or_typing_only(tree: ast.Module) -> set[int]:
    """Ids of the nodes inside a function, or under a module-level ``if TYPE_CHECKING:``."""
    scopes = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        or (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    ]
    return {id(inner) for scope in scopes for inner in ast.walk(scope)}


def test_no_serving_module_imports_the_lab_and_the_cli_only_lazily() -> None:
    """Statically, so an import inside a function the probe above never calls counts too."""
    found: list[str] = []
    for path in sorted((REPO / "sidecar").rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[:2] == ("sidecar", "lab"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        lazy = _lazy_or_typing_only(tree)
        for node, name in _lab_imports(tree):
            if rel.parts[:2] == ("sidecar", "cli") and id(node) in lazy:
                continue  # a command imports its lab module when it runs
            found.append(f"{rel}:{node.lineno} imports {name}")
    assert found == []
