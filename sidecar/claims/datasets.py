"""Training and evaluation pairs (claim, evidence, label) where length does not give the label away.

HaluEval QA (``knowledge, question, right_answer, hallucinated_answer``) has a
strong artefact: right answers average 2.2 words, hallucinated ones 11.0, and
length alone separates them with AUROC ~0.95 (data README). A verifier trained
on (right, hallucinated) would learn length. The pairs here are built so that
each positive has a negative of (nearly) the same length and form:

==================  =====  ==============================================================
kind                label  claim / evidence
==================  =====  ==============================================================
``qa-right``          1    "question right_answer" / knowledge
``qa-distractor``     0    "question X" / knowledge, X a name or number *from the knowledge*
                           (or another record's answer) with the right answer's word count
``decl-right``        1    the hallucinated answer with its wrong name replaced by the
                           right answer ("... was first performed in Teatro dei Fiorentini.")
``decl-hallucinated`` 0    the hallucinated answer itself (real HaluEval hallucinations)
``sent-in``           1    a knowledge / passage sentence / the text that contains it
``sent-out``          0    the same sentence / the text without it (same claim, other evidence)
``sent-swap``         0    the sentence with one name or number swapped / the text
==================  =====  ==============================================================

The evidence is always what :class:`~sidecar.claims.evidence.EvidenceIndex`
selects for the claim and its question, as in production; every pair keeps
its question (``Pair.question``) for verifiers that read it. Records are split by a hash of the
question (train / val / test), so no question is in two splits. The
``natural`` set (``qa-right`` vs the raw ``"question hallucinated_answer"``)
keeps the artefact on purpose, to show it (its length-only AUROC is high).
Sources: HaluEval QA and the 2,000 NQ-open dev questions with their gold
passages (seed 001 / 002 define the labels: supported vs unsupported).

Record parsing and pair building are pure; :func:`read_halueval_qa` and
:func:`read_nq_open` read the local files (offline tooling, never serving).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex
from sidecar.claims.metrics import auroc
from sidecar.claims.sentences import split_sentences
from sidecar.exceptions import InputError

__all__ = [
    "EVAL_SETS",
    "NQRecord",
    "Pair",
    "QARecord",
    "Split",
    "build_eval_sets",
    "build_training_pairs",
    "length_auroc",
    "read_halueval_qa",
    "read_nq_open",
    "split_of",
]

Split = Literal["train", "val", "test"]
EVAL_SETS: Final = ("natural", "length-matched-qa", "length-matched-decl", "sentences")

_ENTITY: Final = re.compile(
    r"(?:\d{1,2}\s+)?(?:[A-Z][\w'\u2019\-]*\.?|\d[\d,]*(?:\.\d+)?)"
    r"(?:\s+(?:(?:of|the|de|dei|del|della|da|di|von|van|der|la|le|du|and|for|on|y)\s+)*"
    r"(?:[A-Z][\w'\u2019\-]*\.?|\d[\d,]*(?:\.\d+)?))*"
)
_SENTENCE_OPENERS: Final = frozenset(
    {"The", "A", "An", "It", "In", "On", "At", "He", "She", "They", "This", "That", "These",
     "Its", "His", "Her", "Their", "There", "As", "After", "Before", "During", "While", "When",
     "Yes", "No", "Both", "Neither", "Either", "Although", "Because", "Since", "From", "By"}
)  # fmt: skip
_GLUED: Final = re.compile(r"(?<=[a-z0-9)\]])([.!?])(?=[A-Z][a-z])")
_NUMERIC: Final = re.compile(r"^\d[\d,]*(?:\.\d+)?$")


@dataclass(frozen=True, slots=True)
class QARecord:
    knowledge: str
    question: str
    right_answer: str
    hallucinated_answer: str


@dataclass(frozen=True, slots=True)
class NQRecord:
    question: str
    answers: tuple[str, ...]
    title: str
    passage: str


@dataclass(frozen=True, slots=True)
class Pair:
    """One verifier example: does ``evidence`` support ``claim``? (1 = supported)."""

    claim: str
    evidence: str
    label: int
    kind: str
    source: str
    group: str  # the question it came from (pairs of one group stay in one split)
    question: str = ""  # the user question the claim answers ("" when unknown)


# --------------------------------------------------------------------------- reading


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if line.strip():
                yield lineno, line


def _json(path: Path, lineno: int, line: str) -> dict[str, object]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError("malformed-json", f"{path}:{lineno}: not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise InputError("schema-violation", f"{path}:{lineno}: expected a JSON object")
    return obj


def _field(obj: dict[str, object], name: str, path: Path, lineno: int) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise InputError(
            "schema-violation",
            f"{path}:{lineno}: field {name!r} must be a string, got {type(value).__name__} "
            f"(present fields: {', '.join(sorted(obj))})",
        )
    return value


def read_halueval_qa(path: Path, limit: int | None = None) -> list[QARecord]:
    """HaluEval QA: one JSON object a line with knowledge, question, right/hallucinated answer."""
    out: list[QARecord] = []
    for lineno, line in _lines(path):
        obj = _json(path, lineno, line)
        names = ("knowledge", "question", "right_answer", "hallucinated_answer")
        k, q, r, h = (_field(obj, n, path, lineno) for n in names)
        out.append(QARecord(k, q, r, h))
        if limit is not None and len(out) >= limit:
            break
    return out


def read_nq_open(path: Path, limit: int | None = None) -> list[NQRecord]:
    """NQ-open oracle file: question, answers and the gold passage (first ctx)."""
    out: list[NQRecord] = []
    for lineno, line in _lines(path):
        obj = _json(path, lineno, line)
        question = _field(obj, "question", path, lineno)
        answers = obj.get("answers")
        ctxs = obj.get("ctxs")
        if not isinstance(answers, list) or not isinstance(ctxs, list) or not ctxs:
            raise InputError("schema-violation", f"{path}:{lineno}: needs answers and ctxs lists")
        ctx = ctxs[0]
        if not isinstance(ctx, dict):
            raise InputError("schema-violation", f"{path}:{lineno}: ctxs[0] must be an object")
        out.append(
            NQRecord(
                question=question,
                answers=tuple(str(a) for a in answers),
                title=str(ctx.get("title", "")),
                passage=str(ctx.get("text", "")),
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return out


# --------------------------------------------------------------------------- splitting


def split_of(key: str, val_fraction: float = 0.1, test_fraction: float = 0.1) -> Split:
    """A stable split from a hash of ``key`` (the question): same key, same split, always."""
    h = int.from_bytes(hashlib.sha256(key.strip().lower().encode("utf-8")).digest()[:8], "big")
    u = h / 2**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + val_fraction:
        return "val"
    return "train"


# --------------------------------------------------------------------------- helpers


def _fix(text: str) -> str:
    return _GLUED.sub(r"\1 ", text).strip()


def _words(text: str) -> int:
    return len(text.split())


def entities(text: str) -> list[str]:
    """Names, numbers and dates of ``text`` (capitalised runs, digits), sentence openers dropped."""
    out = []
    for m in _ENTITY.finditer(text):
        span = m.group(0).strip().rstrip(".")
        first = span.split()[0] if span else ""
        if first in _SENTENCE_OPENERS:
            span = span[len(first) :].strip()
        if len(span) >= 2 and span not in out:
            out.append(span)
    return out


def _has_digit(text: str) -> bool:
    return any(ch.isdigit() for ch in text)


def _inside(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a in b or b in a


def _evidence(claim: str, texts: Sequence[str], question: str = "") -> str:
    index = EvidenceIndex([EvidenceChunk("k", t) for t in texts])
    return index.select(claim, question).window


def _qa_claim(question: str, answer: str) -> str:
    q = question.strip()
    a = answer.strip()
    return f"{q} {a}" if a.endswith((".", "!", "?")) else f"{q} {a}."


def length_auroc(pairs: Sequence[Pair]) -> float:
    """AUROC of claim length (characters) alone for telling unsupported (0) from supported."""
    return auroc([float(len(p.claim)) for p in pairs], [1 - p.label for p in pairs])


# --------------------------------------------------------------------------- builders


class _Builder:
    """Pair builders sharing a seeded RNG and pools of answers / entities from other records."""

    def __init__(
        self,
        seed: int,
        answer_pool: Sequence[str],
        entity_pool: Sequence[str],
        *,
        question_aware: bool = True,
    ) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
        self.question_aware = question_aware
        by_len: dict[int, list[str]] = defaultdict(list)
        for a in answer_pool:
            by_len[_words(a)].append(a)
        self.answers_by_len = by_len
        self.entity_pool = list(entity_pool)

    def distractor(self, answer: str, context: str, question: str) -> tuple[str, str] | None:
        """A wrong answer of the right answer's word count: from the context, else the pool."""
        n = _words(answer)
        numeric = bool(_NUMERIC.match(answer.replace(" ", "")) or re.search(r"\d{3,4}", answer))
        cands = [
            e
            for e in entities(context)
            if not _inside(e, answer) and e.lower() not in question.lower()
        ]
        if numeric:
            cands = [c for c in cands if any(ch.isdigit() for ch in c)] or cands
        same = [c for c in cands if _words(c) == n] or [c for c in cands if abs(_words(c) - n) <= 1]
        if same:
            return self.rng.choice(same), "qa-distractor"
        pool = [a for a in self.answers_by_len.get(n, []) if not _inside(a, answer)]
        if pool:
            return self.rng.choice(pool), "qa-swap"
        return None

    def swap(self, sentence: str, context: str) -> str | None:
        """``sentence`` with one name or number replaced by another of the same type."""
        ents = [e for e in entities(sentence) if len(e) > 2]
        if not ents:
            return None
        target = self.rng.choice(ents)
        is_num = any(ch.isdigit() for ch in target)
        local = [
            e
            for e in entities(context)
            if not _inside(e, target) and any(ch.isdigit() for ch in e) == is_num
        ]
        others = (
            [e for e in self.entity_pool if any(ch.isdigit() for ch in e) == is_num]
            if not local
            else local
        )
        if is_num and not local:
            digits = re.search(r"\d+", target)
            if digits is None:
                return None
            value = int(digits.group(0))
            replacement = target.replace(
                digits.group(0), str(value + self.rng.choice([-3, -2, -1, 1, 2, 3, 10])), 1
            )
        elif others:
            replacement = self.rng.choice(others)
        else:
            return None
        if _inside(replacement, target):
            return None
        return sentence.replace(target, replacement, 1)

    def pair(
        self, claim: str, texts: Sequence[str], label: int, kind: str, *, source: str, question: str
    ) -> Pair:
        """A pair whose evidence the production selector picks (with the question if aware)."""
        asked = question if self.question_aware else ""
        ev = _evidence(claim, texts, asked)
        return Pair(claim, ev, label, kind, source, question, question)

    def sentence_pairs(self, texts: Sequence[str], source: str, group: str) -> list[Pair]:
        """One sentence: ``sent-in`` (+) and ``sent-out`` or ``sent-swap`` (-)."""
        sentences = [s.text for t in texts for s in split_sentences(_fix(t)) if _words(s.text) >= 6]
        if not sentences:
            return []
        claim = self.rng.choice(sentences)
        whole = [_fix(t) for t in texts]
        out = [self.pair(claim, whole, 1, "sent-in", source=source, question=group)]
        rest = [s for t in whole for s in (x.text for x in split_sentences(t)) if s != claim]
        use_out = len(rest) >= 1 and self.rng.random() < 0.5
        if use_out:
            out.append(
                self.pair(claim, [" ".join(rest)], 0, "sent-out", source=source, question=group)
            )
        else:
            swapped = self.swap(claim, " ".join(whole))
            if swapped is not None and swapped != claim:
                out.append(self.pair(swapped, whole, 0, "sent-swap", source=source, question=group))
            elif rest:
                out.append(
                    self.pair(claim, [" ".join(rest)], 0, "sent-out", source=source, question=group)
                )
        return out


