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

import csv
import gzip
import hashlib
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Final, Literal

from sidecar.claims.calibration import coverage
from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex
from sidecar.claims.sentences import split_sentences
from sidecar.exceptions import ConfigError, InputError
from sidecar.hashing import sha256_tree
from sidecar.lab.verifier.metrics import auroc_or_nan

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


def _evidence(
    claim: str, texts: Sequence[str], question: str = "", window_chars: int | None = None
) -> str:
    """The evidence the verifier reads: the selector's window, or the best long window."""
    index = EvidenceIndex([EvidenceChunk("k", t) for t in texts])
    if window_chars is None:
        return index.select(claim, question).window
    found = index.windows(claim, question, max_windows=1, max_chars=window_chars)
    return found[0] if found else ""


def _qa_claim(answer: str) -> str:
    """What a QA answer asserts: the answer itself (its question travels in ``Pair.question``).

    The network reads ``question [SEP] answer``; restating the question in the
    claim ("question answer.") made it read the question twice and the
    answer's few words got lost among them.
    """
    return " ".join(answer.split())


def length_auroc(pairs: Sequence[Pair]) -> float:
    """AUROC of claim length (characters) alone for telling unsupported (0) from supported."""
    return auroc_or_nan([float(len(p.claim)) for p in pairs], [1 - p.label for p in pairs])


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
        window_chars: int | None = None,
    ) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
        self.question_aware = question_aware
        self.window_chars = window_chars
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
        ev = _evidence(claim, texts, asked, self.window_chars)
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
    right_claim = _qa_claim(record.right_answer)
    out.append(builder.pair(right_claim, k, 1, "qa-right", source="halueval-qa", question=q))
    if natural:
        hall_claim = _qa_claim(record.hallucinated_answer)
        out.append(
            builder.pair(hall_claim, k, 0, "qa-hallucinated", source="halueval-qa", question=q)
        )
        return out
    wrong = builder.distractor(record.right_answer, k[0], q)
    if wrong is not None:
        claim = _qa_claim(wrong[0])
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
        claim = _qa_claim(answer)
        out.append(builder.pair(claim, [passage], 1, "qa-right", source="nq-open", question=group))
        wrong = builder.distractor(answer, passage, record.question)
        if wrong is not None:
            wclaim = _qa_claim(wrong[0])
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
    window_chars: int | None = None,
) -> list[Pair]:
    """The training (or validation) mixture of ``split``, shuffled with ``seed``.

    ``question_aware``: evidence is selected with the question as well as the
    claim (:meth:`~sidecar.claims.evidence.EvidenceIndex.select`), as the
    checker does when the retrieval event carries the user's query.
    """
    qa_all = list(qa)
    nq_all = list(nq)
    answers, ents = _pools(qa_all, nq_all)
    builder = _Builder(
        seed, answers, ents, question_aware=question_aware, window_chars=window_chars
    )
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
    window_chars: int | None = None,
) -> dict[str, list[Pair]]:
    """Held-out sets: ``natural`` (raw HaluEval, length artefact kept), two length-matched
    sets and ``sentences`` (knowledge / passage sentences in, out, swapped)."""
    qa_all = list(qa)
    nq_all = list(nq)
    answers, ents = _pools(qa_all, nq_all)
    builder = _Builder(
        seed, answers, ents, question_aware=question_aware, window_chars=window_chars
    )
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


# --------------------------------------------------------------------------- grounding sources
#
# Beside HaluEval QA and NQ-open, four more task forms (data README, each
# grounding/*/SOURCE.md): HaluEval summarization and dialogue (right vs
# hallucinated candidate for one document / knowledge snippet), SummEdits
# (human-labelled summaries, minimal edits), Factcheck-GPT (claim vs web
# passage, human stance) and BEGIN (dialogue responses vs knowledge, human
# attribution). Readers return pairs whose evidence is the *whole* document;
# :func:`windowed` then cuts it to the window the verifier reads. Groups are
# the document (or claim) a pair belongs to, so splits never cut a document.

FORMS: Final = (
    "qa",
    "qa-decl",
    "sentences",
    "summaries",
    "dialogue",
    "factcheck",
    "summedits",
    "begin",
)
SOURCE_FORM: Final = {
    "halueval-summarization": "summaries",
    "halueval-dialogue": "dialogue",
    "factcheckgpt": "factcheck",
    "summedits": "summedits",
    "begin": "begin",
}
_FACTCHECK_LABEL: Final = {"completely-support": 1, "refute": 0, "irrelevant": 0}
_BEGIN_LABEL: Final = {"Fully attributable": 1, "Not fully attributable": 0}
_LAST_HUMAN: Final = re.compile(r"\[Human\]:\s*((?:(?!\[Assistant\]:|\[Human\]:).)*)\s*$", re.S)


