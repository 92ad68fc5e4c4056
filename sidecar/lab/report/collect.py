"""Run the real RAG loop through the sidecar's processor and record one row per question.

For each question: MiniLM + Qdrant retrieve the top K chunks, SmolLM2 answers
from them, the LLM-service events of that answer (retrieval, one delta per
decoded piece, final with the attention summary) are fed to a
:class:`~sidecar.pipeline.processor.Processor` built exactly as ``guardrail
run`` builds it (same settings, signals and policy), and what the sidecar
published (claim verdicts, the answer verdict) is kept with the NQ-open label.

A row is a JSON object on one line of ``rows.jsonl``: the question, its gold
answers, the label, the input events, the outputs and per-chunk facts (raw
score, does the chunk contain a gold answer, is it from the gold passage).
Rows are appended and flushed one by one, so an interrupted run resumes at
the first question not yet recorded. ``guardrail train confidence`` fits the
calibrated confidence on rows; ``guardrail eval report`` turns rows into the
report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import GenerationDelta, GenerationFinal, RetrievalEvent
from sidecar.lab.answers import normalize_answer
from sidecar.lab.retrieval.corpus import QARecord
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import Processor

if TYPE_CHECKING:  # the RAG loop imports torch
    from sidecar.lab.generator.rag import RagLoop

__all__ = [
    "ROWS_FILE",
    "collect_rows",
    "contains_answer",
    "load_rows",
    "process_events",
    "row_events",
]

ROWS_FILE = "rows.jsonl"


def contains_answer(text: str, answers: Sequence[str]) -> bool:
    """NQ-open containment: a normalised gold answer is a substring of the normalised text."""
    norm = f" {normalize_answer(text)} "
    return any((a := normalize_answer(ans)) and f" {a} " in norm for ans in answers if ans.strip())


def process_events(
    processor: Processor, events: Sequence[RetrievalEvent | GenerationDelta | GenerationFinal]
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Feed one request's events to ``processor``; return its answer verdict and claim verdicts."""
    verdict: dict[str, Any] | None = None
    claims: list[dict[str, Any]] = []
    for offset, event in enumerate(events):
        kind = InputKind.RETRIEVAL if isinstance(event, RetrievalEvent) else InputKind.GENERATION
        raw = event.model_dump_json().encode("utf-8")
        ref = InputRef(topic=kind.value, partition=0, offset=offset)
        step = processor.on_message(
            kind, raw, event.request_id.encode("utf-8"), ref, time.monotonic() * 1000.0
        )
        for out in step.outputs:
            if out.destination == Destination.VERDICTS:
                verdict = orjson.loads(out.value)
            elif out.destination == Destination.CLAIMS:
                claims.append(orjson.loads(out.value))
    return verdict, claims


