"""Text folded for word matching: lower case, Latin letters without their accents.

The lexical matchers (the claim checker's content terms, the confidence scorer's missing
query words) read ``[a-z0-9]`` runs. Lower-casing alone cut a Latin word with an accent
into pieces (audit: "Zürich" gave the term "rich", "København" "benhavn", "Straße"
"stra"), so "Zürich" in a claim did not meet "Zurich" in the evidence and the
reformulation hint named "rich" as missing. :func:`fold` spells out the few letters that
have no decomposition (and the ligatures "ﬁ", "ﬂ", ... of text taken from PDFs, which
only a compatibility decomposition splits), decomposes the rest (canonical
decomposition, which at most quadruples a text where a compatibility one can multiply it
18 times) and drops the combining marks, so a word reads the same with or without its
accents. ASCII text comes back lower-cased and otherwise unchanged (the common case
costs one ``isascii`` scan). Other scripts keep their letters (without their marks, as
Latin ones), which the ``[a-z0-9]`` matchers do not read.

Every step is a scan in C, never a Python call per character or per combining mark: a
hostile 1 MB of accented letters costs less than splitting it into content terms.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

__all__ = ["fold"]

# Latin letters that have no canonical decomposition into a base letter
_SPELLED: Final = {
    "ß": "ss",
    "æ": "ae",
    "œ": "oe",
    "ø": "o",
    "ł": "l",
    "đ": "d",
    "ð": "d",
    "þ": "th",
    "\u0131": "i",  # dotless i
    "ħ": "h",
    "ŧ": "t",
    # the Latin ligatures of U+FB00-FB06, which text taken from PDFs is full of (without
    # them "ﬁnancial" read "nancial", and "ﬁrm proﬁt ﬂowed" did not meet "firm profit flowed")
    "\ufb00": "ff",
    "\ufb01": "fi",
    "\ufb02": "fl",
    "\ufb03": "ffi",
    "\ufb04": "ffl",
    "\ufb05": "st",
    "\ufb06": "st",
}
_SPELLED_RE: Final = re.compile("[" + "".join(_SPELLED) + "]")
# combining marks: diacritics, their extensions and supplements, marks for symbols, half marks
_MARK_RANGES: Final = (
    (0x300, 0x370),
    (0x1AB0, 0x1B00),
    (0x1DC0, 0x1E00),
    (0x20D0, 0x2100),
    (0xFE20, 0xFE30),
)
_MARKS: Final = frozenset(chr(c) for lo, hi in _MARK_RANGES for c in range(lo, hi))
_MARK_RE: Final = re.compile(
    "[" + "".join(f"{chr(lo)}-{chr(hi - 1)}" for lo, hi in _MARK_RANGES) + "]"
)


def fold(text: str) -> str:
    """``text`` lower-cased, with accented Latin letters as their base letters."""
    low = text.lower()
    if low.isascii():
        return low
    if _SPELLED_RE.search(low):
        for letter, spelled in _SPELLED.items():
            low = low.replace(letter, spelled)
    if not unicodedata.is_normalized("NFD", low):
        low = unicodedata.normalize("NFD", low)
    if _MARK_RE.search(low):
        for mark in _MARKS.intersection(low):  # a few distinct marks, each removed in one pass
            low = low.replace(mark, "")
    return low
