"""Streaming claim segmentation: deltas in, each atomic claim out once, spans into the answer.

Sentences come from :class:`~sidecar.claims.sentences.SentenceSplitter`
(robust to deltas that split words, lists, abbreviations, decimals); each
completed sentence is cut into atomic claims by
:func:`~sidecar.claims.atomic.claims_of_sentence` (the rules are there).

Limits. Work is linear in the answer's length however the deltas cut it (no
unit is longer than :data:`~sidecar.claims.sentences.MAX_UNIT_CHARS`). At most
:data:`MAX_CLAIMS_PER_ANSWER` claims of an answer are returned for
verification; the ones after them are still counted
(:attr:`ClaimSegmenter.unchecked`), and the claim signal reports them so the
policy can say so (reason ``claims-over-limit``) instead of treating the rest
of the answer as checked. The limit holds for the answer, not per pass: a
final answer that differs from the stream gets only the room the streamed
claims left.

Scripts. The claim rules read Latin-script English (the verifier is an
English MiniLM): a sentence mostly in another script (Cyrillic, Greek, CJK,
Arabic ...) yields no claim, and is counted in
:attr:`ClaimSegmenter.unreadable` (reason ``claims-unreadable``) instead of
passing as a sentence with nothing to check. So is each line of a fenced code
block: program text is no claim the verifier can read, and unverified.

Final answer versus stream (:meth:`ClaimSegmenter.finish`): when the final
answer does not extend the streamed text, the final answer is segmented
afresh; a claim of it whose sentence was already cut identically from the
stream (with the same context, compared in Unicode normal form NFC) keeps that
claim's index (its verdict was published and stands, its spans now point into
the final answer); the others get new indices and are returned for
verification; streamed claims the final answer no longer holds are listed in
:attr:`ClaimSegmenter.superseded` (their published verdicts no longer count).
A final that is the streamed text in another normal form (deltas decomposed,
NFD, by one detokenizer and the final composed, NFC, by another) is no
:attr:`ClaimSegmenter.mismatch` while every streamed claim stands: canonically
equivalent text is the same text. Compatibility forms (NFKC would read "x²" as
"x2" and a ligature as its letters) and invisible characters (a zero-width
space, a word joiner) stay a mismatch: they may change what a reader sees or
what the words mean.

Context: a claim that opens with a pronoun or demonstrative ("It reduces
...") gets the text of the claims before it that it leans on as
:attr:`~sidecar.claims.atomic.Claim.context` (:mod:`sidecar.claims.context`);
the scorer reads the claim with it. In the final answer, a claim's context
comes from the final answer's claims.

Other limitations (documented, tested where they matter): no coreference
resolution ("It reduces ..." stays "It reduces ...", only read with its
context), relative clauses are not split, a line break always ends a unit, a
rhetorical question or a line ending in ":" is never a claim. The optional
LLM judge can re-check such claims. Pure logic: no I/O.
"""

from __future__ import annotations

import unicodedata
from collections import deque
from dataclasses import replace
from typing import Final

from sidecar.claims.atomic import Claim, claims_of_sentence, unreadable
from sidecar.claims.context import MAX_CONTEXT_CLAIMS, context_of, leans_on_context
from sidecar.claims.sentences import Sentence, SentenceSplitter
from sidecar.exceptions import ConfigError, LifecycleError

__all__ = [
    "MAX_CLAIMS_PER_ANSWER",
    "ClaimSegmenter",
    "segment_claims",
]

MAX_CLAIMS_PER_ANSWER: Final = 100
"""Claims of one answer that are verified; later ones are counted as unchecked.

A long RAG answer holds a few dozen claims; the limit bounds the verifier's
work per answer (one model call per claim) against answers built to stall it."""


# A claim's identity across the stream and the final answer: the sentence's own
# characters, the claim's span inside it, its text and its context (a claim read with
# other claims before it is another claim).
_Key = tuple[str, int, int, str, str]


def _key(sentence: Sentence, claim: Claim) -> _Key:
    return (
        sentence.raw,
        claim.span[0] - sentence.start,
        claim.span[1] - sentence.start,
        claim.text,
        claim.context,
    )


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)  # the text itself when already NFC (ASCII)


def _canonical(key: _Key) -> _Key:
    """``key`` under NFC: the same claim of a sentence in another Unicode normal form (its
    span cut at the same characters: a claim never ends inside one) has the same key."""
    raw, start, end, text, context = key
    return (_nfc(raw), len(_nfc(raw[:start])), len(_nfc(raw[:end])), _nfc(text), _nfc(context))


class _Cutter:
    """Sentences -> claims with indices from ``next_index``, at most ``room`` of them."""

    def __init__(self, max_claims: int) -> None:
        self.splitter = SentenceSplitter()
        self.claims: list[Claim] = []
        self.keys: list[_Key] = []
        self.unchecked = 0
        self.unreadable = 0  # units the rules do not read (another script, code): no claim
        self._max = max_claims

    def take(self, sentences: list[Sentence], next_index: int) -> list[Claim]:
        out: list[Claim] = []
        for sentence in sentences:
            # before the rules: they count numbers and Latin names as words, and made a claim
            # of a sentence in another script that held two of them
            if sentence.kind == "code" or unreadable(sentence.text):
                self.unreadable += 1
                continue
            found = claims_of_sentence(sentence, next_index + len(out))
            room = self._max - len(self.claims)
            if len(found) > room:
                self.unchecked += len(found) - room
                found = found[:room]
            for cut in found:
                claim = self._in_context(cut)
                self.claims.append(claim)
                self.keys.append(_key(sentence, claim))
                out.append(claim)
        return out

    def _in_context(self, claim: Claim) -> Claim:
        """``claim`` with the claims before it as its context when it leans on them."""
        if not leans_on_context(claim.text):
            return claim
        before = [c.text for c in self.claims[-MAX_CONTEXT_CLAIMS:]]
        return replace(claim, context=context_of(before))


