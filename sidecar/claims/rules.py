"""The rule tier: numbers, dates and named quantities must appear in the evidence.

The sources' worked examples turn on figures ("500mg twice daily", "2000mg/day",
"eGFR < 30", "$442 billion" are unsupported because no such figure is in the
context; docs/methods.md §Claim verification). A cross-encoder is
weak at exact figures, so a deterministic rule runs beside it: every quantity
of the claim must be found among the evidence's quantities, otherwise the
claim is not supported, whatever the model says. The rule never upgrades a
claim (a matching number does not make a claim true).

What counts as a quantity:

* numbers with separators, decimals, signs, ranges (``1,000``, ``3.14``,
  ``325-650``), with a scale word (``1.5 million`` = ``1,500,000``) and
  percentages (``1.5%``); digits inside identifiers (``HbA1c``) are not;
* money's short scales after a currency sign: ``£15.4m`` = ``15.4 million``, ``$64k``,
  ``$2bn``, ``€3b`` (without the sign ``m`` is as often metres: not read as a scale);
  a range with one scale gives it to both ends (``5-10 million``, ``5 to 10 million``,
  ``between 5 and 10 million``, ``$5-10m``);
* number words ``one`` .. ``twenty``, tens, ``hundred``, ``dozen`` (``one`` only next to
  another number: on its own it is mostly a pronoun); words in a row make one number
  (``twenty-five``, ``two hundred and five``, ``five million``, ``nineteen eighty-four``);
* month names next to a number, and unambiguous month names on their own
  (``May`` counts only beside a number);
* a time of day is hours and minutes, written with a colon or a dot (``7:30pm`` and
  ``7.30pm`` both read 7 and 30).

The evidence also reads ``a thousand`` .. ``a trillion`` (``a million`` holds a claim's
``1 million``), a month before "of" and a number (``in May of 2018`` holds a claim's
``May 1``), ordinal words (``the third season`` holds a claim's ``3rd``; not the
unit of time in ``a 30 second ad``, ``per second``, ``a split second``),
two years glued into one run of digits (``released
20092009 was the year``: knowledge-graph facts joined without a space) as both years,
and a number glued to the sentence before it (``in Manhattan.55 Hudson Yards``); an
extra evidence value can only let a claim value match, never cap a claim.

A claim value matches an evidence value when they are equal up to the claim's
own precision (``1.5 million`` matches ``1,523,000``; ``1.5%`` matches
``1.52%``, not ``1.7%``). Pure logic: no I/O.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Final

__all__ = ["Quantity", "RuleCheck", "check_quantities", "extract_quantities"]

_SCALE: Final = {
    "thousand": 1e3, "million": 1e6, "mn": 1e6, "billion": 1e9, "bn": 1e9, "trillion": 1e12,
    "tn": 1e12,
}  # fmt: skip
_WORDS: Final = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
    "eighty": 80, "ninety": 90, "hundred": 100, "dozen": 12,
}  # fmt: skip
_MONTHS: Final = {
    "january": 1, "jan": 1, "february": 2, "feb": 2, "march": 3, "mar": 3, "april": 4,
    "apr": 4, "may": 5, "june": 6, "jun": 6, "july": 7, "jul": 7, "august": 8, "aug": 8,
    "september": 9, "sep": 9, "sept": 9, "october": 10, "oct": 10, "november": 11, "nov": 11,
    "december": 12, "dec": 12,
}  # fmt: skip
_SCALE_WORDS: Final = "|".join(_SCALE)
_CURRENCY: Final = "[$£€¥]"
_NUM: Final = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"  # a number as _NUMBER reads it
_NUMBER: Final = re.compile(
    r"(?<![A-Za-z0-9.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?" rf"(?:\s*({_SCALE_WORDS})\b)?",
    re.IGNORECASE,
)
# After a currency sign only: "£15.4m", "$64k", "$2bn" (the long words and bn/mn/tn are
# read by _NUMBER with or without a sign). Audit: on the validation summaries, right
# summaries saying "£200m" / "$2.5m" were capped against "200million" / "2.5 million".
_CURRENCY_BEFORE: Final = re.compile(_CURRENCY + r"\s?$")
_SHORT_SCALE: Final = re.compile(r"(k|m|b)\b", re.IGNORECASE)
_SHORT_SCALES: Final = {"k": 1e3, "m": 1e6, "b": 1e9}
# A range with one scale ("5-10 million", "5 to 10 million", "between 5 and 10 million",
# "$5-10m"): its first number takes the scale written after the second; "$5-" before a
# number makes it money too. The tails: (range, between) x (scale word, money's short scale).
_RANGE_SEP: Final = r"(?:\s?[-\u2013]\s?|\s+to\s+)"
_BETWEEN_SEP: Final = r"\s+and\s+"
_WORD_TAIL: Final = _CURRENCY + "?" + _NUM + rf"\s*({_SCALE_WORDS})\b"
_SHORT_TAIL: Final = _CURRENCY + r"?\s?" + _NUM + r"(k|m|b)\b"
_RANGE_WORD_TAIL: Final = re.compile(_RANGE_SEP + _WORD_TAIL, re.IGNORECASE)
_RANGE_SHORT_TAIL: Final = re.compile(_RANGE_SEP + _SHORT_TAIL, re.IGNORECASE)
_BETWEEN_WORD_TAIL: Final = re.compile(_BETWEEN_SEP + _WORD_TAIL, re.IGNORECASE)
_BETWEEN_SHORT_TAIL: Final = re.compile(_BETWEEN_SEP + _SHORT_TAIL, re.IGNORECASE)
_BETWEEN_HEAD: Final = re.compile(r"\bbetween\s+" + _CURRENCY + r"?$", re.IGNORECASE)
_RANGE_HEAD: Final = re.compile(_CURRENCY + r"\s?" + _NUM + r"\s?[-\u2013]\s?$")
# A time of day written with a dot ("7.30pm", "10.15 a.m."): hours and minutes, as "7:30pm"
# reads, not the decimal 7.3 (a claim's "7:30pm" was capped against "7.30pm").
_CLOCK_AFTER: Final = re.compile(r"\s?(?:[ap]\.?m\b\.?)", re.IGNORECASE)
# Two years in one run of digits (1000-2099 each): HaluEval's knowledge strings glue
# facts ("The Box was released 20092009 was the year that released Zombieland").
_GLUED_YEARS: Final = re.compile(r"(?<![0-9])((?:1\d|20)\d\d)((?:1\d|20)\d\d)(?![0-9])")
# A sentence glued to the next one's leading number ("in Manhattan.55 Hudson Yards is ..."):
# the evidence reads the number (the claim side keeps ".55" as no number of its own).
_GLUED_SENTENCE: Final = re.compile(r"(?<=[A-Za-z])\.(?=\d)")
# Number words in a row make one number ("twenty-five", "two hundred and five", "three
# thousand", "nineteen eighty-four"): read word by word, "twenty-five years" was capped
# against "25 years" (20 and 5 missing) and "5 million" against "five million".
_RUN_SCALES: Final = {w: _SCALE[w] for w in ("thousand", "million", "billion", "trillion")}
_RUN_WORD: Final = re.compile(r"\b(" + "|".join([*_WORDS, *_RUN_SCALES]) + r")\b", re.IGNORECASE)
_RUN_GAP: Final = re.compile(r"[ \t\u00a0\-\u2010\u2011\u2013]{1,3}")
_AND_GAP: Final = re.compile(r"[ \t\u00a0]{1,3}and[ \t\u00a0]{1,3}", re.IGNORECASE)
_AND_AFTER: Final = frozenset({"hundred", *_RUN_SCALES})
# Ordinal words, read in the evidence only: a claim's "3rd season" (read as 3) was capped
# against "the third season"; read in claims they would cap every "the first to ...".
_ORDINALS: Final = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13,
    "fourteenth": 14, "fifteenth": 15, "sixteenth": 16, "seventeenth": 17, "eighteenth": 18,
    "nineteenth": 19, "twentieth": 20, "thirtieth": 30, "fortieth": 40, "fiftieth": 50,
    "sixtieth": 60, "seventieth": 70, "eightieth": 80, "ninetieth": 90, "hundredth": 100,
}  # fmt: skip
_ORDINAL: Final = re.compile(
    r"\b(?:("
    + "|".join(w for w, v in _WORDS.items() if v >= 20 and v % 10 == 0 and v < 100)
    + r")[ \-\u2010\u2011])?("
    + "|".join(_ORDINALS)
    + r")\b",
    re.IGNORECASE,
)
# "a million" is one million, read in the evidence only (a claim's "1 million" was capped
# against it); in claims "a thousand times" is as often a manner of speaking.
_A_SCALE: Final = re.compile(r"\ba[ \t\u00a0]+(" + "|".join(_RUN_SCALES) + r")\b", re.IGNORECASE)
# "second" the unit of time, not the ordinal: after a number, "per", "every" or "split"
_BEFORE_TIME_SECOND: Final = re.compile(
    r"(?:\d|\b(?:" + "|".join(_WORDS) + r"|per|every|split))[ \t\u00a0\-]+$", re.IGNORECASE
)
_NUMBER_WORD: Final = re.compile(r"\b(" + "|".join(_WORDS) + r")\b", re.IGNORECASE)
_MONTH: Final = re.compile(
    r"\b(January|February|March|April|May|June|July|August|September|October|November|"
    r"December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\b\.?"
)
# Month abbreviations and "May"/"March" are also ordinary words: only next to a number
# (in the evidence also before "of" and a number: "in May of 2018").
_AMBIGUOUS_MONTHS: Final = frozenset({"may", "mar", "jan", "jun", "jul", "aug", "sep", "oct"})
_OF_NUMBER: Final = re.compile(r"[ \t\u00a0]+of[ \t\u00a0]+\d")
# "one" is mostly a pronoun ("that one", "no one", "one of the best"): a quantity only next
# to another number ("one hundred", "twenty-one"). Audit: on the held-out dialogue pairs, 43
# of the 98 true responses the rule overrode were capped for "one" alone ("Have you seen
# that one?").
_PRONOUNS: Final = frozenset({"one"})


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number (``value`` with its ``precision``) or a month (``month`` 1-12)."""

    surface: str
    value: float | None = None
    precision: float = 0.0
    month: int | None = None


