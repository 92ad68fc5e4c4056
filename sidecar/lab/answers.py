"""Answer correctness as in NQ-open evaluation: normalised gold answer contained in the answer.

Normalisation (the SQuAD / NQ-open ``normalize_answer`` used by the
lost-in-the-middle ``best_subspan_em``): lower-case, delete ASCII punctuation,
replace the articles *a*, *an*, *the* by a space, collapse whitespace. An
answer is correct when some normalised gold answer is a substring of the
normalised answer. SmolLM2 answers in sentences, so this is
the lenient (and somewhat noisy) label the data README describes.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

__all__ = ["is_correct", "normalize_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, delete punctuation, drop articles, collapse whitespace (SQuAD order)."""
    no_punct = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    no_articles = _ARTICLES.sub(" ", no_punct)
    return " ".join(no_articles.split())


def is_correct(answer: str, gold: Iterable[str]) -> bool:
    """Whether a non-empty normalised gold answer occurs in the normalised answer."""
    norm = normalize_answer(answer)
    for g in gold:
        ng = normalize_answer(g)
        if ng and ng in norm:
            return True
    return False
