"""Atomic claims from streamed text, with character spans into the answer.

Seed 001 (Step 1, ``extract_claims``) defines an atomic claim: the smallest
verifiable assertion, *not a question, not an opinion, not a conjunction of
two independent claims*; seed 002 (``_extract_claims``) asks for "a single
verifiable statement" per claim. The seeds use an LLM for this; the sidecar
needs it per sentence, mid-stream, in microseconds, so it is rule-based:

1. sentences come from :class:`~sidecar.claims.sentences.SentenceSplitter`
   (robust to deltas that split words, lists, abbreviations, decimals);
2. questions, headings, list intros ("... are:"), pleasantries ("I hope this
   helps.") and pure opinions ("I think ...", "In my opinion ...") are dropped;
3. a meta prefix ("Based on the context, ", "According to the documents, ")
   is skipped (the span starts after it);
4. coordinated clauses are split: at ``;`` and at ", and / , but / , while /
   , whereas / , although / , yet / , so" when both sides carry a verb, and at
   " and <verb>" (verb-phrase coordination: "Aspirin reduces fever and is
   effective for pain") where the second claim gets the subject copied:
   "Aspirin is effective for pain". Numbers, dates and names stay with the
   clause they occur in because splits happen only at clause boundaries, never
   at a bare comma ("June 28, 1919", "1,000", "Paris, France").

Each :class:`Claim` has ``span = [start, end)`` into the whole answer, so
``answer[start:end]`` is the claim's own words (the copied subject, if any, is
only in ``text``), and ``sentence`` = the span of the sentence it came from
(the policy rewrites answers sentence by sentence, seed 001).

Limitations (documented, tested where they matter): no coreference ("It
reduces ..." stays "It reduces ..."), relative clauses are not split, a line
break always ends a unit. The optional LLM judge can re-check such claims.
Pure logic: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from sidecar.claims.sentences import Sentence, SentenceSplitter

__all__ = ["Claim", "ClaimSegmenter", "claims_of_sentence", "segment_claims"]

_OPINION: Final = re.compile(
    r"^(?:i\s+(?:think|believe|feel|guess|suppose|hope|would\s+say|personally)|"
    r"in\s+my\s+(?:opinion|view|experience)|personally|imho|it\s+seems\s+to\s+me|"
    r"hopefully|i'm\s+(?:not\s+sure|happy|glad)|i\s+am\s+(?:not\s+sure|happy|glad)|"
    r"let\s+me\s+know|feel\s+free|thank|thanks|sure|certainly|of\s+course|great\s+question|"
    r"good\s+question|i\s+hope|please\s+(?:note|let|consult|verify|check))\b",
    re.IGNORECASE,
)
# "This is great.", "That sounds wonderful." - an evaluation of nothing checkable.
_PURE_EVALUATION: Final = re.compile(
    r"^(?:this|that|it|these|those)\s+(?:is|was|are|were|seems?|sounds?|looks?)\s+"
    r"(?:(?:very|really|quite|so|truly|pretty)\s+)?"
    r"(?:great|amazing|interesting|wonderful|awful|terrible|fascinating|good|bad|nice|"
    r"important|beautiful|impressive|exciting|remarkable|helpful|useful)[.!]?$",
    re.IGNORECASE,
)
_META_PREFIX: Final = re.compile(
    r"^(?:(?:based\s+on|according\s+to|from|per)\s+(?:the\s+)?(?:provided\s+|given\s+|retrieved\s+"
    r"|available\s+)?(?:context|documents?|information|sources?|passages?|text|data)"
    r"|in\s+(?:summary|short|conclusion)|to\s+summari[sz]e|overall|yes|no|indeed)\s*,\s*",
    re.IGNORECASE,
)
_CLAUSE_SPLIT: Final = re.compile(
    r";\s+|,\s+(?=(?:and|but|while|whereas|although|though|yet|so)\s)", re.IGNORECASE
)
_CONJ_HEAD: Final = re.compile(
    r"^(?:and|but|while|whereas|although|though|yet|so)\s+(?:also\s+)?", re.IGNORECASE
)
_VP_AND: Final = re.compile(r"\s+and\s+(?=(?:also\s+)?([A-Za-z]+)\b)")
_WORD: Final = re.compile(r"[A-Za-z][A-Za-z'\u2019\-]*|\d[\d,.]*")

_AUX: Final = frozenset(
    {
        "is", "are", "was", "were", "be", "been", "has", "have", "had", "do", "does", "did",
        "can", "could", "will", "would", "shall", "should", "may", "might", "must",
    }
)  # fmt: skip
_VERBS: Final = frozenset(
    {
        "became", "becomes", "began", "begins", "brought", "brings", "built", "builds", "came",
        "comes", "caused", "causes", "contains", "consists", "covers", "created", "creates",
        "died", "dies", "directed", "directs", "drew", "won", "wins", "wrote", "writes", "gave",
        "gives", "got", "gets", "grew", "grows", "held", "holds", "includes", "included",
        "kept", "keeps", "knew", "knows", "led", "leads", "left", "leaves", "lies", "lay",
        "lived", "lives", "made", "makes", "means", "meant", "met", "meets", "ran", "runs",
        "reduces", "reduced", "remains", "saw", "sees", "sent", "sends", "served", "serves",
        "set", "sets", "showed", "shows", "sold", "sells", "spoke", "speaks", "stood", "stands",
        "took", "takes", "taught", "teaches", "told", "tells", "thought", "went", "goes",
        "works", "worked", "inhibits", "activates", "increases", "decreases", "lowers",
        "raises", "requires", "needs", "uses", "occurs", "happens", "produces", "provides",
        "plays", "played", "owns", "owned", "founded", "located", "born", "known", "called",
        "named", "features", "focuses", "affects", "helps", "allows", "prevents", "treats",
        "belongs", "borders", "flows", "hosts", "houses", "joined", "joins", "marks", "marked",
    }
)  # fmt: skip
_MIN_CLAIM_WORDS: Final = 3


@dataclass(frozen=True, slots=True)
class Claim:
    """One atomic claim. ``answer[span[0]:span[1]]`` is its own words."""

    index: int
    text: str
    span: tuple[int, int]
    sentence: tuple[int, int]


def _is_verb(token: str) -> bool:
    low = token.lower()
    return low in _AUX or low in _VERBS or (len(low) > 4 and low.endswith("ed"))


def _has_verb(text: str) -> bool:
    return any(_is_verb(w) for w in _WORD.findall(text))


def _subject(clause: str) -> str | None:
    """The words before the clause's first verb ("Aspirin" in "Aspirin reduces fever")."""
    for match in _WORD.finditer(clause):
        if _is_verb(match.group(0)):
            subject = clause[: match.start()].strip().rstrip(",")
            if not subject or len(subject.split()) > 12:
                return None
            return subject
    return None


