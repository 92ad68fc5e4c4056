"""NQ-open-format question files and the passage corpus built from them.

A record is one JSON object per line (optionally gzip-compressed)::

    {"question": str, "answers": [str, ...],
     "ctxs": [{"title": str, "text": str, "isgold": bool?, "hasanswer": bool?}, ...]}

The corpus is the union of the passages of every record in the given files
(other questions' passages are the distractors), de-duplicated by document id
``title + "#" + sha256(text)[:16]``; passages are cut into chunks of at most
``chunk_words`` words, balanced so that no chunk is a tiny tail. A record's gold
documents are its ``ctxs`` with ``isgold: true``; a file without ``isgold``
fields uses ``hasanswer: true`` instead.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.exceptions import ConfigError, InputError
from sidecar.lab.verifier.jsonl import iter_json_objects

__all__ = [
    "Chunk",
    "Passage",
    "QARecord",
    "chunk_passages",
    "corpus_fingerprint",
    "load_passages",
    "load_questions",
    "make_doc_id",
    "read_jsonl",
    "split_words",
]


@dataclass(frozen=True, slots=True)
class Passage:
    """A source document of the corpus."""

    doc_id: str
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a passage: what the index stores and the retriever returns."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    position: int


@dataclass(frozen=True, slots=True)
class QARecord:
    """A question with its reference answers and gold document ids."""

    index: int
    """Line number (0-based) in its file: a stable id for splits."""
    question: str
    answers: tuple[str, ...]
    gold_doc_ids: frozenset[str]
    passages: tuple[Passage, ...]


def make_doc_id(title: str, text: str) -> str:
    """``title#<first 16 hex of sha256(text)>``: the document id of a passage."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return f"{title}#{digest}"


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line index from 0, object)`` from a JSON-lines file, gzip detected by magic
    bytes (:func:`sidecar.lab.verifier.jsonl.iter_json_objects`: errors name file:line)."""
    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"data file {source} does not exist")
    for lineno, obj in iter_json_objects(source):
        yield lineno - 1, obj


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InputError("schema-violation", f"{where}: {key!r} must be a string")
    return value


def _parse_record(index: int, obj: dict[str, Any], where: str) -> QARecord:
    question = _str(obj, "question", where)
    answers = obj.get("answers")
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise InputError("schema-violation", f"{where}: 'answers' must be a list of strings")
    ctxs = obj.get("ctxs")
    if not isinstance(ctxs, list) or not all(isinstance(c, dict) for c in ctxs):
        raise InputError("schema-violation", f"{where}: 'ctxs' must be a list of objects")
    passages = []
    flags = []
    has_isgold = any("isgold" in c for c in ctxs)
    for j, ctx in enumerate(ctxs):
        title = _str(ctx, "title", f"{where} ctxs[{j}]")
        text = _str(ctx, "text", f"{where} ctxs[{j}]")
        passages.append(Passage(doc_id=make_doc_id(title, text), title=title, text=text))
        flags.append(bool(ctx.get("isgold" if has_isgold else "hasanswer", False)))
    gold = frozenset(p.doc_id for p, f in zip(passages, flags, strict=True) if f)
    return QARecord(
        index=index,
        question=question,
        answers=tuple(answers),
        gold_doc_ids=gold,
        passages=tuple(passages),
    )


def load_questions(path: str | Path) -> list[QARecord]:
    """All records of one NQ-open-format file, in file order."""
    return [_parse_record(i, obj, f"{path}:{i + 1}") for i, obj in read_jsonl(path)]


def load_passages(paths: Iterable[str | Path]) -> list[Passage]:
    """The union of the passages in the given files, de-duplicated by doc id, first seen first."""
    seen: dict[str, Passage] = {}
    for path in paths:
        for rec in load_questions(path):
            for p in rec.passages:
                seen.setdefault(p.doc_id, p)
    return list(seen.values())


def split_words(text: str, chunk_words: int) -> list[str]:
    """Cut ``text`` into ``ceil(w / chunk_words)`` pieces of near-equal word counts."""
    if isinstance(chunk_words, bool) or chunk_words < 1:
        raise ConfigError(f"chunk_words must be a positive integer, got {chunk_words!r}")
    words = text.split()
    if not words:
        return []
    n_chunks = math.ceil(len(words) / chunk_words)
    base, extra = divmod(len(words), n_chunks)
    out = []
    start = 0
    for i in range(n_chunks):
        size = base + (1 if i < extra else 0)
        out.append(" ".join(words[start : start + size]))
        start += size
    return out


def chunk_passages(passages: Sequence[Passage], chunk_words: int) -> list[Chunk]:
    """Chunks of every passage, ids ``<doc_id>@<position>``."""
    return [
        Chunk(chunk_id=f"{p.doc_id}@{i}", doc_id=p.doc_id, title=p.title, text=t, position=i)
        for p in passages
        for i, t in enumerate(split_words(p.text, chunk_words))
    ]


def corpus_fingerprint(chunks: Sequence[Chunk]) -> str:
    """sha256 over the chunk ids and texts in order: identifies an indexed corpus."""
    h = hashlib.sha256()
    for c in chunks:
        h.update(c.chunk_id.encode("utf-8"))
        h.update(b"\x00")
        h.update(c.text.encode("utf-8"))
        h.update(b"\x01")
    return h.hexdigest()
