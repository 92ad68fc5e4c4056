"""``guardrail eval claims --format pairs``: the reader, the metrics by hand, the command."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from sidecar.claims.calibration import Band
from sidecar.cli.main import main
from sidecar.exceptions import InputError
from sidecar.lab.verifier.evaluate import PairItem, pair_report, read_pair_items, score_pair_items
from sidecar.lab.verifier.metrics import balanced_accuracy
from tests.claims.conftest import REPO

MODEL = REPO / "models" / "verifier"


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_reader_takes_optional_question_and_id(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "p.jsonl",
        [
            {"evidence": "E1", "claim": "C1", "label": 1, "question": "Q?", "id": 7},
            {"evidence": "E2", "claim": "C2", "label": 0},
        ],
    )
    assert read_pair_items(path) == [
        PairItem("C1", "E1", 1, "Q?", "7"),
        PairItem("C2", "E2", 0, "", ""),
    ]
    assert len(read_pair_items(path, limit=1)) == 1


@pytest.mark.parametrize(
    ("row", "wrong"),
    [
        ({"evidence": "E", "claim": "C", "label": 2}, "label (1 or 0"),
        ({"evidence": "E", "claim": "C", "label": "1"}, "label (1 or 0"),
        ({"claim": "C", "label": 1}, "evidence"),
        ({"evidence": "E", "claim": "C", "label": 1, "question": 3}, "question"),
    ],
)
def test_the_reader_names_the_wrong_field(
    tmp_path: Path, row: dict[str, object], wrong: str
) -> None:
    with pytest.raises(InputError, match=r"p\.jsonl:1: format pairs needs") as err:
        read_pair_items(_write(tmp_path / "p.jsonl", [row]))
    assert wrong in str(err.value)


def test_metrics_at_the_served_threshold_by_hand() -> None:
    items = [PairItem(c, "e", y) for c, y in (("aa", 1), ("bbbb", 1), ("cc", 1), ("dddd", 0))]
    probs = [0.9, 0.75, 0.5, 0.8]
    out = pair_report(probs, items, Band(0.3, 0.7))
    # served: supported when p >= 0.7 -> predicted [1, 1, 0, 1]; labels [1, 1, 1, 0]
    assert out["threshold"] == 0.7
    assert out["accuracy"] == 0.5
    assert out["precision"] == pytest.approx(0.6667, abs=1e-4)
    assert out["recall"] == pytest.approx(0.6667, abs=1e-4)
    assert out["balanced_accuracy"] == pytest.approx((2 / 3 + 0) / 2, abs=1e-4)
    assert out["auroc"] == pytest.approx(1 / 3, abs=1e-4)  # only 0.9 beats the negative's 0.8
    # ECE, 10 bins: {0.5}: |1 - 0.5|, {0.75}: |1 - 0.75|, {0.8}: |0 - 0.8|, {0.9}: |1 - 0.9|
    assert out["ece"] == pytest.approx((0.5 + 0.25 + 0.8 + 0.1) / 4, abs=1e-4)
    assert out["uncertain_share"] == 0.25  # p = 0.5 is in the band
    assert out["length_auroc"] == pytest.approx(5 / 6, abs=1e-4)  # the long one is unsupported
    assert balanced_accuracy([0.9, 0.1], [1, 1], 0.5) != balanced_accuracy([0.9, 0.1], [1, 0], 0.5)


class _Longest:
    """Scores a window by its length: the longest window should win."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def window_probabilities(
        self,
        claims: Sequence[str],
        windows: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> list[float]:
        self.seen = [list(ws) for ws in windows]
        return [max((len(w) / 1000 for w in ws), default=0.0) for ws in windows]


def test_each_claim_is_scored_against_its_windows_within_the_budget() -> None:
    doc = " ".join(f"Sentence {k} mentions the river Danube and {k} bridges." for k in range(40))
    scorer = _Longest()
    probs = score_pair_items(
        scorer, [PairItem("The Danube has 3 bridges.", doc, 1)], max_windows=3, window_chars=200
    )
    assert len(scorer.seen[0]) == 3 and all(len(w) <= 200 for w in scorer.seen[0])
    assert probs[0] == pytest.approx(max(len(w) for w in scorer.seen[0]) / 1000)


def test_the_command_on_a_pairs_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    evidence = "Mary Shelley wrote Frankenstein. It was published in 1818 in London."
    rows = [
        {"evidence": evidence, "claim": "Mary Shelley wrote Frankenstein.", "label": 1},
        {"evidence": evidence, "claim": "Frankenstein was published in Paris.", "label": 0},
        {"evidence": evidence, "claim": "1818", "label": 1, "question": "When was it published?"},
        {"evidence": evidence, "claim": "1823", "label": 0, "question": "When was it published?"},
    ]
    path = _write(tmp_path / "p.jsonl", rows)
    args = ["eval", "claims", "--data", str(path), "--format", "pairs", "--model", str(MODEL)]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 4 and out["supported"] == 2 and out["format"] == "pairs"
    keys = ("accuracy", "balanced_accuracy", "precision", "recall", "f1", "auroc", "ece")
    assert all(0.0 <= out[k] <= 1.0 for k in (*keys, "length_auroc"))


def test_pairs_are_checked_as_served_with_the_rule_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: --format pairs scored the verifier alone; a claim whose year the evidence
    contradicts is capped by the served rule tier, and the report must show that."""
    evidence = "Bernard Hill (born 17 December 1944) is an English actor."
    rows = [
        {"evidence": evidence, "claim": "Bernard Hill was born on 17 December 1944.", "label": 1},
        {"evidence": evidence, "claim": "Bernard Hill was born on 17 December 1945.", "label": 0},
    ]
    path = _write(tmp_path / "years.jsonl", rows)
    args = ["eval", "claims", "--data", str(path), "--format", "pairs", "--model", str(MODEL)]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rule_overrides"] == 1  # the shifted year is capped at RULE_CAP, not the true one
    assert set(out["verifier_only"]) == {"accuracy", "auroc", "f1"}


def test_a_blank_claim_is_refused_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", [{"evidence": "Text.", "claim": "  ", "label": 1}])
    with pytest.raises(InputError, match=r"p.jsonl:1: .*claim \(not blank"):
        read_pair_items(path)


def test_the_served_verifier_and_band_are_measured_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit: --model defaulted to the relative models/verifier and the band to the
    artifact's own, whatever GUARDRAIL_MODELS__DIR and the served target precision were."""
    from sidecar.claims.verifier import load_artifact

    rows = [{"evidence": "Mary Shelley wrote Frankenstein.", "claim": "She wrote it.", "label": 1}]
    path = _write(tmp_path / "p.jsonl", rows)
    monkeypatch.chdir(tmp_path)  # no models/ here
    monkeypatch.setenv("GUARDRAIL_MODELS__DIR", str(MODEL.parent))
    monkeypatch.setenv("GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION", "0.9")
    assert main(["eval", "claims", "--data", str(path), "--format", "pairs", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["threshold"] == load_artifact(MODEL).band_for(0.9).supported_from