def declarative_right(record: QARecord) -> str | None:
    """The hallucinated answer with its one wrong name replaced by the right answer.

    ``None`` when the wrong name cannot be identified unambiguously (exactly one
    name or number of the hallucinated answer that is not in the question and
    not the right answer) or the right answer is long.
    """
    right = record.right_answer.strip().rstrip(".")
    hall = record.hallucinated_answer.strip()
    if not right or _words(right) > 6 or _inside(right, hall) or _words(hall) > 25:
        return None
    q = record.question.lower()
    cands = [e for e in entities(hall) if e.lower() not in q and not _inside(e, right)]
    if len(cands) != 1 or _has_digit(cands[0]) != _has_digit(right):
        return None  # ambiguous, or a name would be replaced by a date (or vice versa)
    out = hall.replace(cands[0], right, 1)
    return out if out != hall else None


def qa_pairs(record: QARecord, builder: _Builder, *, natural: bool = False) -> list[Pair]:
    q = record.question
    k = [_fix(record.knowledge)]
    out: list[Pair] = []
    right_claim = _qa_claim(q, record.right_answer)
    out.append(builder.pair(right_claim, k, 1, "qa-right", source="halueval-qa", question=q))
    if natural:
        hall_claim = _qa_claim(q, record.hallucinated_answer)
        out.append(
            builder.pair(hall_claim, k, 0, "qa-hallucinated", source="halueval-qa", question=q)
        )
        return out
    wrong = builder.distractor(record.right_answer, k[0], q)
    if wrong is not None:
        claim = _qa_claim(q, wrong[0])
        out.append(builder.pair(claim, k, 0, wrong[1], source="halueval-qa", question=q))
    return out


