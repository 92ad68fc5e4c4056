"""Formula sources are cited once, in docs/methods.md: the code's citations resolve there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

METHODS = REPO / "docs" / "methods.md"
# "docs/methods.md §Claim verification", also when a line break or a string
# concatenation ('... docs/methods.md "\n "§Claim ...') falls inside it
CITATION = re.compile(r"docs/methods\.md(?:\s|[\"'])*§")
# the unpublished working documents the code used to cite instead
SEED = re.compile(r"\bseeds? ?0\d\d|\bseed0\d\d", re.IGNORECASE)

PROBE = """
import sys
from sidecar.config import Settings
from sidecar import runtime
import sidecar.kafka.app, sidecar.health
runtime.check(Settings.load())
print("\\n".join(sorted(m for m in sys.modules if m.startswith("sidecar"))))
"""


def _sections() -> list[str]:
    return [
        line.lstrip("#").strip()
        for line in METHODS.read_text("utf-8").splitlines()
        if line.startswith("## ")
    ]


def _cited(text: str) -> list[str]:
    """What follows each citation's ``§``, blanks and quotes collapsed (60 characters)."""
    flat = re.sub(r"[\"']?\s+[\"']?", " ", text)
    return [flat[m.end() : m.end() + 60] for m in CITATION.finditer(flat)]


def _names(cited: str, section: str) -> bool:
    """``cited`` is the whole section name, then punctuation ("§Coverage bound).")."""
    return cited.startswith(section) and cited[len(section) : len(section) + 1] in (".,;:)")


def _citing_files() -> list[Path]:
    return [*sorted((REPO / "sidecar").rglob("*.py")), *sorted((REPO / "schemas").glob("*.json"))]


def test_every_cited_section_of_docs_methods_exists() -> None:
    sections = _sections()
    assert "Retrieval certification" in sections
    unresolved = []
    count = 0
    for path in _citing_files():
        for cited in _cited(path.read_text("utf-8")):
            count += 1
            if not any(_names(cited, section) for section in sections):
                unresolved.append(f"{path.relative_to(REPO)}: §{cited}")
    assert count >= 20, f"only {count} citations found: the pattern no longer matches the code"
    assert unresolved == [], f"sections not in docs/methods.md ({sections}): {unresolved}"


def test_the_citation_pattern_reads_split_citations() -> None:
    text = 'x = ("p (docs/methods.md "\n    "§Calibrated confidence); q")\n'
    text += '"""The rules (docs/methods.md §Claim\nverification)."""'
    assert _cited(text)[0].startswith("Calibrated confidence")
    assert _cited(text)[1].startswith("Claim verification")


def test_serving_modules_cite_docs_methods_not_seed_documents() -> None:
    env = {
        **os.environ,
        "GUARDRAIL_SIGNALS__CLAIMS": "true",
        "GUARDRAIL_MODELS__DIR": str(REPO / "models"),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env, cwd=REPO
    )
    modules = out.stdout.split()
    assert "sidecar.policy.engine" in modules and "sidecar.claims.segment" in modules  # it ran
    citing = []
    for name in modules:
        stem = REPO / Path(*name.split("."))
        path = stem / "__init__.py" if stem.is_dir() else stem.with_suffix(".py")
        if SEED.search(path.read_text("utf-8")):
            citing.append(name)
    assert citing == []
