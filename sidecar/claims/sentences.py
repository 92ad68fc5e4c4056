"""Sentence boundaries in streamed text: decided as soon as the next character is known.

Seed 001 ("Reliable RAG: Building Systems That Know What They Don't Know",
Step 1) and seed 002 (claim extraction) cut an answer into claims after it is
complete; the sidecar does it while the answer streams, so a claim verdict can
go out the moment its sentence ends. A sentence is complete when

* a terminator run (``.``, ``!``, ``?``, ``...``, ``…``, optionally followed by
  closing quotes or brackets) is followed by whitespace, or
* a line ends (list items, headings and table rows are one unit per line), or
* the stream finished (:meth:`SentenceSplitter.finish`).

A full stop is not a boundary when it belongs to a decimal (``3.14``: the next
character is a digit, never whitespace), a numbered-list marker (``1. Item``),
an initial (``J. K. Rowling``) or an abbreviation (``Dr.``, ``e.g.``, ``U.S.``,
``Inc.``). Abbreviations that may also end a sentence (``U.S.``, ``etc.``,
``Inc.``) end it only when the next word is a typical sentence opener
(``The``, ``It``, ``However`` ...) or a line break follows; until that word is
complete the decision waits, so deltas that split a word anywhere give the
same sentences as the whole text at once.

Pure logic: no I/O, no third-party imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["Sentence", "SentenceKind", "SentenceSplitter", "split_sentences"]

SentenceKind = Literal["statement", "question", "exclamation", "list-item", "heading", "intro"]

_TERMINATORS: Final = frozenset(".!?…")
_CLOSERS: Final = frozenset("\"'\u201d\u2019)]\u00bb")
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
_ACRONYM = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")
_LIST_MARKER = re.compile(r"^[ \t]*(?:[-*+•‣◦▪\u2013]|\d{1,3}[.)]|[A-Za-z][)]|\(\w{1,3}\))[ \t]+")
_NUMBERED = re.compile(r"^[ \t]*(?:\d{1,3}|[A-Za-z]|[ivxIVX]{1,4})$")
_HEADING = re.compile(r"^[ \t]*(?:#{1,6}[ \t]|\*\*[^*]+\*\*:?[ \t]*$|[A-Z][^.!?]{0,60}:[ \t]*$)")
_EMPHASIS = re.compile(r"\*\*|__|`")


@dataclass(frozen=True, slots=True)
class Sentence:
    """One completed sentence: ``[start, end)`` in the whole text, list markers excluded."""

    start: int
    end: int
    text: str
    kind: SentenceKind


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
    if body.endswith("?") or body.endswith('?"') or body.endswith("?)"):
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
    how the text was cut into pieces.
    """

    def __init__(self) -> None:
        self._text = ""
        self._start = 0  # where the next sentence starts (may point at whitespace)
        self._scan = 0  # the first character not yet examined as a boundary
        self._finished = False

    @property
    def text(self) -> str:
        return self._text

    @property
    def consumed(self) -> int:
        """Characters up to the end of the last completed sentence (whitespace skipped)."""
        return self._start

    def feed(self, piece: str) -> list[Sentence]:
        if self._finished:
            raise ValueError("feed() after finish(): the splitter is closed")
        self._text += piece
        return self._drain(final=False)

    def finish(self) -> list[Sentence]:
        """The stream ended: whatever remains is the last sentence."""
        if self._finished:
            return []
        self._finished = True
        out = self._drain(final=True)
        tail = self._emit(self._start, len(self._text))
        if tail is not None:
            out.append(tail)
        self._start = self._scan = len(self._text)
        return out

    def replace_text(self, text: str) -> None:
        """Continue on ``text`` (the final answer) instead of what was fed.

        Used when the final answer is not an extension of the streamed text:
        completed sentences stay as they were, scanning resumes at the last
        completed boundary (clamped to the new text).
        """
        self._text = text
        self._start = min(self._start, len(text))
        self._scan = self._start

    # ------------------------------------------------------------------ scanning

    def _drain(self, final: bool) -> list[Sentence]:
        out: list[Sentence] = []
        text = self._text
        i = self._scan
        n = len(text)
        while i < n:
            ch = text[i]
            if ch == "\n":
                sentence = self._emit(self._start, i)
                if sentence is not None:
                    out.append(sentence)
                self._start = i + 1
                i += 1
                continue
            if ch not in _TERMINATORS:
                i += 1
                continue
            j = i
            while j < n and text[j] in _TERMINATORS:
                j += 1
            while j < n and text[j] in _CLOSERS:
                j += 1
            if j >= n and not final:
                break  # the character after the run decides: wait for it
            decision = self._is_boundary(i, j, final)
            if decision is None:
                break  # needs the next word, which is still incomplete
            if decision:
                sentence = self._emit(self._start, j)
                if sentence is not None:
                    out.append(sentence)
                self._start = j
            i = j
        self._scan = i
        return out

    def _is_boundary(self, i: int, j: int, final: bool) -> bool | None:
        """Is the terminator run ``text[i:j]`` a sentence end? ``None``: not known yet."""
        text = self._text
        if j < len(text) and not text[j].isspace():
            return False  # "3.14", "e.g.,", "U.S.-based", "?!x"
        if text[i:j] != ".":
            return True  # "!", "?", "...", "?!" and 'said "no."' end a sentence
        return self._full_stop_ends(i, j, final)

    def _full_stop_ends(self, i: int, j: int, final: bool) -> bool | None:
        """A single full stop at ``i`` followed by whitespace: abbreviation, marker or end?"""
        text = self._text
        word_start = i
        while word_start > 0 and not text[word_start - 1].isspace():
            word_start -= 1
        word = text[word_start:i].lstrip("\"'\u201c\u2018([")
        line_start = text.rfind("\n", 0, i) + 1
        if not text[line_start:i].strip() or _NUMBERED.match(text[line_start:i]):
            return False  # a numbered-list marker "1. " (or a lone dot)
        lower = word.lower()
        if len(word) == 1 and word.isupper():
            return False  # an initial: "J. K. Rowling"
        if lower in _NEVER_END:
            return self._newline_follows(j)
        if lower in _MAY_END or _ACRONYM.match(word):
            return self._opener_follows(j, final)
        return True

    def _newline_follows(self, j: int) -> bool:
        k = j
        text = self._text
        while k < len(text) and text[k] in " \t":
            k += 1
        return k < len(text) and text[k] == "\n"

    def _opener_follows(self, j: int, final: bool) -> bool | None:
        text = self._text
        k = j
        while k < len(text) and text[k].isspace():
            if text[k] == "\n":
                return True
            k += 1
        if k >= len(text):
            return True if final else None
        end = k
        while end < len(text) and (text[end].isalnum() or text[end] in "'\u2019-"):
            end += 1
        if end >= len(text) and not final:
            return None  # the next word may still grow: "Th" -> "The" or "Thames"
        word = text[k:end]
        return word[:1].isupper() and word.lower() in _OPENERS

    def _emit(self, start: int, end: int) -> Sentence | None:
        raw = self._text[start:end]
        stripped_left = len(raw) - len(raw.lstrip())
        line_start = (
            start + stripped_left == 0
            or self._text[
                self._text.rfind("\n", 0, start + stripped_left) + 1 : start + stripped_left
            ].strip()
            == ""
        )
        body = raw[stripped_left:]
        marker, kind = _classify(body, line_start)
        body = body[marker:]
        lead = len(body) - len(body.lstrip())
        body = body.strip()
        if not body or not any(c.isalnum() for c in body):
            return None
        s = start + stripped_left + marker + lead
        return Sentence(start=s, end=s + len(body), text=_EMPHASIS.sub("", body), kind=kind)


def split_sentences(text: str) -> list[Sentence]:
    """All sentences of a complete text (the streaming splitter, fed at once)."""
    splitter = SentenceSplitter()
    return splitter.feed(text) + splitter.finish()
