"""``guardrail train lookback`` end to end on a synthetic dataset; eval's disjointness guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.cli.main import main
from sidecar.exceptions import ConfigError
from sidecar.lab.lookback.evaluation import check_disjoint
from sidecar.lookback.serving import OnnxLookbackScorer
from tests.lookback.conftest import write_dataset


def test_lookback_commands_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    for group in ("dataset", "train", "eval"):
        with pytest.raises(SystemExit) as info:
            main([group, "--help"])
        assert info.value.code == 0
        assert "lookback" in capsys.readouterr().out


def test_train_lookback_writes_a_servable_model(
    dataset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli-fc"
    code = main(
        [
            "train",
            "lookback",
            "--data",
            str(dataset_dir),
            "--variant",
            "fc",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["version"].startswith("cli-fc@")
    assert report["n_train"] + report["n_test"] == report["n"] == 240
    assert 0.5 < report["test_auroc"] <= 1.0
    assert OnnxLookbackScorer.from_dir(out).metadata.variant == "fc"


def test_train_refuses_a_missing_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "lookback", "--data", str(tmp_path), "--out", str(tmp_path / "m")])
    assert code == 1
    assert "not a lookback dataset" in capsys.readouterr().err


def test_eval_must_use_the_held_out_part(cw_model: Path) -> None:
    scorer = OnnxLookbackScorer.from_dir(cw_model)
    trained_on = scorer.metadata.training.questions_sha256
    check_disjoint(scorer, "f" * 64, "fit")  # another question file: allowed, with a warning
    check_disjoint(scorer, trained_on, "eval")
    for part in ("fit", "all"):
        with pytest.raises(ConfigError, match="evaluate on --part eval"):
            check_disjoint(scorer, trained_on, part)
    with pytest.raises(ConfigError, match="may overlap"):
        check_disjoint(scorer, trained_on, "eval", split_seed=1)


def test_eval_lookback_scores_a_recorded_held_out_dataset(
    cw_model: Path, fc_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held_out = write_dataset(tmp_path / "eval", n=80, shard=40, part="eval", seed=11)
    code = main(
        [
            "eval",
            "lookback",
            "--model",
            str(cw_model),
            str(fc_model),
            "--data",
            str(held_out),
            "--json",
        ]
    )
    assert code == 0
    cw, fc = json.loads(capsys.readouterr().out)
    assert (cw["variant"], fc["variant"]) == ("cw", "fc")
    for r in (cw, fc):
        assert r["n"] == 80
        assert 0.0 < r["positive_rate"] < 1.0
        assert r["auroc"] > 0.6
    # The same questions' fit part is refused.
    fit = write_dataset(tmp_path / "fit", n=40, shard=40, part="fit", seed=12)
    assert main(["eval", "lookback", "--model", str(cw_model), "--data", str(fit)]) == 2
    assert "evaluate on --part eval" in capsys.readouterr().err