@dataclass(frozen=True, slots=True)
class RuleCheck:
    """The claim's quantities and those the evidence does not contain."""

    checked: tuple[Quantity, ...]
    missing: tuple[Quantity, ...]

    @property
    def applies(self) -> bool:
        return bool(self.checked)

    @property
    def contradicted(self) -> bool:
        return bool(self.missing)

    def describe(self) -> str:
        if not self.missing:
            return "all quantities found in the evidence"
        return "not in the evidence: " + ", ".join(q.surface for q in self.missing)


def _precision(integer: str, fraction: str | None, scale: float) -> float:
    if fraction:
        return (10.0 ** -(len(fraction) - 1)) * scale
    return scale if scale > 1 else 1.0


def extract_quantities(text: str, *, evidence: bool = False) -> list[Quantity]:
    """Numbers, number words and months of ``text``, in order of appearance.

    ``evidence``: every ``one`` counts (a claim's "1 Oscar" matches "one Oscar"; an extra
    evidence value can only let a claim value match, never cap it).
    """
    if evidence:
        text = _GLUED_SENTENCE.sub(". ", text)
    found, number_spans = _digit_quantities(text, evidence=evidence)
    words = list(_NUMBER_WORD.finditer(text))
    spans = number_spans + [m.span() for m in words]
    starts, ends = {s for s, _ in spans}, {e for _, e in spans}
    for run in _word_runs(text):
        gaps = [text[a.end() : b.start()] for a, b in itertools.pairwise(run)]
        said = _run_value([m.group(1).lower() for m in run], gaps)
        if said is not None and len(run) > 1:
            last = run[-1].group(1).lower()
            surface = text[run[0].start() : run[-1].end()]
            found.append((run[0].start(), Quantity(surface, said, _RUN_SCALES.get(last, 1.0))))
            number_spans.append((run[0].start(), run[-1].end()))
            continue
        for m in run:  # one word, or words that make no number together ("five six")
            word = m.group(1).lower()
            if word not in _WORDS or (
                not evidence
                and word in _PRONOUNS
                and not _next_to_number(m.start(), m.end(), starts, ends)
            ):
                continue
            found.append((m.start(), Quantity(m.group(0), float(_WORDS[word]), 1.0)))
            number_spans.append((m.start(), m.end()))
    if evidence:
        for m in _A_SCALE.finditer(text):  # "a million": a scale word starts no run
            scale = _RUN_SCALES[m.group(1).lower()]
            found.append((m.start(), Quantity(m.group(0), scale, scale)))
        for m in _ORDINAL.finditer(text):
            if (
                m.group(2).lower() == "second"
                and m.group(1) is None
                and _BEFORE_TIME_SECOND.search(text, max(0, m.start() - 16), m.start())
            ):
                continue  # "30 second", "per second", "a split second": the unit of time
            tens = _WORDS[m.group(1).lower()] if m.group(1) else 0
            found.append(
                (m.start(), Quantity(m.group(0), float(tens + _ORDINALS[m.group(2).lower()])))
            )
    starts = {s for s, _ in number_spans}
    ends = {e for _, e in number_spans}
    for m in _MONTH.finditer(text):
        name = m.group(1).lower()
        if (
            name in _AMBIGUOUS_MONTHS
            and not _next_to_number(m.start(), m.end(), starts, ends)
            and not (evidence and _OF_NUMBER.match(text, m.end()))
        ):
            continue
        found.append((m.start(), Quantity(m.group(1), month=_MONTHS[name])))
    return [q for _, q in sorted(found, key=lambda pair: pair[0])]