def _digest(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).lower().encode("utf-8")).hexdigest()[:16]


def _items(path: Path, limit: int | None) -> Iterator[tuple[int, dict[str, object]]]:
    for count, (lineno, line) in enumerate(_lines(path)):
        if limit is not None and count >= limit:
            return
        yield lineno, _json(path, lineno, line)


def read_halueval_summarization(path: Path, limit: int | None = None) -> list[Pair]:
    """HaluEval summarization: the right and the hallucinated summary of each document."""
    out: list[Pair] = []
    for lineno, obj in _items(path, limit):
        doc = _field(obj, "document", path, lineno)
        right = _field(obj, "right_summary", path, lineno)
        hall = _field(obj, "hallucinated_summary", path, lineno)
        group = f"doc:{_digest(doc)}"
        out.append(Pair(right.strip(), doc, 1, "summary-right", "halueval-summarization", group))
        out.append(
            Pair(hall.strip(), doc, 0, "summary-hallucinated", "halueval-summarization", group)
        )
    return out


def last_user_turn(history: str) -> str:
    """The last ``[Human]:`` turn of a HaluEval dialogue history (the response answers it)."""
    found = _LAST_HUMAN.search(history)
    return " ".join((found.group(1) if found else history[-300:]).split())


def read_halueval_dialogue(path: Path, limit: int | None = None) -> list[Pair]:
    """HaluEval dialogue: right and hallucinated response vs the knowledge; question = last turn."""
    out: list[Pair] = []
    for lineno, obj in _items(path, limit):
        knowledge = _fix(_field(obj, "knowledge", path, lineno))
        question = last_user_turn(_field(obj, "dialogue_history", path, lineno))
        right = _field(obj, "right_response", path, lineno).strip()
        hall = _field(obj, "hallucinated_response", path, lineno).strip()
        group = f"knowledge:{_digest(knowledge)}"
        src = "halueval-dialogue"
        out.append(Pair(right, knowledge, 1, "response-right", src, group, question))
        out.append(Pair(hall, knowledge, 0, "response-hallucinated", src, group, question))
    return out


def read_summedits(folder: Path) -> list[Pair]:
    """SummEdits (every ``summedits_*.json`` under ``folder``): human labels, 1 = consistent."""
    files = sorted(folder.rglob("summedits_*.json"))
    if not files:
        raise InputError("schema-violation", f"no summedits_*.json under {folder}")
    out: list[Pair] = []
    for path in files:
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError("malformed-json", f"{path}: not JSON ({exc.msg})") from None
        if not isinstance(rows, list):
            raise InputError("schema-violation", f"{path}: expected a JSON list")
        for k, row in enumerate(rows):
            if not isinstance(row, dict) or str(row.get("label")) not in {"0", "1"}:
                raise InputError("schema-violation", f"{path}[{k}]: needs label 0 or 1")
            doc, summary = str(row.get("doc", "")), str(row.get("summary", "")).strip()
            label = int(str(row["label"]))
            kind = "summedits-consistent" if label else "summedits-inconsistent"
            out.append(Pair(summary, doc, label, kind, "summedits", f"doc:{_digest(doc)}"))
    return out


def read_factcheckgpt(path: Path) -> list[Pair]:
    """Factcheck-GPT claim/evidence stance: completely-support 1; refute, irrelevant 0.

    ``partially-support`` is dropped (neither supported nor contradicted).
    """
    out: list[Pair] = []
    for lineno, obj in _items(path, None):
        claim = _field(obj, "claim", path, lineno).strip()
        evidence = _field(obj, "evidence", path, lineno)
        stance = _field(obj, "stance", path, lineno)
        if stance not in _FACTCHECK_LABEL:
            continue
        kind = f"factcheck-{stance}"
        out.append(
            Pair(
                claim,
                evidence,
                _FACTCHECK_LABEL[stance],
                kind,
                "factcheckgpt",
                f"claim:{_digest(claim)}",
            )
        )
    return out


