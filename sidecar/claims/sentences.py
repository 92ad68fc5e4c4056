"""Sentence boundaries in streamed text: decided as soon as the next character is known.

The sources cut an answer into claims after it is complete (docs/methods.md
§Claim verification); the sidecar does it while the answer streams, so a
claim verdict can go out the moment its sentence ends. A sentence is complete when

* a terminator run (``.``, ``!``, ``?``, ``...``, ``…``, the Devanagari danda
  ``।``/``॥``, the Arabic ``؟`` and the Urdu full stop U+06D4, optionally
  followed by closing quotes or brackets) is followed by whitespace, or
* a run holds a CJK terminator (``。``, ``｡``, the full-width ``!`` and ``?``),
  whatever follows but a combining mark: those scripts put no space after a
  sentence (before, a Chinese sentence between two English ones was read with
  them as one claim, and never counted unreadable), or
* a line ends (list items, headings and table rows are one unit per line;
  whatever ``str.splitlines`` ends a line at does: ``\n``, ``\r\n``, a lone
  ``\r``, ``\v``, ``\f``, the information separators U+001C-U+001E, NEL and the
  Unicode line and paragraph separators), or
* the stream finished (:meth:`SentenceSplitter.finish`).

No unit ends between a character and what extends it (a combining mark, a
variation selector, an emoji skin tone or ZWJ sequence), however the deltas
cut the text: a decomposed ``e`` + U+0301 split across two deltas is one ``é``.

Lines of a fenced code block (from a line opening with ````` or ``~~~`` to the
line that closes it, fences included) are units of kind ``code``: program text,
never a claim (``print(text)`` was read as the claim "Print(text)." and, found
in no evidence, blocked a well-supported answer).

A full stop is not a boundary when it belongs to a decimal (``3.14``: the next
character is a digit, never whitespace), a numbered-list marker (``1. Item``),
an initial (``J. K. Rowling``) or an abbreviation (``Dr.``, ``e.g.``, ``U.S.``,
``Inc.``). Abbreviations that may also end a sentence (``U.S.``, ``etc.``,
``Inc.``) end it only when the next word is a typical sentence opener
(``The``, ``It``, ``However`` ...), a line break follows, or more than
``MAX_GAP_CHARS`` of blank space follows; until that word is complete the
decision waits, so deltas that split a word anywhere give the same sentences
as the whole text at once.

Cost: linear in the length of the text, however it is cut into deltas. Every
decision looks at most a bounded distance back (``_MAX_WORD_CHARS``) and
ahead (``MAX_GAP_CHARS`` + the longest opener); a decision that waits for
more text is re-taken at bounded cost; and no unit grows past
``MAX_UNIT_CHARS``: a sentence longer than that is cut at its last whitespace
in the second half of the window (or hard at the limit when there is none,
moved back before a character whose combining marks it would cut off),
and the rest continues as the next unit. The splitter only keeps the current
unit as a working buffer, so appending a delta costs the delta plus at most
one unit. The cut depends on the text alone, never on the deltas.

Pure logic: no I/O, no third-party imports.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final, Literal

from sidecar.exceptions import ConfigError, LifecycleError

__all__ = [
    "MAX_GAP_CHARS",
    "MAX_UNIT_CHARS",
    "Sentence",
    "SentenceKind",
    "SentenceSplitter",
    "split_sentences",
]

SentenceKind = Literal[
    "statement", "question", "exclamation", "list-item", "heading", "intro", "code"
]

MAX_UNIT_CHARS: Final = 1_000
"""The longest unit (sentence, list item, line) in characters; longer ones are cut.

