"""``guardrail train confidence --rows``: what it says when the rows cannot make a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.lab.confidence.recipe import MIN_ROWS, train_from_rows


def test_too_few_outcome_rows_say_how_many_and_how_to_get_more(tmp_path: Path) -> None:
    """`guardrail train confidence --rows` on the 8 rows of `guardrail dataset outcomes
    --limit 8` said only "8 outcome rows is too few to fit a confidence model"."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("")
    with pytest.raises(ConfigError) as refused:
        train_from_rows(Settings.load(), [rows], tmp_path / "out")
    assert f"at least {MIN_ROWS}" in str(refused.value)
    assert "guardrail dataset outcomes" in str(refused.value)
    assert not (tmp_path / "out").exists()