def decl_pairs(record: QARecord, builder: _Builder) -> list[Pair]:
    positive = declarative_right(record)
    if positive is None:
        return []
    k = [_fix(record.knowledge)]
    hall = record.hallucinated_answer.strip()
    q = record.question
    return [
        builder.pair(positive, k, 1, "decl-right", source="halueval-qa", question=q),
        builder.pair(hall, k, 0, "decl-hallucinated", source="halueval-qa", question=q),
    ]


def nq_pairs(record: NQRecord, builder: _Builder) -> list[Pair]:
    group = record.question
    passage = _fix(record.passage)
    answer = next((a for a in record.answers if a.lower() in passage.lower()), None)
    out: list[Pair] = []
    if answer is not None:
        question = record.question.strip().rstrip("?") + "?"
        claim = _qa_claim(question[0].upper() + question[1:], answer)
        out.append(builder.pair(claim, [passage], 1, "qa-right", source="nq-open", question=group))
        wrong = builder.distractor(answer, passage, record.question)
        if wrong is not None:
            wclaim = _qa_claim(question[0].upper() + question[1:], wrong[0])
            out.append(
                builder.pair(wclaim, [passage], 0, wrong[1], source="nq-open", question=group)
            )
    out.extend(builder.sentence_pairs([passage], "nq-open", group))
    return out


