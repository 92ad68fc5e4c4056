"""A claim's context: the claims before it that its leading pronoun points back to.

"Frankenstein was written by Mary Shelley. It was first published in 1818."
The second claim cannot be checked alone: "It" is only resolved by the first.
The sidecar does no coreference resolution (no model, microseconds per claim);
instead a claim that opens with a pronoun or a demonstrative (``It``, ``He``,
``Their``, ``These``, ``The latter`` ...: :func:`leans_on_context`) carries
the text of the claims before it (:func:`context_of`): the nearest claim that
does not itself lean on context and the ones between, at most
:data:`MAX_CONTEXT_CLAIMS` claims and :data:`MAX_CONTEXT_CHARS` characters.

The scorer reads a claim with its context by appending the context to the
user's question (:func:`with_context`): the shipped verifier reads
``[CLS] question [SEP] claim [SEP] evidence [SEP]`` and was trained with
dialogue pairs whose question slot held the user's turn before the response,
so that slot already holds "what the claim answers". The extended question
steers evidence selection too (the antecedent's words find the evidence about
it), and coverage leaves its words out as it does the question's. A claim
that does not lean on context has no context, so it is read exactly as
before. Pure logic: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = [
    "MAX_CONTEXT_CHARS",
    "MAX_CONTEXT_CLAIMS",
    "context_of",
    "leans_on_context",
    "with_context",
]

MAX_CONTEXT_CLAIMS: Final = 2
"""Claims before a claim that its context holds at most (the antecedent is seldom further)."""
MAX_CONTEXT_CHARS: Final = 300
"""Characters of context at most, the nearest kept: the verifier truncates its first segment
(question, context and claim) from the end when it outgrows the evidence, so a long context
would cut the claim itself."""

# A pronoun or demonstrative as the claim's first word ("It's" too: the apostrophe ends the word).
_LEANING: Final = re.compile(
    r"[\"'\u201c\u2018(\[]*+"
    r"(?:it|its|he|him|his|she|her|hers|they|them|their|theirs|this|these|that|those"
    r"|the\s+latter|the\s+former)\b",
    re.IGNORECASE,
)


def leans_on_context(claim: str) -> bool:
    """Does ``claim`` open with a pronoun or demonstrative that points back ("It was ...")?"""
    return _LEANING.match(claim.lstrip()) is not None


def context_of(previous: Sequence[str]) -> str:
    """The context of a claim that leans on it, from the claims before it (in answer order).

    Walks back from the nearest claim and stops after the first one that
    stands alone, or after :data:`MAX_CONTEXT_CLAIMS` claims; the texts are
    joined in answer order and cut to the last :data:`MAX_CONTEXT_CHARS`
    characters (at a word). Empty when there is no claim before it.
    """
    taken: list[str] = []
    for text in reversed(previous):
        taken.append(" ".join(text.split()))
        if len(taken) >= MAX_CONTEXT_CLAIMS or not leans_on_context(text):
            break
    joined = " ".join(reversed(taken))
    if len(joined) <= MAX_CONTEXT_CHARS:
        return joined
    tail = joined[-MAX_CONTEXT_CHARS:]
    cut = tail.find(" ")
    return tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail


def with_context(question: str, context: str) -> str:
    """The question the claim is read with: the user's question, then the claim's context."""
    if not context:
        return question
    return f"{question} {context}" if question else context
