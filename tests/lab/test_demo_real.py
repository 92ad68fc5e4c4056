"""``guardrail demo --real N``: what it asks of the real RAG loop (no models loaded here)."""

from __future__ import annotations

import io
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import Settings
from sidecar.lab.demo import REAL_QDRANT, real_records


def test_the_real_demo_keeps_its_embedded_corpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The README says the first run embeds the corpus; every run did (an in-memory Qdrant:
    4-5 min of a 5.7 min `demo --real 3` on 2 busy cores, each time). The demo now keeps
    the collection in out/demo/qdrant, as the reference RAG service keeps its own in
    out/rag_service/qdrant, and a later run reuses it."""
    asked: dict[str, Any] = {}

    def demo_requests(questions: Path, **options: Any) -> list[Any]:
        asked.update(options)
        return []

    service = types.ModuleType("sidecar.lab.generator.service")
    service.demo_requests = demo_requests  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sidecar.lab.generator.service", service)
    assert real_records(Settings.load(), tmp_path / "questions.jsonl.gz", 2, io.StringIO()) == []
    assert asked["n"] == 2
    assert asked["qdrant_path"] == REAL_QDRANT
    assert REAL_QDRANT.parts[0] == "out"  # git-ignored, beside the service's