def _pools(qa: Sequence[QARecord], nq: Sequence[NQRecord]) -> tuple[list[str], list[str]]:
    answers = [r.right_answer for r in qa] + [a for r in nq for a in r.answers[:1]]
    ents: list[str] = []
    for r in qa[:2000]:
        ents.extend(entities(_fix(r.knowledge))[:4])
    return answers, ents


def build_training_pairs(
    qa: Iterable[QARecord],
    nq: Iterable[NQRecord],
    split: Split,
    *,
    seed: int = 0,
    limit_qa: int | None = None,
    limit_nq: int | None = None,
    question_aware: bool = True,
) -> list[Pair]:
    """The training (or validation) mixture of ``split``, shuffled with ``seed``.

    ``question_aware``: evidence is selected with the question as well as the
    claim (:meth:`~sidecar.claims.evidence.EvidenceIndex.select`), as the
    checker does when the retrieval event carries the user's query.
    """
    qa_all = list(qa)
    nq_all = list(nq)
    answers, ents = _pools(qa_all, nq_all)
    builder = _Builder(seed, answers, ents, question_aware=question_aware)
    qa_rows = [r for r in qa_all if split_of(r.question) == split][:limit_qa]
    nq_rows = [r for r in nq_all if split_of(r.question) == split][:limit_nq]
    pairs: list[Pair] = []
    for r in qa_rows:
        pairs.extend(qa_pairs(r, builder))
        pairs.extend(decl_pairs(r, builder))
        pairs.extend(builder.sentence_pairs([r.knowledge], "halueval-qa", r.question))
    for n in nq_rows:
        pairs.extend(nq_pairs(n, builder))
    builder.rng.shuffle(pairs)
    return pairs


def build_eval_sets(
    qa: Iterable[QARecord],
    nq: Iterable[NQRecord] = (),
    *,
    split: Split = "test",
    seed: int = 1,
    limit: int | None = None,
    question_aware: bool = True,
) -> dict[str, list[Pair]]:
    """Held-out sets: ``natural`` (raw HaluEval, length artefact kept), two length-matched
    sets and ``sentences`` (knowledge / passage sentences in, out, swapped)."""
    qa_all = list(qa)
    nq_all = list(nq)
    answers, ents = _pools(qa_all, nq_all)
    builder = _Builder(seed, answers, ents, question_aware=question_aware)
    rows = [r for r in qa_all if split_of(r.question) == split][:limit]
    nq_rows = [r for r in nq_all if split_of(r.question) == split][:limit]
    sets: dict[str, list[Pair]] = {name: [] for name in EVAL_SETS}
    for r in rows:
        sets["natural"].extend(qa_pairs(r, builder, natural=True))
        sets["length-matched-qa"].extend(qa_pairs(r, builder))
        sets["length-matched-decl"].extend(decl_pairs(r, builder))
        sets["sentences"].extend(builder.sentence_pairs([r.knowledge], "halueval-qa", r.question))
    for n in nq_rows:
        sets["sentences"].extend(builder.sentence_pairs([n.passage], "nq-open", n.question))
    return sets