def _digit_quantities(
    text: str, *, evidence: bool
) -> tuple[list[tuple[int, Quantity]], list[tuple[int, int]]]:
    """The numbers written in digits (with where each starts), and their spans."""
    found: list[tuple[int, Quantity]] = []
    spans: list[tuple[int, int]] = []
    for m in _NUMBER.finditer(text):
        integer, fraction = m.group(1), m.group(2)
        start = m.start()
        scale, surface, end = _scale(text, m)
        try:
            base = Decimal(integer.replace(",", "") + (fraction or ""))
        except InvalidOperation:  # pragma: no cover - the pattern only admits digits
            continue
        spans.append((start, end))
        if _is_clock(text, m, scale):
            # "7.30pm" is the time "7:30pm" (read as 7 and 30), not 7.3
            found.append((start, Quantity(integer, float(integer), 1.0)))
            found.append(
                (start + len(integer) + 1, Quantity(fraction[1:], float(fraction[1:]), 1.0))
            )
            continue
        value = float(base) * scale
        found.append((start, Quantity(surface, value, _precision(integer, fraction, scale))))
        if evidence and scale == 1.0 and not fraction:
            glued = _GLUED_YEARS.fullmatch(integer)
            if glued is not None:
                found.extend((start, Quantity(y, float(y), 1.0)) for y in glued.groups())
    return found, spans


