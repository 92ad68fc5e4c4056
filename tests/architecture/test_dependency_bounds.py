"""pyproject.toml declares what the code imports, and the client extra the same bounds.

Offline: read the imports from the source (ast) and the requirements from
pyproject. That the lower bounds work is checked by scripts/check-lower-bounds.sh
(a lowest-direct install from PyPI and the unit tests).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

# imported module -> the distribution that ships it (where the names differ)
DISTRIBUTION = {
    "yaml": "pyyaml",
    "opentelemetry": "opentelemetry-api",
    "prometheus_client": "prometheus-client",
    "pydantic_settings": "pydantic-settings",
    "qdrant_client": "qdrant-client",
}
# imported directly, installed by a declared dependency that always requires it
TRANSITIVE = {"grpc": "opentelemetry-exporter-otlp-proto-grpc"}
# the client's optional import, behind an error that names the extra (guardrail_client/hf.py)
CLIENT_OPTIONAL = {"torch"}
OWN = {"sidecar", "guardrail_client", "tests", "__future__"}


def _pyproject() -> dict[str, list[Requirement]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {name: [Requirement(r) for r in reqs] for name, reqs in groups.items()}


def _imports(paths: Iterable[Path]) -> dict[str, str]:
    """Third-party top-level module -> the first file importing it."""
    found: dict[str, str] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def _missing(imports: dict[str, str], declared: list[Requirement]) -> list[str]:
    names = {canonicalize_name(r.name) for r in declared}
    return sorted(
        f"{module} ({where})"
        for module, where in imports.items()
        if canonicalize_name(DISTRIBUTION.get(module, module)) not in names
        and TRANSITIVE.get(module) not in names
    )


def test_the_serving_path_imports_only_declared_dependencies() -> None:
    files = [p for p in (REPO / "sidecar").rglob("*.py") if "lab" not in p.parts]
    assert _missing(_imports(files), _pyproject()[""]) == []


def test_the_client_extra_declares_everything_the_client_imports() -> None:
    files = [
        *(REPO / "guardrail_client").rglob("*.py"),
        *(REPO / "sidecar" / "contracts").rglob("*.py"),
        REPO / "sidecar" / "exceptions.py",
    ]
    imports = {m: w for m, w in _imports(files).items() if m not in CLIENT_OPTIONAL}
    assert "aiokafka" in imports and "pydantic" in imports  # the scan found the client
    assert _missing(imports, _pyproject()["client"]) == []


def test_the_client_extra_has_the_serving_bounds() -> None:
    """A bound raised for the sidecar (an old version failed) is raised for the client too."""
    groups = _pyproject()
    base = {canonicalize_name(r.name): str(r.specifier) for r in groups[""]}
    client = {canonicalize_name(r.name): str(r.specifier) for r in groups["client"]}
    assert {n: (s, base.get(n)) for n, s in client.items() if base.get(n) != s} == {}