def _words(text: str) -> int:
    return len(_WORD.findall(text))


def _drop(sentence: Sentence) -> bool:
    if sentence.kind in ("question", "heading", "intro"):
        return True
    text = sentence.text.strip()
    if _OPINION.match(text) or _PURE_EVALUATION.match(text):
        return True
    return _words(text) < 2


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    """Shrink ``[start, end)`` past surrounding whitespace and separators."""
    while start < end and (text[start].isspace() or text[start] in ",;"):
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in ",;"):
        end -= 1
    return start, end


def _pieces(answer: str, start: int, end: int) -> list[tuple[int, int, str | None]]:
    """Clause spans of one sentence: ``(start, end, copied_subject)``."""
    body = answer[start:end]
    cuts = [0]
    for m in _CLAUSE_SPLIT.finditer(body):
        left, right = body[cuts[-1] : m.start()], body[m.end() :]
        if _has_verb(left) and _has_verb(right.split(";")[0]) and _words(left) >= _MIN_CLAIM_WORDS:
            cuts.append(m.end())
    spans = [(cuts[k], cuts[k + 1] if k + 1 < len(cuts) else len(body)) for k in range(len(cuts))]
    out: list[tuple[int, int, str | None]] = []
    for s, e in spans:
        head = _CONJ_HEAD.match(body[s:e])
        out.extend(_split_vp(body, s + (head.end() if head is not None else 0), e))
    return [(start + s, start + e, subj) for s, e, subj in out]


