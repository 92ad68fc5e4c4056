"""``bench/evidence_settings.py``: each setting scores a claim as the sidecar serves it, and the
paired bootstrap's AUROC is the project's AUROC of each resample."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from bench.evidence_settings import (
    Setting,
    SettingScorer,
    accuracy_by_threshold,
    evaluate_form,
    paired_bootstrap,
    resampled_auroc,
    sample_items,
    summarise,
)
from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex
from sidecar.claims.verifier import OnnxVerifier, save_artifact
from sidecar.lab.verifier.evaluate import PairItem, score_pair_items
from sidecar.lab.verifier.pairs import build_eval_sets
from sidecar.lab.verifier.sources import read_halueval_qa
from sidecar.stats.metrics import auroc
from tests.claims.conftest import DATA, REPO

MODEL = REPO / "models" / "verifier"


@pytest.fixture(scope="module")
def verifier() -> OnnxVerifier:
    return OnnxVerifier.load(MODEL, threads=1)


def _items(n: int) -> list[PairItem]:
    """QA pairs of the held-out slice, each record's knowledge whole and padded with the
    knowledge of the next records: evidence long enough for several windows."""
    records = read_halueval_qa(DATA / "halueval_qa_test_slice.jsonl")
    pairs = build_eval_sets(records, split="test", seed=1, whole_evidence=True)
    chosen = sample_items(pairs["length-matched-qa"], n, seed=0)
    padding = " ".join(r.knowledge for r in records[:6])
    return [
        PairItem(p.claim, f"{p.evidence} {padding}", p.label, p.question, p.item_id) for p in chosen
    ]


def test_a_setting_scores_claims_as_the_served_path_does(
    verifier: OnnxVerifier, tmp_path: Path
) -> None:
    items = _items(12)
    scorer = SettingScorer(verifier, MODEL)
    served = Setting(
        verifier.artifact.evidence_max_chars,
        verifier.artifact.evidence_max_windows,
        verifier.artifact.max_length,
    )
    short = Setting(320, 2, 128)
    scored = evaluate_form(scorer, items, [served, short], progress=False, desc="qa")
    expected = score_pair_items(
        verifier, items, max_windows=served.max_windows, window_chars=served.window_chars
    )
    assert [s.p for s in scored[served.name]] == pytest.approx(expected, abs=1e-9)
    assert any(s.windows > 1 for s in scored[served.name])  # the padding made several windows
    # another setting: its own windows and truncation, still the served scoring (the artifact
    # loaded with max_length 128; its golden logits were recorded at 192)
    folder = tmp_path / "verifier-128"
    folder.mkdir()
    for name in (verifier.artifact.onnx_file, verifier.artifact.tokenizer_file):
        (folder / name).symlink_to(MODEL / name)
    save_artifact(folder, verifier.artifact.model_copy(update={"max_length": 128}))
    shorter = OnnxVerifier.load(folder, threads=1, check_golden=False)
    windows = [
        EvidenceIndex([EvidenceChunk("evidence", i.evidence)]).windows(
            i.claim, i.question, max_windows=2, max_chars=320
        )
        for i in items
    ]
    assert [s.windows for s in scored[short.name]] == [len(w) for w in windows]
    assert [s.p for s in scored[short.name]] == pytest.approx(
        shorter.window_probabilities(
            [i.claim for i in items], windows, [i.question for i in items]
        ),
        abs=1e-9,
    )
    for s in scored[short.name]:
        assert s.tokens <= 128 * s.windows and s.ms > 0.0
    rows = summarise(items, scored, verifier.band, served.name)
    assert "auroc_diff_ci95" in rows[short.name] and "auroc_diff_ci95" not in rows[served.name]
    assert rows[served.name]["windows_per_claim"] > 1.0


def test_the_resampled_auroc_is_the_auroc_of_each_resample() -> None:
    rng = np.random.default_rng(3)
    scores = np.round(rng.random(80), 1)  # many ties
    labels = rng.integers(0, 2, 80)
    draws = rng.integers(0, 80, (40, 80))
    got = resampled_auroc(scores, labels, draws)
    assert got.tolist() == pytest.approx([auroc(scores[d], labels[d]) for d in draws], abs=1e-12)


def test_the_bootstrap_interval_holds_zero_for_equal_scores_and_not_for_a_better_one() -> None:
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, 300)
    noisy = labels + rng.normal(0.0, 1.5, 300)
    cleaner = labels + rng.normal(0.0, 0.3, 300)
    same = paired_bootstrap(noisy, noisy.copy(), labels, 0.5, draws=300)
    assert same == {"auroc_diff_ci95": [0.0, 0.0], "accuracy_diff_ci95": [0.0, 0.0]}
    better = paired_bootstrap(noisy, cleaner, labels, 0.5, draws=300)
    assert better["auroc_diff_ci95"][0] > 0.0 and better["accuracy_diff_ci95"][0] > 0.0


def test_accuracy_by_threshold_counts_supported_from_each_threshold_on() -> None:
    probs = np.array([0.31, 0.45, 0.5, 0.69, 0.2])
    labels = np.array([0, 1, 1, 1, 0])
    got = accuracy_by_threshold(probs, labels)
    assert list(got) == [f"{0.3 + 0.02 * k:.2f}" for k in range(21)]
    # 0.30: 0.31 is called supported (wrong); 0.32 .. 0.44: all right; 0.46: 0.45 missed
    assert (got["0.30"], got["0.32"], got["0.44"], got["0.46"]) == (0.8, 1.0, 1.0, 0.8)
    assert got["0.50"] == 0.8 and got["0.52"] == 0.6 and got["0.70"] == 0.4


def test_a_setting_reads_chars_windows_tokens() -> None:
    assert Setting.parse("640x3x192") == Setting(640, 3, 192)
    assert Setting.parse("480X2X160").name == "480x2x160"
    for bad in ("640x3", "ax3x192", "640x0x192", "640x3x1024"):
        with pytest.raises(argparse.ArgumentTypeError):
            Setting.parse(bad)
