"""``guardrail calibrate scores``: a calibration of a team's own retriever, served as is."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sidecar.cli.main import main
from sidecar.config import Settings
from sidecar.conformal.storage import load_artifact
from sidecar.contracts.events import RetrievalEvent
from sidecar.runtime import build_signals


def _retrievals(n: int, seed: int = 0, *, distances: bool = False) -> list[dict[str, object]]:
    """n labelled retrievals of 5 hits, best first; 80% hold one correct, higher-scored hit."""
    rng, rows = random.Random(seed), []
    for i in range(n):
        scores = [rng.uniform(0.1, 0.6) for _ in range(5)]
        labels = [False] * 5
        if rng.random() < 0.8:
            labels[0], scores[0] = True, rng.uniform(0.5, 0.95)
        order = sorted(range(5), key=lambda j: -scores[j])
        row: dict[str, object] = {
            "scores": [round(1 - scores[j] if distances else scores[j], 4) for j in order],
            "labels": [labels[j] for j in order],
        }
        if i % 4 == 0:
            row["retriever"] = "bm25"
        rows.append(row)
    return rows


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_own_scores_are_calibrated_per_key_and_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _write(tmp_path / "own.jsonl", _retrievals(400))
    out = tmp_path / "cal.json"
    code = main(
        ["calibrate", "scores", "--data", str(data), "--out", str(out), "--tenant", "acme",
         "--collection", "docs", "--retriever", "dense-v2", "--embedding-model", "e5-large"]
    )  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["retrievals"] == 400 and summary["certifiable"] is True
    assert summary["keys"] == {"acme/docs/bm25": "own", "acme/docs/dense-v2": "own"}
    assert summary["mixed_scales"] == {}  # one scale: nothing to warn of
    low, high = summary["coverage_spread_90"]
    assert low < 0.9 < high
    artifact = load_artifact(out)
    assert artifact.calibration_id.startswith("dense-v2@docs:")  # the commonest key
    assert artifact.embedding_model_id == "e5-large" and artifact.params_sha256 is not None
    assert artifact.score_kind == "similarity"
    # served: the sidecar certifies that retriever's events with its own calibration
    monkeypatch.setenv("GUARDRAIL_SIGNALS__CALIBRATION", str(out))
    monkeypatch.setenv("GUARDRAIL_SIGNALS__LOOKBACK", "false")
    monkeypatch.setenv("GUARDRAIL_SIGNALS__CONFIDENCE", "false")
    certifier = build_signals(Settings.load()).certifier
    assert certifier is not None
    event = RetrievalEvent.model_validate(
        {
            "request_id": "r1", "tenant": "acme", "collection": "docs", "retriever": "bm25",
            "query": "q", "k": 2,
            "hits": [{"chunk_id": "a", "doc_id": "d", "score": 0.9, "text": "t"},
                     {"chunk_id": "b", "doc_id": "d", "score": 0.2, "text": "t"}],
        }
    )  # fmt: skip
    signal = certifier.certify(event)
    assert signal.fallback is False and signal.calibration_key == "acme/docs/bm25"
    assert signal.trusted_chunk_ids == ["a"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"scores": ["0.9"], "labels": [true]}', "scores must be a list of finite numbers"),
        ('{"scores": [0.9, 1e999], "labels": [true, false]}', "finite numbers"),
        ('{"scores": [0.9], "labels": ["no"]}', "labels must be a list of true/false"),
        ('{"scores": [0.9, 0.5], "labels": [true]}', "2 scores but 1 labels"),
        ('{"scores": [0.9], "labels": [true], "tenat": "x"}', "unknown field(s) ['tenat']"),
        ('{"scores": [0.9], "labels": [true], "tenant": ""}', "tenant must be a non-empty"),
        ("[0.9, true]", "a JSON object is needed"),
        ("{not json", "not JSON"),
    ],
)
def test_a_bad_line_is_named_by_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    rows = [json.dumps(r) for r in _retrievals(3)]
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join([*rows, line, *rows]) + "\n")
    assert main(["calibrate", "scores", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "line 4" in err and message in err
    assert not (tmp_path / "o").exists()


def test_files_that_are_not_json_lines_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: a JSON array said 'line 1: not JSON'; UTF-16 was blamed on line 2; a file
    of empty lists failed in the normaliser without naming the data."""
    cases = {
        "array.json": (json.dumps(_retrievals(3)).encode(), "is a JSON array"),
        "utf16.jsonl": (
            "".join(json.dumps(r) + "\n" for r in _retrievals(3)).encode("utf-16"),
            "is UTF-16",
        ),
        "empty.jsonl": (b'{"scores": [], "labels": []}\n' * 3, "no line has any hit"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        args = ["calibrate", "scores", "--data", str(tmp_path / name), "--out", str(tmp_path / "o")]
        assert main(args) == 2, name
        assert message in capsys.readouterr().err, name


def test_a_distance_key_in_a_mixed_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _retrievals(300)
    for row in _retrievals(300, seed=1, distances=True):
        row["retriever"] = "l2"
        rows.append(row)
    data = _write(tmp_path / "mixed.jsonl", rows)
    assert main(["calibrate", "scores", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "key default/default/l2: " in err and "look like distances" in err
    assert "default/default/bm25" not in err


def test_distances_and_empty_files_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _write(tmp_path / "l2.jsonl", _retrievals(400, distances=True))
    assert main(["calibrate", "scores", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    assert "look like distances" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert main(["calibrate", "scores", "--data", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "holds no labelled retrieval" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_keys_on_another_scale_than_the_pool_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: 0..1 and 0..1000 retrievers in one file; the global calibration (served to
    every key without its own) mixed the scales and said nothing."""
    rows = _retrievals(200)
    for row in rows[:100]:
        row["retriever"] = "bm25-raw"
        row["scores"] = [round(float(v) * 1000, 2) for v in row["scores"]]  # type: ignore[attr-defined]
    for row in rows[100:]:
        row["retriever"] = "dense"
    data = _write(tmp_path / "mixed.jsonl", rows)
    code = main(["calibrate", "scores", "--data", str(data), "--out", str(tmp_path / "c.json")])
    assert code == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert list(summary["mixed_scales"]) == ["default/default/dense"]
    assert "mixes their scales" in captured.err