def _is_clock(text: str, m: re.Match[str], scale: float) -> bool:
    """``m`` (a number read by ``_NUMBER``) is a time of day written with a dot: hours up
    to 24, two digits of minutes under 60, am / pm after it, no currency sign before."""
    integer, fraction = m.group(1), m.group(2)
    return (
        scale == 1.0
        and fraction is not None
        and len(fraction) == 3
        and integer.isdigit()
        and int(integer) <= 24
        and int(fraction[1:]) < 60
        and _CLOCK_AFTER.match(text, m.end()) is not None
        and not _after_currency(text, m.start())
    )


def _after_currency(text: str, start: int) -> bool:
    """A currency sign right before ``start`` (a space between allowed): "£15.4", "$ 64"."""
    return _CURRENCY_BEFORE.search(text, max(0, start - 2), start) is not None


def _word_runs(text: str) -> list[list[re.Match[str]]]:
    """Number words next to each other ("twenty-five", "two hundred and five", "three
    thousand"): each run in order; a scale word does not start one ("millions of")."""
    runs: list[list[re.Match[str]]] = []
    for m in _RUN_WORD.finditer(text):
        word = m.group(1).lower()
        if runs and _joins(text, runs[-1][-1], m):
            runs[-1].append(m)
        elif word not in _RUN_SCALES:
            runs.append([m])
    return runs


def _joins(text: str, prev: re.Match[str], m: re.Match[str]) -> bool:
    gap = text[prev.end() : m.start()]
    if _RUN_GAP.fullmatch(gap):
        return True
    return prev.group(1).lower() in _AND_AFTER and _AND_GAP.fullmatch(gap) is not None