class ClaimSegmenter:
    """Streaming claims: ``feed`` deltas, ``finish`` with the final answer.

    Claim indices count from 0 over the whole answer; each claim is returned
    exactly once. After ``finish``: :attr:`claims` are the final answer's
    claims (spans into it), :attr:`mismatch` says whether the final answer
    differed from the streamed text, :attr:`superseded` lists the indices of
    streamed claims it no longer holds, :attr:`unchecked` counts claims past
    ``max_claims`` (never returned), :attr:`unreadable` the sentences in a
    script the rules do not read.
    """

    def __init__(self, max_claims: int = MAX_CLAIMS_PER_ANSWER) -> None:
        if max_claims < 1:
            raise ConfigError(f"max_claims must be >= 1, got {max_claims}")
        self._max = max_claims
        self._stream = _Cutter(max_claims)
        self._next_index = 0
        self._final: list[Claim] | None = None
        self.unchecked = 0
        self.unreadable = 0
        self.mismatch = False
        self.superseded: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        """The streamed text so far."""
        return self._stream.splitter.text

    @property
    def claims(self) -> tuple[Claim, ...]:
        """The answer's claims: streamed so far, or after ``finish`` the final answer's."""
        return tuple(self._stream.claims if self._final is None else self._final)

    def _take(self, sentences: list[Sentence]) -> list[Claim]:
        out = self._stream.take(sentences, self._next_index)
        self._next_index += len(out)
        self.unchecked = self._stream.unchecked
        self.unreadable = self._stream.unreadable
        return out

    def feed(self, delta: str) -> list[Claim]:
        if self._final is not None:
            raise LifecycleError("feed() after finish(): the claim segmenter is closed")
        return self._take(self._stream.splitter.feed(delta))

    def finish(self, answer: str | None = None) -> list[Claim]:
        """The remaining claims to verify; ``answer`` is the final answer when known."""
        if self._final is not None:
            raise LifecycleError("finish() called twice on one claim segmenter")
        splitter = self._stream.splitter
        if answer is None or _extends(answer, splitter.text):
            rest = answer[splitter.length :] if answer is not None else ""
            out = self._take(splitter.feed(rest)) if rest else []
            out += self._take(splitter.finish())
            self._final = list(self._stream.claims)
            return out
        out = self._refit(answer)
        # canonically equivalent (NFC) text is the same text: deltas decomposed by one
        # detokenizer and a final composed by another. Compatibility forms (NFKC: "x²" is
        # not "x2") and invisible characters stay a mismatch, and so does a final whose
        # claims were cut otherwise, so that a published verdict no longer stands
        same = _extends(_nfc(answer), _nfc(splitter.text))
        self.mismatch = not same or bool(self.superseded)
        return out

    def _refit(self, answer: str) -> list[Claim]:
        """The final answer differs from the stream: its claims, reusing identical ones."""
        fresh = _Cutter(self._max)
        fresh.take(fresh.splitter.feed(answer) + fresh.splitter.finish(), 0)
        streamed: dict[_Key, deque[Claim]] = {}
        for key, claim in zip(self._stream.keys, self._stream.claims, strict=True):
            streamed.setdefault(_canonical(key), deque()).append(claim)
        final: list[Claim] = []
        new: list[Claim] = []
        kept: set[int] = set()
        for key, claim in zip(fresh.keys, fresh.claims, strict=True):
            same = streamed.get(_canonical(key))
            if same:
                old = same.popleft()
                kept.add(old.index)
                final.append(replace(claim, index=old.index))
            else:
                made = replace(claim, index=self._next_index)
                self._next_index += 1
                new.append(made)
                final.append(made)
        # the limit is on the claims verified for the answer, the stream's included:
        # a final that differs from the stream gets the room the stream left
        room = max(0, self._max - len(self._stream.claims))
        over = new[room:]
        if over:
            dropped = {c.index for c in over}
            new = new[:room]
            final = [c for c in final if c.index not in dropped]
            self._next_index -= len(over)  # the last indices handed out
        self.superseded = tuple(c.index for c in self._stream.claims if c.index not in kept)
        self.unchecked = fresh.unchecked + len(over)
        self.unreadable = fresh.unreadable
        self._final = final
        return new


def _extends(answer: str, streamed: str) -> bool:
    """Is ``answer`` the streamed text, continued (or with only trailing blanks dropped)?"""
    if len(answer) >= len(streamed):
        return answer.startswith(streamed)
    return streamed.startswith(answer) and streamed[len(answer) :].isspace()


def segment_claims(answer: str, max_claims: int = MAX_CLAIMS_PER_ANSWER) -> list[Claim]:
    """All claims of a complete answer (at most ``max_claims``)."""
    segmenter = ClaimSegmenter(max_claims)
    return segmenter.feed(answer) + segmenter.finish()
