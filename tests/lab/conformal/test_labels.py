"""Ground-truth labels per eq. (1)."""

from __future__ import annotations

import pytest

from sidecar.exceptions import ConfigError, InputError
from sidecar.lab.conformal.labels import label_chunks
from sidecar.lab.conformal.rouge import rouge_l

DOCS = [["d1", "d2", "d1"], ["d3", "d1"]]
GOLD = [{"d1"}, {"d3"}]
TEXTS = [
    ["the answer is paris", "berlin is a city", "france has many cities"],
    ["paris is in france", "the capital is paris"],
]
REFS = [["paris"], ["france"]]


def test_beta_zero_is_document_id_only() -> None:
    gt = label_chunks(DOCS, GOLD, beta=0.0)
    assert gt.labels == ((True, False, True), (True, False))
    assert gt.s_thres is None
    assert (gt.n_affiliated, gt.n_correct) == (3, 3)


def test_beta_percentile_of_non_affiliated_similarities() -> None:
    # Non-affiliated chunks: "berlin is a city" vs "paris" -> 0; "the capital is paris" vs
    # "france" -> 0. P_beta of {0, 0} is 0, so every affiliated chunk with h >= 0 passes.
    gt = label_chunks(DOCS, GOLD, beta=0.99, texts=TEXTS, references=REFS)
    assert gt.s_thres == 0.0
    assert gt.labels == ((True, False, True), (True, False))


def test_threshold_rejects_affiliated_chunks_below_it() -> None:
    # A non-affiliated chunk that mentions the answer raises s_thres above the affiliated
    # chunk that does not mention it.
    docs = [["gold", "other", "gold"]]
    texts = [["paris", "paris is nice", "no mention here at all"]]
    gt = label_chunks(docs, [{"gold"}], beta=1.0, texts=texts, references=[["paris"]])
    assert gt.s_thres == pytest.approx(rouge_l("paris is nice", "paris"))  # only one value
    assert gt.labels == ((True, False, False),)


def test_reused_threshold_from_calibration() -> None:
    gt = label_chunks(DOCS, GOLD, beta=0.5, texts=TEXTS, references=REFS, s_thres=0.9)
    # h("the answer is paris", "paris") = 2*(1/4)/(1/4+1) = 0.4 < 0.9; only exact matches pass
    assert gt.s_thres == 0.9
    assert gt.labels == ((False, False, False), (False, False))


@pytest.mark.parametrize("beta", [-0.1, 1.5, 99.0, float("nan")])
def test_beta_out_of_range(beta: float) -> None:
    with pytest.raises(ConfigError, match="beta must be a fraction in"):
        label_chunks(DOCS, GOLD, beta=beta)


def test_beta_positive_needs_texts() -> None:
    with pytest.raises(ConfigError, match="needs the chunk texts"):
        label_chunks(DOCS, GOLD, beta=0.99)


def test_shape_mismatch() -> None:
    with pytest.raises(InputError) as info:
        label_chunks(DOCS, GOLD[:1], beta=0.0)
    assert info.value.reason == "shape-mismatch"
    with pytest.raises(InputError):
        label_chunks(DOCS, GOLD, beta=0.5, texts=[TEXTS[0], TEXTS[1][:1]], references=REFS)
