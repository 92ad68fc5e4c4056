"""Answer rewrites for caveat and block, from per-claim results.

The tiers they serve: docs/methods.md §Claim verification.

* MEDIUM -> ``_remove_unsupported_claims(original_answer, claims)``: the answer
  without its unsupported claims (:func:`remove_unsupported`). Sentence by
  sentence: a sentence whose claims are all unsupported is dropped with its
  list marker; a sentence with some unsupported claims is replaced by its
  remaining claims' texts; every other sentence (and text that held no claim,
  such as a question) is kept verbatim.
* LOW -> "Based on the retrieved context, the following can be confirmed:" +
  a bullet per SUPPORTED claim + "Additional information could not be
  verified ..." (:func:`verified_only`), or the refusal text when nothing is
  verified.

Pure logic: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sidecar.claims.sentences import split_sentences
from sidecar.contracts.events import ClaimLabel
from sidecar.pipeline.ports import ClaimResult

__all__ = ["remove_unsupported", "verified_only"]

# what str.splitlines breaks at (sentences.split_sentences reads the same line ends)
_LINE_ENDS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
# split on (and keeping) each line end; the spaces before one are then each piece's
# ``rstrip``: linear, where a regex of spaces followed by a line end backtracked over
# every run of spaces from each of its characters (40,000 spaces: 34 s on the worker)
_LINE_END = re.compile(f"([{_LINE_ENDS}])")


def remove_unsupported(answer: str, claims: Sequence[ClaimResult]) -> str:
    """``answer`` without its UNSUPPORTED claims (whitespace at the ends trimmed)."""
    bad = [c for c in claims if c.label is ClaimLabel.UNSUPPORTED]
    if not bad:
        return answer.strip()
    sentences = split_sentences(answer)
    out: list[str] = []
    previous_end = 0
    for sentence in sentences:
        inside = [c for c in claims if sentence.start <= c.span[0] and c.span[1] <= sentence.end]
        gap = answer[previous_end : sentence.start]
        previous_end = sentence.end
        dropped = [c for c in inside if c.label is ClaimLabel.UNSUPPORTED]
        if not dropped:
            out.append(gap + answer[sentence.start : sentence.end])
        elif len(dropped) < len(inside):
            kept = " ".join(c.text for c in inside if c.label is not ClaimLabel.UNSUPPORTED)
            out.append(gap + kept)
        # every claim of the sentence is unsupported: drop it with its marker
    out.append(answer[previous_end:])
    # the spaces a dropped sentence left before a line end go; the line end stays as
    # the answer wrote it ("\r\n" too: ``rstrip`` of "\n"-lines turned it into "\n")
    parts = _LINE_END.split("".join(out))
    parts[::2] = [line.rstrip() for line in parts[::2]]
    return "".join(parts).strip()


def verified_only(
    claims: Sequence[ClaimResult], intro: str, outro: str, refusal: str
) -> tuple[str, bool]:
    """The LOW tier's answer: ``(text, True)`` with the verified facts, or ``(refusal, False)``."""
    facts = [c.text for c in claims if c.label is ClaimLabel.SUPPORTED]
    if not facts:
        return refusal, False
    bullets = "\n".join(f"• {fact}" for fact in facts)
    return f"{intro}\n{bullets}\n\n{outro}", True