def _run_value(words: Sequence[str], gaps: Sequence[str]) -> float | None:
    """The number a run of number words says, or ``None`` when it says none ("five six").

    Cardinals ("two hundred and five" 205, "three thousand" 3,000, "twenty-five") and
    years said in pairs ("nineteen eighty-four" 1984, "twenty twenty" 2020), the pairs
    apart by a space ("ten-twelve" is a range, not 1012). ``gaps[i]``: the text between
    word ``i`` and the next.
    """
    value = _cardinal(words)
    if value is not None or len(words) > 4:  # a year said in pairs has at most 4 words
        return value
    for k in range(1, len(words)):
        if gaps[k - 1].strip():
            continue
        century, rest = _cardinal(words[:k]), _cardinal(words[k:])
        if century is not None and rest is not None and 10 <= century <= 29 and 10 <= rest <= 99:
            return century * 100 + rest
    return None


def _cardinal(words: Sequence[str]) -> float | None:
    total, current = 0.0, 0
    for word in words:
        if word in _RUN_SCALES:
            if current == 0:
                return None
            total, current = total + current * _RUN_SCALES[word], 0
        elif word in ("hundred", "dozen"):
            if current >= 100:
                return None
            current = max(current, 1) * _WORDS[word]
        else:
            value, low = _WORDS[word], current % 100
            if low != 0 and not (low >= 20 and low % 10 == 0 and value < 10):
                return None
            current += value
    return total + current


def _scale(text: str, m: re.Match[str]) -> tuple[float, str, int]:
    """A number's scale, its surface and where it ends: its scale word ("1.5 million"),
    money's short scale ("£15.4m"), or the scale its range ends with ("5-10 million")."""
    scale_word = (m.group(3) or "").lower()
    surface, start, end = m.group(0).strip(), m.start(), m.end()
    if scale_word:
        return _SCALE[scale_word], surface, end
    money = (
        _after_currency(text, start)
        or _RANGE_HEAD.search(text, max(0, start - 40), start) is not None
    )
    short = _SHORT_SCALE.match(text, end) if money else None
    if short is not None:
        return _SHORT_SCALES[short.group(1).lower()], surface + short.group(1), short.end()
    tails = [(_RANGE_WORD_TAIL, _RANGE_SHORT_TAIL)]
    if _BETWEEN_HEAD.search(text, max(0, start - 12), start) is not None:
        tails.insert(0, (_BETWEEN_WORD_TAIL, _BETWEEN_SHORT_TAIL))
    for word_tail, short_tail in tails:
        if (tail := word_tail.match(text, end)) is not None:
            return _SCALE[tail.group(1).lower()], surface, end
        if money and (tail := short_tail.match(text, end)) is not None:
            return _SHORT_SCALES[tail.group(1).lower()], surface, end
    return 1.0, surface, end


def _next_to_number(start: int, end: int, starts: set[int], ends: set[int]) -> bool:
    """A number ends at most 2 characters before ``start`` or begins at most 2 after ``end``
    (set lookups: a scan of every number per month was quadratic in the evidence)."""
    return any(start - gap in ends or end + gap in starts for gap in (0, 1, 2))


@functools.lru_cache(maxsize=32)
def _evidence_quantities(evidence: str) -> tuple[Quantity, ...]:
    """The evidence's quantities, once per evidence text (every claim checks the same)."""
    return tuple(extract_quantities(evidence, evidence=True))


def _matches(claim: Quantity, evidence: Sequence[Quantity]) -> bool:
    if claim.month is not None:
        return any(q.month == claim.month for q in evidence)
    assert claim.value is not None  # noqa: S101 - numbers always carry a value
    tolerance = max(claim.precision / 2.0, abs(claim.value) * 1e-9)
    return any(
        q.value is not None and abs(q.value - claim.value) <= tolerance + 1e-12 for q in evidence
    )


def check_quantities(claim: str, evidence: str) -> RuleCheck:
    """Which of the claim's quantities the evidence lacks (empty ``checked``: no rule)."""
    wanted = extract_quantities(claim)
    if not wanted:
        return RuleCheck((), ())
    have = _evidence_quantities(evidence)
    missing = tuple(q for q in wanted if not _matches(q, have))
    return RuleCheck(tuple(wanted), missing)
