"""Evidence selection: the best sentences of the trusted chunks for one claim.

The sources verify a claim against the retrieved context, cut to 3,000
characters or whole (docs/methods.md §Claim verification).
A cross-encoder reads a few hundred tokens, so the sidecar first picks, per
claim, the chunk sentences that share the most informative words with it
(IDF-weighted overlap, numbers weighted double, light suffix stemming; the
user's question, when known, counts too: :meth:`EvidenceIndex.select`) and
hands the verifier

* ``window``: the top ``max_sentences`` sentences, best first (the verifier's
  tokenizer truncates from the end), a sentence longer than ``max_chars``
  clipped to the stretch holding most of the claim's words, and
* ``best_chunk``: the best sentence's chunk as a whole when it fits
  ``max_chars`` (a second pass that keeps the sentence's context).

Long evidence (a document, a cited page) holds far more than one window:
:meth:`EvidenceIndex.windows` packs the ranked sentences into up to
``max_windows`` windows of ``max_chars`` each (the per-claim budget), where
each sentence of a multi-sentence claim gets its best evidence sentence
before any gets its second (an alignment-style selection: every part of the
claim is looked up). The verifier scores the claim against every window and
the best window wins.

The same selection is used to build the training pairs
(:mod:`sidecar.lab.verifier.datasets`), so the verifier is trained on what it
sees in production. The chunk set is what the caller passes: the trusted
chunks of the certification when there are any, else all retrieved chunks
(the checker marks the scope). Pure logic: no I/O.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from sidecar.claims.sentences import split_sentences
from sidecar.words import fold

__all__ = [
    "EvidenceChunk",
    "EvidenceIndex",
    "EvidenceSelection",
    "content_terms",
    "uncovered_terms",
]

_TOKEN: Final = re.compile(r"[a-z0-9]+(?:[.,][0-9]+)*")
_STOP: Final = frozenset(
    """a an the and or but if of to in on at by for with from as is are was were be been being
    it its this that these those he she they them his her their we our you your i me my which
    who whom whose what when where why how not no do does did has have had can could will would
    shall should may might must also than then so such there here into onto about over under
    after before between during while all any some each other more most very just only""".split()
)
# Sentences in knowledge dumps are often glued: "...in Kolkata.Subhas Chandra Bose".
_GLUED: Final = re.compile(r"(?<=[a-z0-9)\]])([.!?])(?=[A-Z][a-z])")


def _stem(token: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(token) > len(suffix) + 3 and token.endswith(suffix):
            return token[: -len(suffix)]
    return token


def content_terms(text: str) -> list[str]:
    """Folded (:func:`~sidecar.words.fold`), stemmed content words and numbers (commas in
    numbers removed)."""
    out = []
    for tok in _TOKEN.findall(fold(text)):
        if tok in _STOP:
            continue
        if tok[0].isdigit():
            out.append(tok.replace(",", ""))
        elif len(tok) > 1:
            out.append(_stem(tok))
    return out


def uncovered_terms(claim: str, question: str = "") -> list[str]:
    """The claim's content terms that the question does not already state.

    A claim that restates the question ("Who directed Taxi Driver? ... directed
    Taxi Driver") would otherwise look covered by any evidence about the
    question; only what the answer adds counts. All terms when every one is
    in the question (a claim that only repeats the question keeps its words).
    """
    terms = content_terms(claim)
    if not question:
        return terms
    asked = set(content_terms(question))
    new = [t for t in terms if t not in asked]
    return new or terms


def _clip(sentence: str, terms: set[str], width: int) -> str:
    """A sentence longer than ``width``: the ``width`` characters holding most claim terms."""
    if len(sentence) <= width:
        return sentence
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", sentence)]
    hits = [bool(set(content_terms(sentence[s:e])) & terms) for s, e in words]
    best_start, best_hits = 0, -1
    j = 0
    count = 0
    for i in range(len(words)):
        while j < len(words) and words[j][1] - words[i][0] <= width:
            count += hits[j]
            j += 1
        if count > best_hits:
            best_start, best_hits = i, count
        count -= hits[i] if i < j else 0
        j = max(j, i + 1)
    start = words[best_start][0]
    return sentence[start : start + width].rsplit(" ", 1)[0]


@dataclass(frozen=True, slots=True)
class EvidenceChunk:
    chunk_id: str
    text: str


@dataclass(frozen=True, slots=True)
class EvidenceSelection:
    """What the verifier reads for one claim, and which chunks it came from."""

    window: str
    chunk_ids: tuple[str, ...]
    best_chunk: str | None
    best_chunk_id: str | None
    overlap: float  # share of the claim's content weight found in the window (0..1)


class EvidenceIndex:
    """Sentences of a fixed chunk set, ready to be ranked against many claims.

    Held compactly, because a session holds its index while the answer
    streams and the sidecar counts it against the request's byte budget
    (:attr:`nbytes`): the sentence texts; per distinct term its 64-bit hash
    and its weight; per (sentence, distinct term) the term's number and the
    sentence's, in flat numpy arrays (~2.6x the text, against 15x for a set
    of term strings per sentence). Ranking a claim is then one mask lookup
    and one ``bincount`` over those arrays instead of a set intersection per
    sentence. A sentence's score is the weight of the claim's terms it holds;
    terms are told apart by hash (two distinct terms among a million collide
    with probability below 1e-7).
    """

    def __init__(
        self,
        chunks: Sequence[EvidenceChunk],
        *,
        max_sentences: int = 3,
        max_chars: int = 450,
    ) -> None:
        if max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
        if max_chars < 50:
            raise ValueError(f"max_chars must be >= 50, got {max_chars}")
        self.chunks = tuple(chunks)
        self.max_sentences = max_sentences
        self.max_chars = max_chars
        texts: list[str] = []
        chunk_of: list[int] = []
        hashes: list[int] = []
        digits: list[bool] = []
        sizes: list[int] = []
        for ci, chunk in enumerate(self.chunks):
            for sentence in split_sentences(_GLUED.sub(r"\1 ", chunk.text)):
                terms = sorted(set(content_terms(sentence.text)))  # equal sets, equal sums
                texts.append(sentence.text)
                chunk_of.append(ci)
                sizes.append(len(terms))
                hashes.extend(hash(t) for t in terms)
                digits.extend(t[0].isdigit() for t in terms)
        self._texts = texts
        self._chunk_of = np.array(chunk_of, dtype=np.int32)
        occurrences = np.array(hashes, dtype=np.int64)  # per (sentence, distinct term)
        self._vocab, df = np.unique(occurrences, return_counts=True)
        self._term = np.searchsorted(self._vocab, occurrences).astype(np.int32)
        self._owner = np.repeat(np.arange(len(texts), dtype=np.int32), sizes)
        self._starts = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self._starts[1:])
        n = max(1, len(texts))
        digit = np.zeros(len(self._vocab), dtype=bool)
        digit[self._term] = np.array(digits, dtype=bool)
        idf = np.log((n + 1) / (df + 1.0)) + 1.0
        self._vocab_weight = idf * np.where(digit, 2.0, 1.0)
        self._default_idf = math.log(n + 1) + 1.0

    @property
    def nbytes(self) -> int:
        """Bytes this index holds beyond its chunks (sentence texts and the term arrays)."""
        arrays = (self._chunk_of, self._vocab, self._term, self._owner, self._starts)
        return (
            sum(a.nbytes for a in arrays)
            + self._vocab_weight.nbytes
            + sum(sys.getsizeof(t) for t in self._texts)
            + 8 * len(self._texts)  # the list's slots
        )

    def __len__(self) -> int:
        """Sentences indexed."""
        return len(self._texts)

    def _lookup(self, terms: Iterable[str]) -> dict[str, int]:
        """Each term's number in this index's vocabulary, -1 for a term no sentence holds."""
        out: dict[str, int] = {}
        for term in terms:
            h = hash(term)
            k = int(np.searchsorted(self._vocab, h))
            out[term] = k if k < len(self._vocab) and self._vocab[k] == h else -1
        return out

    def _weights(self, numbers: dict[str, int]) -> dict[str, float]:
        """Each looked-up term's weight (IDF over the sentences; numbers count double)."""
        out: dict[str, float] = {}
        for term, k in numbers.items():
            if k >= 0:
                out[term] = float(self._vocab_weight[k])
            else:
                out[term] = 2.0 * self._default_idf if term[0].isdigit() else self._default_idf
        return out

    def _scores(self, terms: Iterable[str]) -> npt.NDArray[np.float64]:
        """Per sentence: the summed weight of ``terms`` it holds."""
        return self._scores_of(self._lookup(terms).values())

    def _scores_of(self, numbers: Iterable[int]) -> npt.NDArray[np.float64]:
        """:meth:`_scores` of terms already looked up (-1: no sentence holds it)."""
        known = [k for k in numbers if k >= 0]
        if not known:
            return np.zeros(len(self._texts))
        wanted = np.zeros(len(self._vocab), dtype=bool)
        wanted[known] = True
        hit = wanted[self._term]
        scores = np.bincount(
            self._owner[hit],
            weights=self._vocab_weight[self._term[hit]],
            minlength=len(self._texts),
        )
        return scores.astype(np.float64, copy=False)

    def _terms_of(self, k: int) -> npt.NDArray[np.int32]:
        return self._term[self._starts[k] : self._starts[k + 1]]

    @staticmethod
    def _ranked(scores: npt.NDArray[np.float64]) -> npt.NDArray[np.intp]:
        """Sentence numbers by score, highest first; ties: the earlier sentence first."""
        return np.lexsort((np.arange(len(scores)), -scores))

    def select(self, claim: str, question: str = "") -> EvidenceSelection:
        """The window of best sentences for ``claim`` (empty when there are no chunks).

        ``question`` (the user's question the answer replies to, may be empty)
        adds its terms to the ranking: a sentence scores the weight of the
        claim's terms it holds plus the weight of the question's terms it holds.
        A claim naming a wrong answer then does not pull in the sentence that
        merely mentions that name ahead of the sentence answering the question.
        ``overlap`` stays the share of the *claim's* weight found in the window.
        """
        if not self._texts:
            return EvidenceSelection("", (), None, None, 0.0)
        terms = set(content_terms(claim))
        asked = set(content_terms(question)) if question else set()
        number = self._lookup(terms)  # once: weights, scores and overlap all read it
        weights = self._weights(number)
        total = sum(weights.values()) or 1.0
        scores = self._scores_of(number.values()) + self._scores(asked)
        chosen: list[int] = []
        size = 0
        for k in self._ranked(scores).tolist():
            if len(chosen) >= self.max_sentences or (chosen and scores[k] <= 0.0):
                break
            length = len(self._texts[k]) + 1
            if chosen and size + length > self.max_chars:
                continue
            chosen.append(k)
            size += length
        # Best first: the verifier's tokenizer truncates the evidence from the end.
        window = " ".join(_clip(self._texts[k], terms | asked, self.max_chars) for k in chosen)
        window = window[: self.max_chars]
        held = set(np.concatenate([self._terms_of(k) for k in chosen]).tolist())
        overlap = sum(w for t, w in weights.items() if number[t] in held) / total
        chunk_ids = tuple(dict.fromkeys(self.chunks[self._chunk_of[k]].chunk_id for k in chosen))
        best_chunk = self.chunks[self._chunk_of[chosen[0]]]
        whole = _GLUED.sub(r"\1 ", best_chunk.text).strip()
        fits = len(whole) <= self.max_chars and whole != window
        return EvidenceSelection(
            window=window,
            chunk_ids=chunk_ids,
            best_chunk=whole if fits else None,
            best_chunk_id=best_chunk.chunk_id,
            overlap=min(1.0, overlap),
        )

    def windows(
        self, claim: str, question: str = "", *, max_windows: int = 1, max_chars: int = 900
    ) -> tuple[str, ...]:
        """Up to ``max_windows`` evidence windows of at most ``max_chars`` each, best first.

        Every sentence of the claim ranks the evidence sentences by the weight
        of its terms (and the question's) they hold; the ranked lists are
        merged in turns (each claim sentence's best, then each one's second
        ...), so a summary claim gets evidence for all its parts, not only for
        its longest. The merged list is packed into windows in that order
        (best first inside a window: the tokenizer truncates from the end); a
        sentence that does not fit the window starts the next one. Sentences
        sharing no term with the claim or the question are never used; when
        none shares one, the first window is the start of the evidence.
        """
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {max_windows}")
        if max_chars < 50:
            raise ValueError(f"max_chars must be >= 50, got {max_chars}")
        if not self._texts:
            return ()
        asked = set(content_terms(question)) if question else set()
        parts = [set(content_terms(s.text)) for s in split_sentences(_GLUED.sub(r"\1 ", claim))]
        parts = [p for p in parts if p] or [set(content_terms(claim))]
        asked_score = self._scores(asked)
        rankings = []
        for terms in parts:
            scores = self._scores(terms) + asked_score
            ranked = self._ranked(scores)
            rankings.append(ranked[scores[ranked] > 0.0].tolist())
        order: list[int] = []
        seen: set[int] = set()
        for rank in range(max((len(r) for r in rankings), default=0)):
            for ranking in rankings:
                if rank < len(ranking) and ranking[rank] not in seen:
                    seen.add(ranking[rank])
                    order.append(ranking[rank])
        if not order:
            order = list(range(len(self._texts)))
        all_terms = set().union(*parts) | asked
        out: list[str] = []
        current: list[str] = []
        size = 0
        for k in order:
            text = _clip(self._texts[k], all_terms, max_chars)
            if current and size + len(text) + 1 > max_chars:
                out.append(" ".join(current))
                if len(out) >= max_windows:
                    return tuple(out)
                current, size = [], 0
            current.append(text)
            size += len(text) + 1
        if current and len(out) < max_windows:
            out.append(" ".join(current))
        return tuple(out)
