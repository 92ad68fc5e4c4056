"""Offline retrieval runs: corpus -> index -> top-K hits -> eq. (1) labels.

Shared by ``guardrail calibrate retrieval``, ``guardrail eval retrieval`` and the
end-to-end tests. The index collection is named after the corpus fingerprint
and the embedding model, so a persistent Qdrant (``path=`` or ``url=``) that
already holds the same chunks is reused instead of re-embedded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sidecar.hashing import sha256_file
from sidecar.lab.retrieval.corpus import (
    Chunk,
    QARecord,
    chunk_passages,
    corpus_fingerprint,
    load_passages,
)
from sidecar.lab.retrieval.embedder import Embedder
from sidecar.lab.retrieval.qdrant import Hit, QdrantIndex

__all__ = [
    "Corpus",
    "RetrievalRun",
    "chunk_embedding_text",
    "load_corpus",
    "open_index",
    "retrieve",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Corpus:
    """The chunked union of the passages of some NQ-open-format files."""

    chunks: tuple[Chunk, ...]
    fingerprint: str
    files: tuple[str, ...]
    files_sha256: str
    n_passages: int
    chunk_words: int


def load_corpus(paths: Iterable[str | Path], chunk_words: int) -> Corpus:
    """Load, de-duplicate and chunk the passages of ``paths``."""
    files = tuple(str(p) for p in paths)
    passages = load_passages(files)
    chunks = tuple(chunk_passages(passages, chunk_words))
    files_hash = hashlib.sha256("\n".join(sha256_file(f) for f in files).encode()).hexdigest()
    return Corpus(
        chunks=chunks,
        fingerprint=corpus_fingerprint(chunks),
        files=files,
        files_sha256=files_hash,
        n_passages=len(passages),
        chunk_words=chunk_words,
    )


def calibration_data_hash(
    *,
    questions_sha256: str,
    question_indices: Sequence[int],
    corpus: Corpus,
    embedding_model_id: str,
    top_k: int,
    beta: float,
) -> str:
    """sha256 identifying the calibration data: which questions, which chunks, how labelled."""
    fingerprint = {
        "questions_sha256": questions_sha256,
        "question_indices": list(question_indices),
        "corpus": corpus.fingerprint,
        "chunk_words": corpus.chunk_words,
        "embedding_model": embedding_model_id,
        "top_k": top_k,
        "beta": beta,
    }
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()


def chunk_embedding_text(chunk: Chunk) -> str:
    """What is embedded for a chunk: its passage title, then its text."""
    return f"{chunk.title}\n{chunk.text}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def open_index(
    corpus: Corpus,
    embedder: Embedder,
    *,
    path: str | Path | None = None,
    url: str | None = None,
    api_key: str | None = None,
    progress: bool = False,
) -> QdrantIndex:
    """An index holding ``corpus`` embedded by ``embedder`` (built, or reused if complete)."""
    name = f"chunks-{_slug(embedder.model_id.rsplit('/', 1)[-1])}-{corpus.fingerprint[:16]}"
    index = QdrantIndex.open(name, path=path, url=url, api_key=api_key)
    if index.count() == len(corpus.chunks):
        log.info("reusing Qdrant collection %s (%d chunks)", name, len(corpus.chunks))
        return index
    log.info("indexing %d chunks into Qdrant collection %s", len(corpus.chunks), name)
    vectors = embedder.embed(
        [chunk_embedding_text(c) for c in corpus.chunks], progress=progress, desc="embed chunks"
    )
    index.build(corpus.chunks, vectors, progress=progress)
    return index


@dataclass(frozen=True, slots=True)
class RetrievalRun:
    """The top-K hits of each question."""

    questions: tuple[QARecord, ...]
    hits: tuple[tuple[Hit, ...], ...]

    @property
    def scores(self) -> list[list[float]]:
        """Raw scores per question, best first."""
        return [[h.score for h in row] for row in self.hits]

    @property
    def doc_ids(self) -> list[list[str]]:
        """Source document of each hit."""
        return [[h.doc_id for h in row] for row in self.hits]

    @property
    def texts(self) -> list[list[str]]:
        """Text of each hit."""
        return [[h.text for h in row] for row in self.hits]

    def recall(self) -> float:
        """Share of questions with at least one chunk of a gold document in their top K."""
        if not self.questions:
            return 0.0
        found = sum(
            any(h.doc_id in q.gold_doc_ids for h in row)
            for q, row in zip(self.questions, self.hits, strict=True)
        )
        return found / len(self.questions)


def retrieve(
    questions: Sequence[QARecord],
    index: QdrantIndex,
    embedder: Embedder,
    top_k: int,
    *,
    progress: bool = False,
) -> RetrievalRun:
    """Embed the questions and take the top ``top_k`` chunks of each."""
    vectors = embedder.embed([q.question for q in questions], progress=progress, desc="embed q")
    hits = index.search(vectors, top_k, progress=progress)
    return RetrievalRun(questions=tuple(questions), hits=tuple(tuple(r) for r in hits))
