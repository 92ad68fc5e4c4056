"""The verifier's data records (pairs, QA/NQ records, the question-hash split) and source readers.

HaluEval QA and the 2,000 NQ-open dev questions with their gold passages are
read into records (:func:`read_halueval_qa`, :func:`read_nq_open`) that
:mod:`sidecar.lab.verifier.pairs` turns into length-matched pairs. Four more
task forms (data README, each grounding/*/SOURCE.md): HaluEval summarization
and dialogue (right vs hallucinated candidate for one document / knowledge
snippet), SummEdits (human-labelled summaries, minimal edits), Factcheck-GPT
(claim vs web passage, human stance) and BEGIN (dialogue responses vs
knowledge, human attribution) are read straight into pairs whose evidence is
the *whole* document; :func:`~sidecar.lab.verifier.datasets.windowed` then
cuts it to the window the verifier reads. Groups are the document (or claim)
a pair belongs to, so splits never cut a document. The labels are those of
docs/methods.md §Claim verification: supported vs unsupported. Offline
tooling, never serving.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from sidecar.exceptions import InputError

__all__ = [
    "NQRecord",
    "Pair",
    "QARecord",
    "Split",
    "fix_text",
    "json_object",
    "last_user_turn",
    "read_begin",
    "read_factcheckgpt",
    "read_halueval_dialogue",
    "read_halueval_qa",
    "read_halueval_summarization",
    "read_nq_open",
    "read_summedits",
    "split_of",
    "text_lines",
]

Split = Literal["train", "val", "test"]
_GLUED: Final = re.compile(r"(?<=[a-z0-9)\]])([.!?])(?=[A-Z][a-z])")
_FACTCHECK_LABEL: Final = {"completely-support": 1, "refute": 0, "irrelevant": 0}
_BEGIN_LABEL: Final = {"Fully attributable": 1, "Not fully attributable": 0}
_LAST_HUMAN: Final = re.compile(r"\[Human\]:\s*((?:(?!\[Assistant\]:|\[Human\]:).)*)\s*$", re.S)


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


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a text file (gzip when it ends in .gz), numbered from 1."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if line.strip():
                yield lineno, line


def json_object(path: Path, lineno: int, line: str) -> dict[str, object]:
    """One line parsed as a JSON object (``InputError`` naming the file and line otherwise)."""
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
    for lineno, line in text_lines(path):
        obj = json_object(path, lineno, line)
        names = ("knowledge", "question", "right_answer", "hallucinated_answer")
        k, q, r, h = (_field(obj, n, path, lineno) for n in names)
        out.append(QARecord(k, q, r, h))
        if limit is not None and len(out) >= limit:
            break
    return out


def read_nq_open(path: Path, limit: int | None = None) -> list[NQRecord]:
    """NQ-open oracle file: question, answers and the gold passage (first ctx)."""
    out: list[NQRecord] = []
    for lineno, line in text_lines(path):
        obj = json_object(path, lineno, line)
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


def fix_text(text: str) -> str:
    """``text`` with sentences glued by a missing space (``end.Next``) split again."""
    return _GLUED.sub(r"\1 ", text).strip()


def _digest(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).lower().encode("utf-8")).hexdigest()[:16]


def _items(path: Path, limit: int | None) -> Iterator[tuple[int, dict[str, object]]]:
    for count, (lineno, line) in enumerate(text_lines(path)):
        if limit is not None and count >= limit:
            return
        yield lineno, json_object(path, lineno, line)


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
        knowledge = fix_text(_field(obj, "knowledge", path, lineno))
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
                knowledge = fix_text(row["knowledge"])
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
