"""ROUGE-L: the similarity ``h`` between a chunk and the reference answer (eq. 1).

The labelling rule that uses it: docs/methods.md §Retrieval certification.

ROUGE-L (Lin 2004) compares two texts by the length of their longest common
subsequence (LCS) of tokens: with ``m`` candidate and ``n`` reference tokens,
``P = LCS/m``, ``R = LCS/n`` and the F-measure ``F = 2PR/(P + R)`` (beta = 1, as in
the widely used ``rouge-score`` package). Tokens are the lower-cased runs of
letters and digits of the text (Unicode ones, so "Röntgen" stays one token; the
``rouge-score`` tokenizer would split it at the non-ASCII letter); the underscore
separates tokens, as in ``rouge-score`` ("snake_case" is two). No stemming.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["lcs_length", "rouge_l", "rouge_l_max", "tokenize"]

_TOKEN = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens of ``text``."""
    return _TOKEN.findall(text.lower())


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token sequences.

    Dynamic programming in O(len(a)*len(b)) time and O(min(len(a), len(b))) memory.
    """
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            cur[j] = prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F-measure of ``candidate`` against ``reference``, in [0, 1].

    0.0 when either text has no tokens.
    """
    cand, ref = tokenize(candidate), tokenize(reference)
    if not cand or not ref:
        return 0.0
    lcs = lcs_length(cand, ref)
    if lcs == 0:
        return 0.0
    precision = lcs / len(cand)
    recall = lcs / len(ref)
    return 2.0 * precision * recall / (precision + recall)


def rouge_l_max(candidate: str, references: Iterable[str]) -> float:
    """Best ROUGE-L of ``candidate`` over several reference answers (0.0 for none)."""
    return max((rouge_l(candidate, r) for r in references), default=0.0)
