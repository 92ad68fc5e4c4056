"""ROUGE-L, the similarity h of eq. (1)."""

from __future__ import annotations

import pytest

from sidecar.lab.conformal.rouge import lcs_length, rouge_l, rouge_l_max, tokenize


def test_lin_2004_example() -> None:
    # Lin (2004), Sec. 3.1: reference "police killed the gunman";
    # S2 shares the LCS "police the gunman" (3 of 4 words), S3 only "the gunman".
    ref = "police killed the gunman"
    assert rouge_l("police kill the gunman", ref) == pytest.approx(0.75)
    assert rouge_l("the gunman kill police", ref) == pytest.approx(0.5)


def test_f_measure_by_hand() -> None:
    # LCS("the cat sat on the mat", "the cat on the mat") = 5; P = 5/6, R = 5/5
    assert lcs_length("the cat sat on the mat".split(), "the cat on the mat".split()) == 5
    assert rouge_l("The cat sat on the mat", "the CAT on the mat.") == pytest.approx(10 / 11)


def test_edges() -> None:
    assert rouge_l("same words here", "same words here") == 1.0
    assert rouge_l("alpha beta", "gamma delta") == 0.0
    assert rouge_l("", "anything") == 0.0
    assert rouge_l("anything", "...") == 0.0
    assert rouge_l_max("Wilhelm Röntgen won", []) == 0.0


def test_tokens_are_lowercased_unicode_words() -> None:
    assert tokenize("Wilhelm Conrad Röntgen, 1901!") == ["wilhelm", "conrad", "röntgen", "1901"]


def test_the_underscore_separates_tokens_as_in_rouge_score() -> None:
    # rouge-score: rougeL.fmeasure("snake_case", "snake case") == 1.0; \w+ made it 0.0
    assert tokenize("snake_case __init__") == ["snake", "case", "init"]
    assert rouge_l("snake_case", "snake case") == 1.0


def test_best_of_several_references() -> None:
    chunk = "the prize went to Wilhelm Conrad Röntgen in 1901"
    refs = ["Marie Curie", "Wilhelm Conrad Röntgen"]
    assert rouge_l_max(chunk, refs) == rouge_l(chunk, refs[1]) > rouge_l(chunk, refs[0])


def test_symmetric_lcs() -> None:
    a, b = "a b c d e f".split(), "x b y d f".split()
    assert lcs_length(a, b) == lcs_length(b, a) == 3