About the most a 256-token verifier input holds; a real sentence is far shorter."""
MAX_GAP_CHARS: Final = 64
"""Blank space after an ambiguous abbreviation (``U.S.``) longer than this ends the sentence."""

# CJK full stop, exclamation and question marks (full width) and the halfwidth full stop
_CJK_TERMINATOR_CHARS: Final = "\u3002\uff01\uff1f\uff61"
# ... and the Devanagari danda and double danda, the Arabic question mark, the Urdu full stop
_TERMINATOR_CHARS: Final = ".!?\u2026\u0964\u0965\u061f\u06d4" + _CJK_TERMINATOR_CHARS
# closing quotes and brackets, with the CJK corner quotes and full-width brackets
_CLOSER_CHARS: Final = "\"'\u201d\u2019)]\u00bb\u300d\u300f\uff09\u3011\u300b\u3009"
_INTERESTING: Final = re.compile(f"[\n{re.escape(_TERMINATOR_CHARS)}]")
_TERMINATORS: Final = re.compile(f"[{re.escape(_TERMINATOR_CHARS)}]*")
_CLOSERS: Final = re.compile(f"[{re.escape(_CLOSER_CHARS)}]*")
_CJK_TERMINATOR: Final = re.compile(f"[{_CJK_TERMINATOR_CHARS}]")
# what ends a line besides "\n" (those of ``str.splitlines``), read as "\n", one character
# for one, so spans still point into the answer ("\r\n" reads "\n\n": its empty second line
# is no unit): a list written with U+2028, or with old Mac "\r", between its items was one
# claim (audit)
_LINE_ENDS: Final = str.maketrans(dict.fromkeys("\r\v\f\x1c\x1d\x1e\x85\u2028\u2029", "\n"))
_SPACES: Final = re.compile(r"[ \t]*")
_GAP: Final = re.compile(r"[^\S\n]*")
_ALL_SPACE: Final = re.compile(r"\s*")
# Abbreviations (lower case, without the final dot) that never end a sentence.
_NEVER_END: Final = frozenset(
    {
        "dr", "mr", "mrs", "ms", "prof", "st", "mt", "ft", "vs", "v", "e.g", "i.e", "cf",
        "approx", "no", "nos", "fig", "figs", "eq", "eqs", "ref", "refs", "vol", "pp", "p",
        "gen", "col", "lt", "sgt", "capt", "cmdr", "rev", "hon", "gov", "sen", "rep", "pres",
        "dept", "univ", "est", "al", "ca", "c", "viz", "resp", "incl", "min", "max",
        "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
        "ph.d", "m.d", "b.a", "m.a", "b.sc", "m.sc", "op", "ed", "eds", "chap", "sec",
    }
)  # fmt: skip
# Abbreviations that end a sentence only before a sentence opener or a line break.
_MAY_END: Final = frozenset(
    {"etc", "inc", "ltd", "co", "corp", "llc", "plc", "jr", "sr", "bros", "a.m", "p.m", "u.s",
     "u.k", "u.n", "e.u", "u.s.a", "d.c", "b.c", "a.d", "b.c.e", "c.e"}
)  # fmt: skip
_OPENERS: Final = frozenset(
    {
        "the", "this", "that", "these", "those", "it", "its", "he", "she", "they", "we", "i",
        "you", "there", "here", "a", "an", "in", "on", "at", "as", "for", "however", "but",
        "and", "also", "moreover", "furthermore", "therefore", "thus", "his", "her", "their",
        "our", "my", "some", "many", "most", "after", "before", "when", "while", "since",
        "although", "if", "because", "so", "then", "today", "during", "both", "each",
    }
)  # fmt: skip
_LONGEST_OPENER: Final = max(len(w) for w in _OPENERS)
_OPENER_WORD: Final = re.compile(rf"(?:[^\W_]|['\u2019\-]){{0,{_LONGEST_OPENER + 1}}}")
# A word before a full stop longer than this is no abbreviation, initial or marker.
_MAX_WORD_CHARS: Final = 32
_MIN_UNIT_CHARS: Final = 2 * (MAX_GAP_CHARS + _LONGEST_OPENER + _MAX_WORD_CHARS)
_ACRONYM: Final = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
_MARKER_WORD: Final = re.compile(r"\d{1,3}|[A-Za-z]|[ivxIVX]{1,4}")
_LIST_MARKER: Final = re.compile(
    r"[ \t]*+(?:[-*+•‣◦▪\u2013]|\d{1,3}[.)]|[A-Za-z][)]|\(\w{1,3}\))[ \t]+"
)
_HEADING: Final = re.compile(
    r"[ \t]*+(?:#{1,6}[ \t]|\*\*[^*]++\*\*:?[ \t]*$|[A-Z][^.!?]{0,60}:[ \t]*$)"
)
_EMPHASIS: Final = re.compile(r"\*\*|__|`")
_FENCES: Final = ("```", "~~~")  # a line opening with one opens or closes a code block
_CODE: Final[tuple[int, SentenceKind]] = (0, "code")  # (list marker length, kind)


def _extends_grapheme(char: str) -> bool:
    """Is ``char`` part of the character before it (a combining mark, a variation selector,
    ZWJ or ZWNJ, an emoji skin tone: UAX #29 Extend, SpacingMark and ZWJ, near enough)?"""
    return (
        unicodedata.category(char)[0] == "M"
        or char in "\u200c\u200d"
        or "\U0001f3fb" <= char <= "\U0001f3ff"
    )


def _span_end(pattern: re.Pattern[str], text: str, pos: int, endpos: int | None = None) -> int:
    """Where ``pattern`` (one that may match empty) stops matching from ``pos``."""
    found = pattern.match(text, pos) if endpos is None else pattern.match(text, pos, endpos)
    return found.end() if found is not None else pos


@dataclass(frozen=True, slots=True)
class Sentence:
    """One completed sentence: ``[start, end)`` in the whole text, list markers excluded.

    ``raw`` is the text's own characters ``text_fed[start:end]``; ``text`` is
    the same without emphasis marks (``**``, ``__``, backticks).
    """

    start: int
    end: int
    text: str
    kind: SentenceKind
    raw: str


def _classify(raw: str, line_start: bool) -> tuple[int, SentenceKind]:
    """How many leading characters are a list marker, and what kind of unit this is."""
    if line_start:
        if _HEADING.match(raw):
            return 0, "heading"
        marker = _LIST_MARKER.match(raw)
        if marker is not None:
            body = raw[marker.end() :].rstrip()
            kind: SentenceKind = "list-item"
            if body.endswith("?"):
                kind = "question"
            elif body.endswith(":"):
                kind = "intro"
            return marker.end(), kind
    body = raw.rstrip()
    if body.endswith(("?", '?"', "?)", "\uff1f", "\u061f")):
        return 0, "question"
    if body.endswith(":"):
        return 0, "intro"
    if body.endswith("!"):
        return 0, "exclamation"
    return 0, "statement"


class SentenceSplitter:
    """Feed text in pieces; get each sentence once its end is certain.

    ``feed`` and ``finish`` return the newly completed sentences, with offsets
    into the concatenation of everything fed. The result does not depend on
    how the text was cut into pieces, and the work is linear in its length.
    """

    def __init__(self, max_unit_chars: int = MAX_UNIT_CHARS) -> None:
        if max_unit_chars < _MIN_UNIT_CHARS:
            raise ConfigError(
                f"max_unit_chars must be >= {_MIN_UNIT_CHARS} (twice the look-around of one "
                f"boundary decision), got {max_unit_chars}"
            )
        self._cap = max_unit_chars
        self._parts: list[str] = []  # everything fed, joined only when ``text`` is read
        self._buf = ""  # the text from ``_base`` on: the current unit and what follows
        self._base = 0
        self._length = 0
        self._start = 0  # where the next unit starts (may point at whitespace)
        self._line_blank = True  # only whitespace between the last line break and ``_start``
        self._fence: str | None = None  # the fence of the code block the text is in
        self._scan = 0  # the first character not yet examined as a boundary
        self._run: tuple[int, int, int] | None = None  # (start, end of terminators, end of closers)
        self._finished = False

    @property
    def text(self) -> str:
        """Everything fed so far (joined once per read; read it at the end)."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    @property
    def length(self) -> int:
        """How many characters were fed."""
        return self._length

    def feed(self, piece: str) -> list[Sentence]:
        if self._finished:
            raise LifecycleError("feed() after finish(): the splitter is closed")
        if not piece:
            return []
        self._parts.append(piece)
        self._length += len(piece)
        self._buf += piece.translate(_LINE_ENDS)
        return self._drain(final=False)

    def finish(self) -> list[Sentence]:
        """The stream ended: whatever remains is the last sentence."""
        if self._finished:
            return []
        self._finished = True
        out = self._drain(final=True)
        tail = self._emit(self._start, self._length)
        if tail is not None:
            out.append(tail)
        self._start = self._scan = self._length
        return out

    # ------------------------------------------------------------------ scanning

    def _at(self, i: int) -> str:
        return self._buf[i - self._base]

    def _drain(self, final: bool) -> list[Sentence]:
        out: list[Sentence] = []
        n = self._length
        i = self._scan
        while True:
            limit = self._start + self._cap
            # only up to the limit: past it the unit is cut whatever follows
            found = _INTERESTING.search(self._buf, i - self._base, limit + 1 - self._base)
            if found is None:
                if n > limit:
                    i = self._cut(out)
                    continue
                i = n
                break
            i = found.start() + self._base
            if self._buf[found.start()] == "\n":
                if i > limit:
                    i = self._cut(out)
                    continue
                self._append(out, self._emit(self._start, i))
                self._start = i + 1
                self._line_blank = True
                i += 1
                continue
            j = self._run_end(i, limit)
            if j > limit:
                i = self._cut(out)
                continue
            if j >= n and not final:
                break  # the character after the run decides: wait for it
            decision = self._is_boundary(i, j, final)
            if decision is None:
                break  # needs the next word, which is still incomplete
            self._run = None
            if decision:
                self._append(out, self._emit(self._start, j))
                self._start = j
                self._line_blank = False
            i = j
        self._scan = i
        self._compact()
        return out

    @staticmethod
    def _append(out: list[Sentence], sentence: Sentence | None) -> None:
        if sentence is not None:
            out.append(sentence)

    def _run_end(self, i: int, limit: int) -> int:
        """End of the terminator run at ``i`` with its closers (resumed where it was left).

        Looks no further than ``limit + 1``: a run that reaches it ends the unit past the limit.
        """
        buf, base = self._buf, self._base
        stop = limit + 1 - base
        if self._run is not None and self._run[0] == i:
            _, t_end, c_end = self._run
            if c_end == t_end:  # no closer yet: the terminators may still grow
                t_end = _span_end(_TERMINATORS, buf, t_end - base, stop) + base
                c_end = t_end
        else:
            t_end = c_end = _span_end(_TERMINATORS, buf, i - base, stop) + base
        c_end = _span_end(_CLOSERS, buf, c_end - base, stop) + base
        self._run = (i, t_end, c_end)
        return c_end

    def _cut(self, out: list[Sentence]) -> int:
        """The unit reached ``MAX_UNIT_CHARS`` without a boundary: cut it, return the new scan."""
        start = self._start
        limit = start + self._cap
        window = self._buf[start - self._base + self._cap // 2 : limit - self._base]
        at = max(window.rfind(c) for c in " \t\u00a0\u3000")
        cut = start + self._cap // 2 + at if at >= 0 else self._grapheme_start(limit)
        self._append(out, self._emit(start, cut))
        self._start = cut
        self._line_blank = False
        self._run = None
        return cut

    def _grapheme_start(self, limit: int) -> int:
        """The hard cut at ``limit``, moved back before the character whose combining marks
        (or skin tone, ZWJ sequence ...) it would cut off; ``limit`` itself when the second
        half of the unit is all such marks."""
        floor = self._start + self._cap // 2
        cut = limit
        while cut > floor and (_extends_grapheme(self._at(cut)) or self._at(cut - 1) == "\u200d"):
            cut -= 1
        return cut if cut > floor else limit

    def _compact(self) -> None:
        """Drop what lies before the current unit from the working buffer."""
        drop = self._start - self._base
        if drop > 0:
            self._buf = self._buf[drop:]
            self._base = self._start

    def _is_boundary(self, i: int, j: int, final: bool) -> bool | None:
        """Is the terminator run ``text[i:j]`` a sentence end? ``None``: not known yet."""
        if _CJK_TERMINATOR.search(self._buf, i - self._base, j - self._base):
            # "。" ends a sentence without a space: "东京在日本。Paris is ...", but never
            # between a character and its combining mark
            return j >= self._length or not _extends_grapheme(self._at(j))
        if j < self._length and not self._at(j).isspace():
            return False  # "3.14", "e.g.,", "U.S.-based", "?!x"
        if j - i != 1 or self._at(i) != ".":
            return True  # "!", "?", "...", "?!" and 'said "no."' end a sentence
        return self._full_stop_ends(i, j, final)

    def _word_before(self, i: int) -> tuple[int, str] | None:
        """The word ending at ``i`` (at most ``_MAX_WORD_CHARS``), ``None`` when longer."""
        buf, base = self._buf, self._base
        floor = max(self._start, i - _MAX_WORD_CHARS - 1)
        k = i
        while k > floor and not buf[k - 1 - base].isspace():
            k -= 1
        if k == floor and k > self._start and not buf[k - 1 - base].isspace():
            return None
        return k, buf[k - base : i - base]

    def _full_stop_ends(self, i: int, j: int, final: bool) -> bool | None:
        """A single full stop at ``i`` followed by whitespace: abbreviation, marker or end?"""
        found = self._word_before(i)
        if found is None:
            return True  # a long word: no abbreviation
        word_start, raw = found
        if (not raw or _MARKER_WORD.fullmatch(raw)) and self._line_blank:
            blank = _ALL_SPACE.match(self._buf, self._start - self._base, word_start - self._base)
            if blank is not None and blank.end() + self._base == word_start:
                return False  # a numbered-list marker "1. " (or a lone dot)
        word = raw.lstrip("\"'\u201c\u2018([")
        lower = word.lower()
        if len(word) == 1 and word.isupper():
            return False  # an initial: "J. K. Rowling"
        if lower in _NEVER_END:
            return self._newline_follows(j)
        if lower in _MAY_END or _ACRONYM.fullmatch(word):
            return self._opener_follows(j, final)
        return True

    def _newline_follows(self, j: int) -> bool:
        k = _span_end(_SPACES, self._buf, j - self._base) + self._base
        return k < self._length and self._at(k) == "\n"

    def _opener_follows(self, j: int, final: bool) -> bool | None:
        base = self._base
        gap = _span_end(_GAP, self._buf, j - base, j - base + MAX_GAP_CHARS + 1) + base
        if gap - j > MAX_GAP_CHARS:
            return True  # a wide blank gap separates like a line break
        if gap < self._length and self._at(gap) == "\n":
            return True
        if gap >= self._length:
            return True if final else None
        end = _span_end(_OPENER_WORD, self._buf, gap - base) + base
        if end - gap > _LONGEST_OPENER:
            return False  # longer than any opener: "Thames", not "The"
        if end >= self._length and not final:
            return None  # the next word may still grow: "Th" -> "The" or "Thames"
        word = self._buf[gap - base : end - base]
        return word[:1].isupper() and word.lower() in _OPENERS

    def _code(self, body: str, line_start: bool) -> bool:
        """Is this unit (``body``: its text without leading blanks) part of a fenced code
        block? A line opening with a fence opens a block, or closes the one it is in."""
        fence = next((f for f in _FENCES if body.startswith(f)), None) if line_start else None
        if fence is None:
            return self._fence is not None
        if self._fence is None:
            self._fence = fence
        elif self._fence == fence:
            self._fence = None
        return True

    def _emit(self, start: int, end: int) -> Sentence | None:
        raw = self._buf[start - self._base : end - self._base]
        body = raw.lstrip()
        stripped_left = len(raw) - len(body)
        line_start = self._line_blank
        marker, kind = _CODE if self._code(body, line_start) else _classify(body, line_start)
        body = body[marker:]
        lead = len(body) - len(body.lstrip())
        body = body.strip()
        if not body or not any(c.isalnum() for c in body):
            return None
        s = start + stripped_left + marker + lead
        return Sentence(
            start=s, end=s + len(body), text=_EMPHASIS.sub("", body), kind=kind, raw=body
        )


def split_sentences(text: str) -> list[Sentence]:
    """All sentences of a complete text (the streaming splitter, fed at once)."""
    splitter = SentenceSplitter()
    return splitter.feed(text) + splitter.finish()
