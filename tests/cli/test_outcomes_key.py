"""``dataset outcomes`` writes events under the served calibration's key, or the one given."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from sidecar.cli.main import main
from sidecar.cli.report import _event_key
from sidecar.config import Settings


def _args(**given: str | None) -> argparse.Namespace:
    return argparse.Namespace(**{k: given.get(k) for k in ("tenant", "collection", "retriever")})


def test_the_shipped_calibrations_key_by_default_and_the_flags_over_it() -> None:
    settings = Settings.load()
    assert _event_key(_args(), settings) == ("default", "nq-open", "qdrant-minilm-l6")
    assert _event_key(_args(collection="mydocs"), settings) == (
        "default",
        "mydocs",
        "qdrant-minilm-l6",
    )


def test_a_teams_own_calibration_gives_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: every row carried default/nq-open/qdrant-minilm-l6, so a team's own
    calibration served them all by its global fallback (unknown-collection)."""
    rng = random.Random(3)
    rows = []
    for _ in range(120):
        top = rng.uniform(0.6, 0.95)
        rows.append({"scores": [top, top - 0.2, top - 0.3], "labels": [True, False, False]})
    data = tmp_path / "s.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cal = tmp_path / "cal.json"
    assert main(
        ["calibrate", "scores", "--data", str(data), "--out", str(cal), "--tenant", "acme",
         "--collection", "docs", "--retriever", "bm25"]
    ) == 0  # fmt: skip
    capsys.readouterr()
    monkeypatch.setenv("GUARDRAIL_SIGNALS__CALIBRATION", str(cal))
    assert _event_key(_args(), Settings.load()) == ("acme", "docs", "bm25")
