"""``bench/mypyc_tree.py``: which of the sidecar's modules the compiled copy compiles."""

from __future__ import annotations

from pathlib import Path

from bench.mypyc_tree import MODULES, PACKAGES, PYDANTIC, REFUSED, select
from tests.claims.conftest import REPO


def test_the_selection_leaves_out_packages_pydantic_modules_and_what_mypyc_refuses() -> None:
    compiled, left = select(REPO)
    assert compiled and left
    for module in compiled:
        path = REPO / module
        assert path.is_file() and path.name != "__init__.py"
        assert "pydantic" not in path.read_text(encoding="utf-8")
        assert module.removeprefix("sidecar/") not in REFUSED
    assert "sidecar/pipeline/processor.py" in compiled
    assert left["pipeline/intake.py"] == PYDANTIC  # validates events with pydantic-core
    for rel, why in REFUSED.items():  # the table names modules that still exist
        assert (REPO / "sidecar" / rel).is_file() and left[rel] == why
    listed = {f"sidecar/{m}" for m in MODULES} | {
        p.relative_to(REPO).as_posix()
        for package in PACKAGES
        for p in (REPO / "sidecar" / package).glob("*.py")
        if p.name != "__init__.py"
    }
    assert set(compiled) | {f"sidecar/{rel}" for rel in left} == listed


def test_a_module_is_picked_by_its_text(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / "sidecar" / package).mkdir(parents=True)
    for module in MODULES:
        (tmp_path / "sidecar" / module).write_text("x = 1\n")
    (tmp_path / "sidecar" / "stats" / "__init__.py").write_text("")
    (tmp_path / "sidecar" / "stats" / "plain.py").write_text("y = 2\n")
    (tmp_path / "sidecar" / "stats" / "model.py").write_text("from pydantic import BaseModel\n")
    compiled, left = select(tmp_path)
    assert "sidecar/stats/plain.py" in compiled and "sidecar/stats/__init__.py" not in compiled
    assert left == {"stats/model.py": PYDANTIC}