def read_begin(folder: Path) -> list[Pair]:
    """BEGIN (every ``*.tsv`` under ``folder``): fully attributable 1, not 0, generic dropped."""
    files = sorted(folder.rglob("*.tsv"))
    if not files:
        raise InputError("schema-violation", f"no BEGIN .tsv files under {folder}")
    out: list[Pair] = []
    for path in files:
        with path.open(encoding="utf-8", newline="") as handle:
            for k, row in enumerate(csv.DictReader(handle, delimiter="\t"), 2):
                missing = [
                    f
                    for f in ("knowledge", "message", "response", "begin_label")
                    if row.get(f) is None
                ]
                if missing:
                    raise InputError(
                        "schema-violation", f"{path}:{k}: missing {', '.join(missing)}"
                    )
                label = _BEGIN_LABEL.get(row["begin_label"].strip())
                if label is None:
                    continue
                knowledge = _fix(row["knowledge"])
                kind = "begin-attributable" if label else "begin-not-attributable"
                out.append(
                    Pair(
                        row["response"].strip(),
                        knowledge,
                        label,
                        kind,
                        "begin",
                        f"knowledge:{_digest(knowledge)}",
                        " ".join(row["message"].split()),
                    )
                )
    return out


def altered_copies(pairs: Sequence[Pair], seed: int) -> list[Pair]:
    """Copied-but-altered negatives for supported pairs (BEGIN's near-copy artefact).

    Each supported claim gets one shared word (a name, a number, else the
    longest content word also in the evidence) replaced by one from another
    pair's evidence: the copy keeps its overlap but is no longer supported.
    """
    rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
    pool = sorted({w for p in pairs for w in re.findall(r"[A-Za-z]{5,}", p.evidence)})
    builder = _Builder(seed, [], [e for p in pairs[:2000] for e in entities(p.evidence)[:3]])
    out: list[Pair] = []
    for p in pairs:
        if p.label != 1:
            continue
        altered = builder.swap(p.claim, p.evidence)
        if altered is None or altered == p.claim:
            have = {w.lower() for w in re.findall(r"[A-Za-z]{5,}", p.evidence)}
            shared = [w for w in re.findall(r"[A-Za-z]{5,}", p.claim) if w.lower() in have]
            shared = [w for w in shared if w.lower() not in _STOPLIKE]
            if not shared or not pool:
                continue
            target = max(shared, key=len)
            other = rng.choice(pool)
            if other.lower() in have:
                continue
            altered = re.sub(rf"\b{re.escape(target)}\b", other, p.claim, count=1)
        out.append(replace(p, claim=altered, label=0, kind=f"{p.source}-altered"))
    return out


_STOPLIKE: Final = frozenset(
    {"there", "their", "about", "which", "would", "could", "these", "those"}
)


# --------------------------------------------------------------------------- set shaping


def windowed(
    pairs: Sequence[Pair], window_chars: int, *, question_aware: bool = True
) -> list[Pair]:
    """Each pair with its evidence cut to the best window for its claim (and question)."""
    indexes: dict[str, EvidenceIndex] = {}
    out: list[Pair] = []
    for p in pairs:
        index = indexes.get(p.evidence)
        if index is None:
            index = indexes[p.evidence] = EvidenceIndex([EvidenceChunk("doc", p.evidence)])
        asked = p.question if question_aware else ""
        found = index.windows(p.claim, asked, max_windows=1, max_chars=window_chars)
        out.append(replace(p, evidence=found[0] if found else ""))
    return out


def length_matched(pairs: Sequence[Pair], seed: int, growth: float = 1.15) -> list[Pair]:
    """Equal numbers of supported and unsupported pairs in every claim-length bin.

    Bins are geometric in characters (each ``growth`` times wider than the
    last); a bin keeps as many pairs of each label as its smaller label has
    (seeded choice), so claim length alone says nothing about the label
    (length-only AUROC ~0.5) and the classes are balanced.
    """
    rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
    bins: dict[int, tuple[list[Pair], list[Pair]]] = defaultdict(lambda: ([], []))
    for p in pairs:
        bins[int(math.log(max(1, len(p.claim))) / math.log(growth))][p.label].append(p)
    out: list[Pair] = []
    for key in sorted(bins):
        neg, pos = bins[key]
        n = min(len(neg), len(pos))
        out.extend(rng.sample(neg, n) + rng.sample(pos, n))
    rng.shuffle(out)
    return out


def overlap_auroc(pairs: Sequence[Pair]) -> float:
    """AUROC of lexical coverage alone (claim terms found in the evidence) for supported."""
    return auroc_or_nan([coverage(p.claim, p.evidence) for p in pairs], [p.label for p in pairs])