def row_events(row: dict[str, Any]) -> list[RetrievalEvent | GenerationDelta | GenerationFinal]:
    """The input events recorded in ``row``, in publishing order (to replay them)."""
    retrieval = RetrievalEvent.model_validate(row["retrieval"])
    deltas = [
        GenerationDelta(request_id=retrieval.request_id, seq=i, text=t)
        for i, t in enumerate(row.get("deltas", []))
    ]
    return [retrieval, *deltas, GenerationFinal.model_validate(row["final"])]


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``rows.jsonl`` (a directory means its ``rows.jsonl``).

    Each row is checked for what the replay reads: ``qid`` (an integer, once per
    file), ``correct`` (a JSON boolean: the string "false" is not false), and
    ``retrieval`` / ``final`` objects; anything else is an ``InputError`` naming
    the file and line.
    """
    from sidecar.exceptions import ConfigError, InputError  # noqa: PLC0415
    from sidecar.lab.verifier.jsonl import iter_json_objects  # noqa: PLC0415

    file = path / ROWS_FILE if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"outcome rows {file} do not exist (a rows.jsonl file or its directory)")
    rows: list[dict[str, Any]] = []
    seen: dict[Any, int] = {}
    for lineno, row in iter_json_objects(file):
        where = f"{file}:{lineno}"
        qid = row.get("qid")
        if type(qid) is not int:
            raise InputError("schema-violation", f"{where}: qid must be an integer, got {qid!r}")
        if qid in seen:
            raise InputError("schema-violation", f"{where}: qid {qid} already on line {seen[qid]}")
        seen[qid] = lineno
        if not isinstance(row.get("correct"), bool):
            raise InputError(
                "schema-violation",
                f"{where}: correct must be true or false (a JSON boolean), got "
                f"{row.get('correct')!r}",
            )
        for name in ("retrieval", "final"):
            if not isinstance(row.get(name), dict):
                raise InputError("schema-violation", f"{where}: {name} must be an event object")
        rows.append(row)
    return rows


def collect_rows(
    loop: RagLoop,
    questions: Sequence[QARecord],
    processor_factory: Callable[[], Processor],
    out: Path,
    *,
    request_prefix: str = "report",
    progress: bool = False,
    key: tuple[str, str, str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Answer every question not yet in ``out`` and append its row; yields new rows.

    ``key``: the (tenant, collection, retriever) the events carry (default: the lab
    service's, ``default/nq-open/qdrant-minilm-l6``)."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    from sidecar.lab.generator.service import (  # noqa: PLC0415
        DEFAULT_COLLECTION,
        DEFAULT_RETRIEVER,
        DEFAULT_TENANT,
        events_for,
    )

    tenant, collection, retriever = key or (DEFAULT_TENANT, DEFAULT_COLLECTION, DEFAULT_RETRIEVER)

    out.parent.mkdir(parents=True, exist_ok=True)
    done: set[int] = set()
    if out.exists():
        done = {int(r["qid"]) for r in load_rows(out)}
    todo = [q for q in questions if q.index not in done]
    if not todo:
        return
    processor = processor_factory()
    try:
        hits = loop.retrieve(todo, progress=progress)
        with out.open("a", encoding="utf-8") as fh:
            for record, row_hits in tqdm(
                list(zip(todo, hits, strict=True)), desc="RAG loop", disable=not progress
            ):
                answer = loop.answer(record, row_hits)
                request = events_for(
                    answer,
                    loop.generator,
                    request_id=f"{request_prefix}-{record.index}",
                    k=loop.k,
                    tenant=tenant,
                    collection=collection,
                    retriever=retriever,
                )
                started = time.perf_counter()
                verdict, claims = process_events(processor, request.events)
                sidecar_ms = (time.perf_counter() - started) * 1000.0
                row = {
                    "qid": record.index,
                    "question": record.question,
                    "answers": list(record.answers),
                    "answer": request.final.answer,
                    "correct": answer.correct,
                    "generation_s": round(answer.seconds, 3),
                    "sidecar_ms": round(sidecar_ms, 3),
                    "chunks": [
                        {
                            "chunk_id": h.chunk_id,
                            "score": h.score,
                            "contains_answer": contains_answer(h.text, record.answers),
                            "gold_passage": h.doc_id in record.gold_doc_ids,
                        }
                        for h in row_hits
                    ],
                    "retrieval": request.retrieval.model_dump(mode="json"),
                    "deltas": [d.text for d in request.deltas],
                    "final": request.final.model_dump(mode="json"),
                    "verdict": verdict,
                    "claims": claims,
                }
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                fh.flush()
                yield row
    finally:  # an LLM judge's calls in flight are cut off; its threads held the exit
        processor.signals.close()


def default_processor_factory(settings: Settings) -> Callable[[], Processor]:
    """A processor as ``guardrail run`` builds it from ``settings``."""

    def build() -> Processor:
        from sidecar.runtime import build_policy, build_signals  # noqa: PLC0415

        return Processor(settings, build_policy(settings), signals=build_signals(settings))

    return build
