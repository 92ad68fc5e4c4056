"""Training pairs where length does not predict the label; metrics; the split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sidecar.claims.calibration import Band, coverage
from sidecar.contracts.events import ClaimLabel
from sidecar.exceptions import ConfigError, InputError
from sidecar.lab.verifier.calibration import band_table, fit_band, fit_platt
from sidecar.lab.verifier.datasets import length_auroc
from sidecar.lab.verifier.metrics import binary_report
from sidecar.lab.verifier.pairs import build_eval_sets, build_training_pairs, declarative_right
from sidecar.lab.verifier.sources import QARecord, read_halueval_qa, read_nq_open, split_of
from sidecar.stats.metrics import auroc
from tests.claims.conftest import DATA

SLICE = DATA / "halueval_qa_test_slice.jsonl"


def test_the_split_is_a_stable_function_of_the_question() -> None:
    assert split_of("Who wrote Frankenstein?") == split_of("  who wrote frankenstein?  ")
    shares = [split_of(f"question {k}") for k in range(3000)]
    assert 0.08 < shares.count("test") / 3000 < 0.12
    assert 0.08 < shares.count("val") / 3000 < 0.12


def test_the_raw_benchmark_leaks_length_and_the_balanced_sets_do_not() -> None:
    records = read_halueval_qa(SLICE)
    sets = build_eval_sets(records, split="test", seed=1)
    assert length_auroc(sets["natural"]) > 0.65  # the HaluEval artefact, kept on purpose
    for name in ("length-matched-qa", "length-matched-decl", "sentences"):
        pairs = sets[name]
        assert pairs and abs(sum(p.label for p in pairs) / len(pairs) - 0.5) < 0.05
        assert abs(length_auroc(pairs) - 0.5) < 0.1, name
    train = build_training_pairs(records, [], "test", seed=0)
    assert abs(length_auroc(train) - 0.5) < 0.1
    kinds = {p.kind for p in train}
    assert {"qa-right", "decl-right", "decl-hallucinated", "sent-in"} <= kinds


def test_every_pair_keeps_its_question_and_selection_can_ignore_it() -> None:
    records = read_halueval_qa(SLICE)
    train = build_training_pairs(records, [], "test", seed=0)
    assert train and all(p.question == p.group and p.question for p in train)
    aware = build_eval_sets(records, split="test", seed=1)
    blind = build_eval_sets(records, split="test", seed=1, question_aware=False)
    for name in aware:  # same claims and labels; only the evidence ranking may differ
        assert [(p.claim, p.label) for p in aware[name]] == [
            (p.claim, p.label) for p in blind[name]
        ]


def test_declarative_positive_from_a_hallucinated_answer() -> None:
    record = QARecord(
        knowledge="Taxi Driver is a 1976 film directed by Martin Scorsese.",
        question="Who directed Taxi Driver?",
        right_answer="Martin Scorsese",
        hallucinated_answer="The film was directed by Paul Schrader.",
    )
    assert declarative_right(record) == "The film was directed by Martin Scorsese."
    dated = QARecord("k", "Who starred?", "July 5, 1984", "The actor is named Kim Bong-hoe.")
    assert declarative_right(dated) is None  # a name is not replaced by a date


def test_readers_reject_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"knowledge": "k", "question": "q"}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="field 'right_answer' must be a string"):
        read_halueval_qa(path)
    path.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(InputError, match="not JSON"):
        read_halueval_qa(path)
    nq = tmp_path / "nq.jsonl"
    nq.write_text(
        json.dumps({"question": "q", "answers": ["a"], "ctxs": [{"title": "t", "text": "a b"}]}),
        encoding="utf-8",
    )
    assert read_nq_open(nq)[0].passage == "a b"


def test_auroc_and_report_by_hand() -> None:
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([1.0, 1.0], [0, 1]) == pytest.approx(0.5)  # ties count half
    report = binary_report([0.9, 0.2, 0.6, 0.4], [1, 0, 0, 1])
    assert (report.accuracy, report.precision, report.recall) == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("spread", [1.0, 3.0, 8.0, 20.0])
def test_platt_fit_converges_on_over_confident_logits(spread: float) -> None:
    # A network right about its classes but over-confident by ``spread``: the plain Newton
    # fit from scale 1 diverged from spread 3 on (scale 63, bias -2.8e11).
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, spread, 4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-(z / spread - 1 / 3)))).astype(int)
    platt = fit_platt(z.tolist(), [0.0] * 4000, y.tolist())
    assert platt.logit_scale == pytest.approx(1 / spread, rel=0.15)
    assert platt.bias == pytest.approx(-1 / 3, abs=0.15)


def test_calibration_and_band() -> None:
    logits = [4.0, 3.0, 2.0, -2.0, -3.0, -4.0, 1.0, -1.0, 0.5, -0.5] * 3
    labels = [1, 1, 0, 0, 0, 0, 1, 0, 1, 0] * 3
    flat = fit_platt(logits, [0.5] * 30, labels)
    assert flat.logit_scale > 0 and abs(flat.coverage_weight) < 1e-6 + 1.0
    covered = [1.0 if y else 0.0 for y in labels]  # coverage alone separates the classes
    platt = fit_platt([0.0] * 30, covered, labels)
    assert platt.coverage_weight > 2.0
    assert platt.probability([0.0], [1.0])[0] > 0.8
    assert platt.probability([0.0], [0.0])[0] < 0.2
    assert coverage("Paris hosted 2 games.", "In 2024 Paris hosted 2 games.") == 1.0
    assert coverage("Lyon hosted 3 games.", "Paris hosted 2 games.") == pytest.approx(2 / 5)
    band = fit_band(
        [0.95, 0.9, 0.8, 0.6, 0.5, 0.4, 0.2, 0.1, 0.05] * 3, [1, 1, 1, 0, 1, 0, 0, 0, 0] * 3
    )
    assert band.label(0.99) is ClaimLabel.SUPPORTED and band.label(0.01) is ClaimLabel.UNSUPPORTED
    assert band.unsupported_below <= band.supported_from
    with pytest.raises(ConfigError, match="unsupported_below <= supported_from"):
        Band(0.8, 0.2)
    assert Band(0.3, 0.7).label(0.5) is ClaimLabel.UNCERTAIN


def test_the_band_table_fits_one_band_per_target_on_the_same_pairs() -> None:
    probs = [0.95, 0.9, 0.8, 0.7, 0.6, 0.55, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05] * 4
    labels = [1, 1, 1, 0, 1, 1, 0, 1, 0, 0, 0, 0] * 4
    table = band_table(probs, labels, (0.9, 0.7, 0.8, 0.8))
    assert [b.target_precision for b in table] == [0.7, 0.8, 0.9]  # sorted, once each
    for entry in table:
        assert entry.band == fit_band(probs, labels, entry.target_precision)
        inside = sum(entry.unsupported_below <= p < entry.supported_from for p in probs)
        assert entry.uncertain_share == pytest.approx(inside / len(probs), abs=1e-4)
    # a stricter precision never narrows the band on these pairs
    assert table[0].uncertain_share <= table[1].uncertain_share <= table[2].uncertain_share
    assert table[2].uncertain_share > 0.0


def test_each_end_of_a_wide_band_holds_its_target_and_stricter_targets_nest() -> None:
    """Audit: bands wider than 0.5 were re-centred, so "supported" missed its target precision
    (0.84 at 0.85, 0.9 and 0.95) and the 0.95 band was looser than the 0.9 one."""
    rng = np.random.default_rng(11)
    labels = (rng.random(4_000) < 0.5).astype(int)
    probs = np.clip(np.where(labels == 1, rng.beta(3, 2, 4_000), rng.beta(2, 3, 4_000)), 0, 1)
    bands = {t: fit_band(probs.tolist(), labels.tolist(), t) for t in (0.85, 0.9, 0.95)}
    for target, band in bands.items():
        supported = probs >= band.supported_from
        unsupported = probs < band.unsupported_below
        assert labels[supported].mean() >= target, (target, band)
        assert (1 - labels[unsupported]).mean() >= target, (target, band)
    assert bands[0.85].supported_from <= bands[0.9].supported_from <= bands[0.95].supported_from
    assert (
        bands[0.85].unsupported_below
        >= bands[0.9].unsupported_below
        >= bands[0.95].unsupported_below
    )