def by_split(pairs: Iterable[Pair]) -> dict[Split, list[Pair]]:
    """Pairs per split of their group (document or claim): a group is never in two splits."""
    out: dict[Split, list[Pair]] = {"train": [], "val": [], "test": []}
    for p in pairs:
        out[split_of(p.group)].append(p)
    return out


def baselines(pairs: Sequence[Pair]) -> dict[str, float | int]:
    """n, supported share, length-only and overlap-only AUROC of one pair set."""
    return {
        "n": len(pairs),
        "supported": sum(p.label for p in pairs),
        "length_auroc": round(length_auroc(pairs), 4),
        "overlap_auroc": round(overlap_auroc(pairs), 4),
    }


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True, slots=True)
class CorpusConfig:
    """What determines the verifier's corpus (recorded in its manifest).

    ``data_dir`` is the shared data folder (data README layout);
    ``window_chars`` the evidence window the network reads (a 256-token input
    holds a ~900-character window beside a summary-length claim);
    ``train_caps`` the most training pairs per source after length matching
    (seeded subsample; sources not named are not capped), so one epoch fits a
    CPU budget and no source dominates; ``qa_limit`` the HaluEval QA training
    records (NQ-open: a quarter of that).
    """

    data_dir: Path
    seed: int = 0
    window_chars: int = 900
    qa_limit: int | None = None
    train_caps: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.window_chars < 100:
            raise ConfigError(f"window_chars must be >= 100, got {self.window_chars}")
        bad = [name for name, cap in self.train_caps if cap < 1 or name not in ALL_SOURCES]
        if bad:
            raise ConfigError(
                f"train_caps must name sources of {', '.join(ALL_SOURCES)} with caps >= 1; "
                f"wrong: {', '.join(bad)}"
            )

    def files(self) -> dict[str, Path]:
        d = self.data_dir
        return {
            "halueval-qa": d / "halueval" / "qa_data.json",
            "nq-open": d / "nq-open" / "nq-open-oracle.dev.jsonl.gz",
            "halueval-summarization": d / "halueval" / "summarization_train.jsonl",
            "halueval-dialogue": d / "halueval" / "dialogue_train.jsonl",
            "summedits": d / "grounding" / "summedits",
            "factcheckgpt": d
            / "grounding"
            / "factcheckgpt"
            / "subtasks"
            / "subtask3_claim_evidence_stance.jsonl",
            "begin": d / "grounding" / "begin",
        }


ALL_SOURCES: Final = (
    "halueval-qa",
    "nq-open",
    "halueval-summarization",
    "halueval-dialogue",
    "summedits",
    "factcheckgpt",
    "begin",
)


@dataclass(frozen=True, slots=True)
class Corpus:
    """Training, validation and held-out pairs (evidence already windowed) + their manifest."""

    train: list[Pair]
    val: list[Pair]
    test: dict[str, list[Pair]]
    manifest: dict[str, object]


def _read_source(name: str, path: Path) -> list[Pair]:
    if name == "halueval-summarization":
        return read_halueval_summarization(path)
    if name == "halueval-dialogue":
        return read_halueval_dialogue(path)
    if name == "summedits":
        return read_summedits(path)
    if name == "factcheckgpt":
        return read_factcheckgpt(path)
    pairs = read_begin(path)
    return [*pairs, *altered_copies(pairs, seed=0)]


