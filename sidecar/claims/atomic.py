"""Atomic claims of one completed sentence: prefixes skipped, formulas dropped, clauses cut.

An atomic claim is the smallest verifiable assertion: not a question, not an
opinion, not a conjunction of two independent claims (docs/methods.md §Claim
verification). The sidecar needs it per sentence,
mid-stream, in microseconds, so it is rule-based:

1. questions, headings and list intros ("... are:") are dropped;
2. discourse prefixes are skipped, never the sentence behind them (the span
   starts after them): pleasantries ("Certainly, ", "Of course ", "Sure, ",
   "Great question! ", "Thanks for asking, "), meta prefixes ("Based on the
   context, ", "According to the documents, ") and hedges ("I think (that)",
   "I believe", "In my opinion, ", "I'm not sure, but "): "I think X" is a
   hedged claim of X, so X is verified. "Thanks to the treaty, ..." is no
   pleasantry ("thanks to" is a cause) and stays whole;
3. what remains is dropped only when it holds nothing checkable: a closing
   formula ("I hope this helps.", "Let me know if ...", "Feel free to ...",
   "Thank you.", "Please consult a doctor."), an evaluation of nothing
   ("This is great."), or fewer than two words ("Sure!", "Of course.");
4. coordinated clauses are split: at ``;`` and at ", and / , but / , while /
   , whereas / , although / , yet / , so" when both sides carry a verb, and at
   " and <verb>" (verb-phrase coordination: "Aspirin reduces fever and is
   effective for pain") where each later claim gets the subject copied:
   "Aspirin is effective for pain". Numbers, dates and names stay with the
   clause they occur in because splits happen only at clause boundaries, never
   at a bare comma ("June 28, 1919", "1,000", "Paris, France").

Each :class:`Claim` has ``span = [start, end)`` into the whole answer, so
``answer[start:end]`` is the claim's own words (the copied subject, if any, is
only in ``text``), and ``sentence`` = the span of the sentence it came from
(the policy rewrites answers sentence by sentence). Every pattern is anchored
or cannot backtrack, and clause splitting counts words and verbs with prefix
sums, so the work is linear in the sentence's length. Pure logic: no I/O.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Final

from sidecar.claims.sentences import Sentence

__all__ = ["Claim", "claims_of_sentence", "content_start", "unreadable"]

_APOS = "['\u2019]"
# Sentence adverbs: skipped when followed by a comma or by a space.
_ADVERB: Final = (
    r"of\s+course|certainly|surely|absolutely|definitely|indeed|hopefully|personally|"
    r"honestly|frankly"
)
# Interjections and meta prefixes: skipped only before punctuation ("No one knows" stays).
_INTERJECTION: Final = (
    r"sure|yes|yeah|yep|no|nope|well|okay|ok|alright|right|great|hi|hello|hey|"
    r"(?:great|good|excellent|interesting)\s+question|"
    r"thanks?(?:\s+you)?(?:\s+(?:so|very)\s+much)?"
    r"(?:\s+for\s+(?:asking|the\s+question|your\s+question|reaching\s+out))?|"
    r"in\s+my\s+(?:opinion|view|experience|understanding)|imho|"
    r"in\s+(?:summary|short|brief|conclusion)|to\s+summari[sz]e|overall|that\s+said|"
    r"as\s+far\s+as\s+i\s+know|to\s+(?:my|the\s+best\s+of\s+my)\s+knowledge|"
    r"if\s+i\s+recall\s+correctly|to\s+be\s+honest|"
    r"(?:based\s+on|according\s+to|from|per)\s+(?:the\s+)?"
    r"(?:provided\s+|given\s+|retrieved\s+|available\s+)?"
    r"(?:context|documents?|information|sources?|passages?|text|data)"
)
# Hedges: "I think (that) X" is a hedged claim of X.
_HEDGE: Final = (
    r"i\s+(?:(?:really|strongly|personally|honestly|do)\s+)?"
    r"(?:think|believe|feel|guess|suppose|reckon|assume|would\s+say)|"
    rf"i{_APOS}d\s+say|it\s+seems\s+to\s+me|"
    rf"(?:i\s+am|i{_APOS}m)\s+(?:(?:fairly|pretty|quite|very|almost|not)\s+)?"
    r"(?:entirely\s+|completely\s+)?(?:sure|certain|confident|positive)"
)
_PUNCT_AFTER: Final = r"\s*+(?:[,:;!\u2014\u2013]|-(?=\s))\s*+"
_PREFIX: Final = re.compile(
    rf"(?:(?:{_ADVERB})\b(?:{_PUNCT_AFTER}|\s++)"
    rf"|(?:{_INTERJECTION})\b{_PUNCT_AFTER}"
    rf"|(?:{_HEDGE})\b(?:\s*+,\s*+(?:but\s+|and\s+)?|\s++)(?:that\s+)?)",
    re.IGNORECASE,
)
_MAX_PREFIXES: Final = 6
_REST: Final = r"\b[^,;:]*+"  # the rest of a formula: anything but a clause break
# A whole sentence that asserts nothing checkable (after any prefix was skipped).
_FORMULA: Final = re.compile(
    r"(?:"
    r"(?:i\s+)?hope\s+(?:this|that|it|the\s+above|my\s+answer|this\s+information|"
    r"the\s+information)\s+(?:helps|helped|is\s+helpful|was\s+helpful|"
    r"answers\s+your\s+question|clarifies(?:\s+things)?)(?:\s+you)?"
    rf"|(?:please\s+)?let\s+me\s+know{_REST}"
    rf"|(?:please\s+)?feel\s+free\s+to{_REST}"
    rf"|(?:please\s+)?(?:do\s+not|don{_APOS}t)\s+hesitate\s+to{_REST}"
    rf"|(?:i\s+am|i{_APOS}m)\s+(?:always\s+)?(?:happy|glad)\s+to\s+(?:help|assist){_REST}"
    rf"|(?:i\s+am|i{_APOS}m)\s+(?:happy|glad)\s+you\s+asked"
    rf"|happy\s+to\s+help{_REST}"
    rf"|i{_APOS}d\s+be\s+(?:happy|glad)\s+to\s+(?:help|assist|explain){_REST}"
    rf"|here(?:{_APOS}s|\s+is|\s+are)\s+(?:the\s+|a\s+|an\s+|some\s+)?(?:answer|summary|"
    r"information|details|overview|explanation|what\s+i\s+found)"
    rf"|(?:is\s+there\s+)?anything\s+else{_REST}"
    rf"|you{_APOS}re\s+welcome|good\s+luck{_REST}"
    r"|have\s+a\s+(?:nice|great|good|wonderful)\s+(?:day|time|trip|week)"
    rf"|thanks?(?:\s+you)?(?:\s+(?:so|very)\s+much)?(?:\s+for{_REST})?"
    r"|(?:great|good|excellent|interesting)\s+question"
    r"|please\s+(?:consult|verify|check|contact|see|ask|refer\s+to|talk\s+to|"
    rf"speak\s+(?:to|with)){_REST}"
    rf"|(?:i\s+am|i{_APOS}m)\s+not\s+(?:sure|certain)|i\s+(?:do\s+not|don{_APOS}t)\s+know"
    rf"|(?:{_ADVERB}|{_INTERJECTION}|{_HEDGE})(?:\s+(?:so|not))?"
    r")[\s.!?\u2026\"'\u201d\u2019)]*+",
    re.IGNORECASE,
)
# "This is great.", "That sounds wonderful." - an evaluation of nothing checkable.
_PURE_EVALUATION: Final = re.compile(
    r"(?:this|that|it|these|those)\s+(?:is|was|are|were|seems?|sounds?|looks?)\s+"
    r"(?:(?:very|really|quite|so|truly|pretty)\s+)?"
    r"(?:great|amazing|interesting|wonderful|awful|terrible|fascinating|good|bad|nice|"
    r"important|beautiful|impressive|exciting|remarkable|helpful|useful)[.!]?",
    re.IGNORECASE,
)
_CLAUSE_SPLIT: Final = re.compile(
    r";\s++|,\s++(?=(?:and|but|while|whereas|although|though|yet|so)\s)", re.IGNORECASE
)
_CONJ_HEAD: Final = re.compile(
    r"(?:and|but|while|whereas|although|though|yet|so)\s++(?:also\s+)?", re.IGNORECASE
)
# " and <verb>": a match starts only right after a non-space, so a long blank
# run is crossed once, not once per position.
_VP_AND: Final = re.compile(r"(?<=\S)\s++and\s++(?=(?:also\s+)?([A-Za-z]+)\b)")
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
_MIN_UNREADABLE_LETTERS: Final = 2  # a CJK word is one or two letters


def _latin(letter: str) -> bool:
    """Basic Latin to Latin Extended-B, IPA, and Latin Extended Additional (accents)."""
    code = ord(letter)
    return code < 0x0250 or 0x1E00 <= code <= 0x1EFF


def unreadable(text: str) -> bool:
    """Is ``text`` mostly in a script the claim rules do not read (not Latin)?

    True when its letters outside the Latin script outnumber its Latin
    letters (and there are at least two): "Фрэнсис Скотт Фицджеральд родился
    в 1896 году." or "弗朗西斯·斯科特·菲茨杰拉德出生于1896年。"; an English
    sentence quoting a name in another script is read.
    """
    if text.isascii():  # the usual case, at C speed
        return False
    latin = other = 0
    for ch in text:
        if ch.isalpha():
            if _latin(ch):
                latin += 1
            else:
                other += 1
    return other >= _MIN_UNREADABLE_LETTERS and other > latin


@dataclass(frozen=True, slots=True)
class Claim:
    """One atomic claim. ``answer[span[0]:span[1]]`` is its own words.

    ``context``: the text of the claims before it that it leans on (it opens
    with a pronoun, :mod:`sidecar.claims.context`); empty when it stands alone.
    The segmenter sets it, since only it sees the claims before the sentence.
    """

    index: int
    text: str
    span: tuple[int, int]
    sentence: tuple[int, int]
    context: str = ""


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


class _Tokens:
    """Word and verb counts of any ``body[a:b]`` in O(log n), from one tokenisation."""

    def __init__(self, body: str) -> None:
        matches = list(_WORD.finditer(body))
        self._starts = [m.start() for m in matches]
        verbs = (1 if _is_verb(m.group(0)) else 0 for m in matches)
        self._verbs = [0, *accumulate(verbs)]
        self._semicolons = [k for k, c in enumerate(body) if c == ";"]
        self._length = len(body)

    def _range(self, a: int, b: int) -> tuple[int, int]:
        return bisect_left(self._starts, a), bisect_left(self._starts, b)

    def words(self, a: int, b: int) -> int:
        lo, hi = self._range(a, b)
        return hi - lo

    def has_verb(self, a: int, b: int) -> bool:
        lo, hi = self._range(a, b)
        return self._verbs[hi] > self._verbs[lo]

    def clause_end(self, a: int) -> int:
        """The next ``;`` at or after ``a`` (the end of the text when there is none)."""
        k = bisect_left(self._semicolons, a)
        return self._semicolons[k] if k < len(self._semicolons) else self._length


def content_start(raw: str) -> int:
    """Where the checkable content of a sentence starts: after its discourse prefixes."""
    pos = 0
    for _ in range(_MAX_PREFIXES):
        found = _PREFIX.match(raw, pos)
        if found is None or found.end() == pos:
            break
        pos = found.end()
    return pos


def _nothing_checkable(body: str) -> bool:
    return (
        _FORMULA.fullmatch(body) is not None
        or _PURE_EVALUATION.fullmatch(body) is not None
        or _words(body) < 2
    )


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    """Shrink ``[start, end)`` past surrounding whitespace and separators."""
    while start < end and (text[start].isspace() or text[start] in ",;"):
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in ",;"):
        end -= 1
    return start, end


def _pieces(body: str) -> list[tuple[int, int, str | None]]:
    """Clause spans of one sentence body: ``(start, end, copied_subject)``."""
    tokens = _Tokens(body)
    cuts = [0]
    for m in _CLAUSE_SPLIT.finditer(body):
        left_ok = tokens.has_verb(cuts[-1], m.start())
        if not left_ok or tokens.words(cuts[-1], m.start()) < _MIN_CLAIM_WORDS:
            continue
        if tokens.has_verb(m.end(), tokens.clause_end(m.end())):
            cuts.append(m.end())
    bounds = [*cuts, len(body)]
    out: list[tuple[int, int, str | None]] = []
    for s, e in pairwise(bounds):
        head = _CONJ_HEAD.match(body, s, e)
        out.extend(_split_vp(body, head.end() if head is not None else s, e, tokens))
    return out


def _split_vp(body: str, s: int, e: int, tokens: _Tokens) -> list[tuple[int, int, str | None]]:
    """Split "<subject> <verb ...> and <verb ...> ..." into claims sharing the subject."""
    subject = _subject(body[s:e])
    if subject is None:
        return [(s, e, None)]
    out: list[tuple[int, int, str | None]] = []
    current, copied = s, None
    for m in _VP_AND.finditer(body, s, e):
        if not _is_verb(m.group(1)):
            continue
        left_ok = tokens.has_verb(current, m.start())
        if not left_ok or tokens.words(current, m.start()) < _MIN_CLAIM_WORDS:
            continue
        out.append((current, m.start(), copied))
        current, copied = m.end(), subject
    out.append((current, e, copied))
    return out


def claims_of_sentence(sentence: Sentence, first_index: int) -> list[Claim]:
    """The atomic claims of one completed sentence (spans into the whole answer)."""
    if sentence.kind in ("question", "heading", "intro", "code"):
        return []
    raw = sentence.raw
    offset = content_start(raw)
    if _nothing_checkable(raw[offset:]):
        return []
    merged: list[tuple[int, int, str | None]] = []
    for raw_s, raw_e, subj in _pieces(raw[offset:]):
        s, e = _trim(raw, offset + raw_s, offset + raw_e)
        if merged and _words(raw[s:e]) < _MIN_CLAIM_WORDS:
            ps, _, psubj = merged[-1]
            merged[-1] = (ps, e, psubj)  # too short to stand alone: keep with the previous
        elif s < e:
            merged.append((s, e, subj))
    claims: list[Claim] = []
    base = sentence.start
    for s, e, subj in merged:
        own = raw[s:e]
        text = _clean(f"{subj} {own}" if subj else own)
        if _words(text) < 2 or not any(c.isalpha() for c in text):
            continue
        claims.append(
            Claim(
                index=first_index + len(claims),
                text=text,
                span=(base + s, base + e),
                sentence=(sentence.start, sentence.end),
            )
        )
    return claims


_EMPHASIS: Final = re.compile(r"\*\*|__|`")
# a claim that ends with a terminator of another script (an English sentence closed by
# "。" or "।") ends with its English one: the verifier reads English
_ENGLISH_END: Final = str.maketrans(
    {"\u3002": ".", "\uff61": ".", "\u0964": ".", "\u0965": ".", "\u06d4": ".",
     "\uff01": "!", "\uff1f": "?", "\u061f": "?"}
)  # fmt: skip


def _clean(text: str) -> str:
    text = _EMPHASIS.sub("", text).strip()
    text = text[0].upper() + text[1:] if text and text[0].islower() else text
    text = text[:-1] + text[-1:].translate(_ENGLISH_END)
    if text and text[-1] not in ".!?":
        text = text.rstrip(",;:") + "."
    return text
