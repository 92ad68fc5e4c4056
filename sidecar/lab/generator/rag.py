"""The offline RAG loop: Qdrant + MiniLM retrieve, SmolLM2 answers, eqs. 7-9 recorded.

Shared by ``guardrail dataset lookback``, ``guardrail eval lookback`` and the
demo service: retrieve the top K chunks of a question (MiniLM embeddings in a
Qdrant collection, :mod:`sidecar.lab.retrieval`), order them by retrieval score,
best first (docs/methods.md §Lookback-ratio factuality), prompt the generator with
them, decode greedily and keep the lookback trace; the answer is labelled with
the NQ-open rule of :mod:`sidecar.lab.answers`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.exceptions import ConfigError
from sidecar.lab.answers import is_correct
from sidecar.lab.generator.prompt import PromptChunk
from sidecar.lab.generator.smollm2 import GeneratedAnswer, TextGenerator
from sidecar.lab.retrieval.corpus import QARecord
from sidecar.lab.retrieval.embedder import Embedder
from sidecar.lab.retrieval.qdrant import Hit, QdrantIndex
from sidecar.lab.retrieval.workflow import Corpus, load_corpus, open_index

__all__ = ["RagAnswer", "RagLoop", "open_rag_loop"]


@dataclass(frozen=True, slots=True)
class RagAnswer:
    """One question through the loop."""

    record: QARecord
    hits: tuple[Hit, ...]
    generated: GeneratedAnswer
    correct: bool
    seconds: float

    def to_record(self) -> dict[str, Any]:
        """The JSON record a dataset shard stores for this question."""
        trace = self.generated.trace
        return {
            "qid": self.record.index,
            "question": self.record.question,
            "answers": list(self.record.answers),
            "answer": self.generated.text,
            "correct": self.correct,
            "steps": trace.steps,
            "stopped": trace.stopped,
            "mean_token_logprob": trace.mean_token_logprob,
            "prompt_tokens": self.generated.prompt.length,
            "chunk_ids": [h.chunk_id for h in self.hits],
            "doc_ids": [h.doc_id for h in self.hits],
            "scores": [h.score for h in self.hits],
            "gold_retrieved": [h.doc_id in self.record.gold_doc_ids for h in self.hits],
            "seconds": round(self.seconds, 3),
        }


class RagLoop:
    """Retrieve top-K with ``embedder`` + ``index``, answer with ``generator``."""

    def __init__(
        self,
        generator: TextGenerator,
        embedder: Embedder,
        index: QdrantIndex,
        *,
        k: int,
        max_new_tokens: int = 24,
        corpus: Corpus | None = None,
    ) -> None:
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.generator = generator
        self.embedder = embedder
        self.index = index
        self.k = k
        self.max_new_tokens = max_new_tokens
        self.corpus = corpus

    def retrieve(
        self, questions: Sequence[QARecord], *, progress: bool = False
    ) -> list[tuple[Hit, ...]]:
        """Top-K hits per question, best first (ties keep the store's order)."""
        if not questions:
            return []
        vectors = self.embedder.embed(
            [q.question for q in questions], progress=progress, desc="embed questions"
        )
        rows = self.index.search(vectors, self.k, progress=progress)
        return [tuple(sorted(row, key=lambda h: -h.score)) for row in rows]

    def answer(self, record: QARecord, hits: Sequence[Hit]) -> RagAnswer:
        """Prompt with ``hits`` (in the given order), decode greedily, label."""
        if not hits:
            raise ConfigError(f"question {record.index} has no retrieved chunk to answer from")
        chunks = [PromptChunk(chunk_id=h.chunk_id, title=h.title, text=h.text) for h in hits]
        started = time.perf_counter()
        generated = self.generator.answer(
            record.question, chunks, max_new_tokens=self.max_new_tokens
        )
        elapsed = time.perf_counter() - started
        return RagAnswer(
            record=record,
            hits=tuple(hits),
            generated=generated,
            correct=is_correct(generated.text, record.answers),
            seconds=elapsed,
        )


def open_rag_loop(
    corpus_files: Sequence[str | Path],
    *,
    k: int,
    chunk_words: int,
    max_new_tokens: int = 24,
    qdrant_path: str | Path | None = None,
    qdrant_url: str | None = None,
    threads: int | None = None,
    progress: bool = False,
    generator: TextGenerator | None = None,
) -> RagLoop:
    """Load the corpus, MiniLM, the (reused or built) Qdrant collection and SmolLM2."""
    from sidecar.lab.generator.smollm2 import load_smollm2  # noqa: PLC0415
    from sidecar.lab.retrieval.embedder import MiniLMEmbedder  # noqa: PLC0415

    corpus = load_corpus(corpus_files, chunk_words)
    embedder = MiniLMEmbedder(num_threads=threads)
    index = open_index(corpus, embedder, path=qdrant_path, url=qdrant_url, progress=progress)
    gen = generator if generator is not None else load_smollm2(threads=threads)
    return RagLoop(gen, embedder, index, k=k, max_new_tokens=max_new_tokens, corpus=corpus)