def build_corpus(config: CorpusConfig) -> Corpus:
    """Every source -> one pair format, split by document / claim, length matched, windowed.

    * HaluEval QA + NQ-open: :func:`build_training_pairs` / :func:`build_eval_sets`
      (split by question; QA claims are the answers, the question rides along);
    * the grounding sources: split by document (SummEdits, HaluEval
      summarization), knowledge snippet (dialogue, BEGIN) or claim
      (Factcheck-GPT); each split length matched per source
      (:func:`length_matched`); BEGIN gets copied-but-altered negatives;
    * held-out sets per task form: the test split of each.
    """
    files = config.files()
    missing = [f"{name}: {path}" for name, path in files.items() if not path.exists()]
    if missing:
        raise ConfigError(f"corpus sources missing under {config.data_dir}: {'; '.join(missing)}")
    seed, window = config.seed, config.window_chars
    caps = dict(config.train_caps)
    qa = read_halueval_qa(files["halueval-qa"])
    nq = read_nq_open(files["nq-open"])
    limit_nq = None if config.qa_limit is None else max(1, config.qa_limit // 4)
    train = build_training_pairs(
        qa,
        nq,
        "train",
        seed=seed,
        limit_qa=config.qa_limit,
        limit_nq=limit_nq,
        window_chars=window,
    )
    rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
    for source in ("halueval-qa", "nq-open"):
        if source in caps:
            mine = [p for p in train if p.source == source]
            keep = set(map(id, rng.sample(mine, min(caps[source], len(mine)))))
            train = [p for p in train if p.source != source or id(p) in keep]
    val = build_training_pairs(qa, nq, "val", seed=seed + 1, window_chars=window)
    sets = build_eval_sets(qa, nq, split="test", seed=seed + 2, window_chars=window)
    test: dict[str, list[Pair]] = {
        "qa": sets["length-matched-qa"],
        "qa-decl": sets["length-matched-decl"],
        "sentences": sets["sentences"],
        "qa-natural": sets["natural"],
    }
    counts: dict[str, dict[str, int]] = {}
    for name in ALL_SOURCES[2:]:
        parts = by_split(_read_source(name, files[name]))
        matched = {
            part: length_matched(pairs, seed + k) for k, (part, pairs) in enumerate(parts.items())
        }
        if name in caps and len(matched["train"]) > caps[name]:
            matched["train"] = rng.sample(matched["train"], caps[name])
        counts[name] = {part: len(pairs) for part, pairs in matched.items()}
        train.extend(windowed(matched["train"], window))
        val.extend(windowed(matched["val"], window))
        test[SOURCE_FORM[name]] = windowed(matched["test"], window)
    rng.shuffle(train)
    manifest: dict[str, object] = {
        "seed": seed,
        "window_chars": window,
        "qa_limit": config.qa_limit,
        "train_caps": caps,
        "split_rule": "sha256(lower(group)) -> test 10% / val 10% / train 80%; group = question "
        "(QA, NQ), document (summaries, SummEdits), knowledge (dialogue, BEGIN), claim "
        "(Factcheck-GPT)",
        "files_sha256": {name: sha256_tree(path) for name, path in files.items()},
        "pairs_per_split": counts,
        "train": {**baselines(train), "sha256": pairs_digest(train)},
        "train_by_source": {s: baselines([p for p in train if p.source == s]) for s in ALL_SOURCES},
        "val": {**baselines(val), "sha256": pairs_digest(val)},
        "test": {
            name: {**baselines(pairs), "sha256": pairs_digest(pairs)}
            for name, pairs in test.items()
        },
    }
    return Corpus(train, val, test, manifest)


def pairs_digest(pairs: Sequence[Pair]) -> str:
    """sha256 over the pairs' claims, evidence, questions and labels, in order."""
    digest = hashlib.sha256()
    for p in pairs:
        digest.update(json.dumps([p.claim, p.evidence, p.question, p.label]).encode("utf-8"))
    return digest.hexdigest()


def write_pairs(path: Path, pairs: Iterable[Pair]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for p in pairs:
            handle.write(json.dumps(asdict(p)) + "\n")


def read_pairs(path: Path) -> list[Pair]:
    """Pairs written by :func:`write_pairs`."""
    out: list[Pair] = []
    for lineno, line in _lines(path):
        obj = _json(path, lineno, line)
        try:
            out.append(Pair(**obj))  # type: ignore[arg-type]
        except TypeError as exc:
            raise InputError("schema-violation", f"{path}:{lineno}: not a pair ({exc})") from None
    return out


def write_corpus(corpus: Corpus, out_dir: Path) -> None:
    """``train.jsonl``, ``val.jsonl``, ``test-<form>.jsonl`` and ``manifest.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(out_dir / "train.jsonl", corpus.train)
    write_pairs(out_dir / "val.jsonl", corpus.val)
    for name, pairs in corpus.test.items():
        write_pairs(out_dir / f"test-{name}.jsonl", pairs)
    (out_dir / "manifest.json").write_text(json.dumps(corpus.manifest, indent=2), encoding="utf-8")


def read_corpus(out_dir: Path) -> Corpus:
    """A corpus written by :func:`write_corpus`; its hashes are checked against the manifest."""
    path = out_dir / "manifest.json"
    if not path.is_file():
        raise ConfigError(f"no corpus manifest at {path}")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    train = read_pairs(out_dir / "train.jsonl")
    val = read_pairs(out_dir / "val.jsonl")
    test = {name: read_pairs(out_dir / f"test-{name}.jsonl") for name in manifest["test"]}
    if pairs_digest(train) != manifest["train"]["sha256"]:
        raise ConfigError(f"{out_dir}/train.jsonl does not match its manifest: rebuild the corpus")
    return Corpus(train, val, test, manifest)