def _split_vp(body: str, s: int, e: int) -> list[tuple[int, int, str | None]]:
    """Split "<subject> <verb ...> and <verb ...>" into two claims sharing the subject."""
    part = body[s:e]
    subject = _subject(part)
    for m in _VP_AND.finditer(part):
        if not _is_verb(m.group(1)) or subject is None:
            continue
        left = part[: m.start()]
        if not _has_verb(left) or _words(left) < _MIN_CLAIM_WORDS:
            continue
        right_start = s + m.end()
        rest = _split_vp(body, right_start, e)
        first = rest[0]
        return [(s, s + m.start(), None), (first[0], first[1], subject), *rest[1:]]
    return [(s, e, None)]


def claims_of_sentence(answer: str, sentence: Sentence, first_index: int) -> list[Claim]:
    """The atomic claims of one completed sentence of ``answer``."""
    if _drop(sentence):
        return []
    start, end = sentence.start, sentence.end
    meta = _META_PREFIX.match(answer[start:end])
    if meta is not None and _words(answer[start + meta.end() : end]) >= _MIN_CLAIM_WORDS:
        start += meta.end()
    claims: list[Claim] = []
    pieces = _pieces(answer, start, end)
    merged: list[tuple[int, int, str | None]] = []
    for raw_s, raw_e, subj in pieces:
        s, e = _trim(answer, raw_s, raw_e)
        if merged and _words(answer[s:e]) < _MIN_CLAIM_WORDS:
            ps, _, psubj = merged[-1]
            merged[-1] = (ps, e, psubj)  # too short to stand alone: keep with the previous
        elif s < e:
            merged.append((s, e, subj))
    for s, e, subj in merged:
        own = answer[s:e]
        text = _clean(f"{subj} {own}" if subj else own)
        if _words(text) < 2 or not any(c.isalpha() for c in text):
            continue
        claims.append(
            Claim(
                index=first_index + len(claims),
                text=text,
                span=(s, e),
                sentence=(sentence.start, sentence.end),
            )
        )
    return claims


_EMPHASIS: Final = re.compile(r"\*\*|__|`")


def _clean(text: str) -> str:
    text = _EMPHASIS.sub("", text).strip()
    text = text[0].upper() + text[1:] if text and text[0].islower() else text
    if text and text[-1] not in ".!?":
        text = text.rstrip(",;:") + "."
    return text


class ClaimSegmenter:
    """Streaming claims: ``feed`` deltas, ``finish`` with the final answer.

    Claim indices count from 0 over the whole answer; each claim is returned
    exactly once. If the final answer does not extend the streamed text (a
    delta was lost), claims already returned stay and the rest is cut from the
    final answer, starting at the last completed sentence.
    """

    def __init__(self) -> None:
        self._splitter = SentenceSplitter()
        self._count = 0
        self.mismatch = False

    @property
    def text(self) -> str:
        return self._splitter.text

    def _claims(self, sentences: list[Sentence]) -> list[Claim]:
        out: list[Claim] = []
        for sentence in sentences:
            found = claims_of_sentence(self._splitter.text, sentence, self._count)
            self._count += len(found)
            out.extend(found)
        return out

    def feed(self, delta: str) -> list[Claim]:
        return self._claims(self._splitter.feed(delta))

    def finish(self, answer: str | None = None) -> list[Claim]:
        if answer is not None and answer != self._splitter.text:
            if answer.startswith(self._splitter.text):
                rest = self._claims(self._splitter.feed(answer[len(self._splitter.text) :]))
                return rest + self._claims(self._splitter.finish())
            self.mismatch = True
            self._splitter.replace_text(answer)
        return self._claims(self._splitter.feed("") + self._splitter.finish())


def segment_claims(answer: str) -> list[Claim]:
    """All claims of a complete answer."""
    segmenter = ClaimSegmenter()
    return segmenter.feed(answer) + segmenter.finish()
