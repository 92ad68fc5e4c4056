"""The Qdrant vector index: embedded local mode by default, a server when configured.

``QdrantIndex.open(name)`` uses ``QdrantClient(":memory:")``; ``path=`` keeps the
embedded store on disk (reused across commands); ``url=`` talks to a Qdrant
server. After opening, every call is the same qdrant-client code for all three.

Points carry the chunk as payload (``chunk_id``, ``doc_id``, ``title``, ``text``,
``position``); vectors are unit-norm and the distance is cosine, so a hit's score
is the cosine similarity in [-1, 1]. Upserts and queries are batched, with tqdm
progress bars when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np
import numpy.typing as npt
from qdrant_client import QdrantClient, models
from tqdm.auto import tqdm

from sidecar.exceptions import ConfigError, InputError
from sidecar.lab.retrieval.corpus import Chunk

__all__ = ["Hit", "QdrantIndex"]


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved chunk and its raw vector-store score."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    score: float


class QdrantIndex:
    """A Qdrant collection of chunk embeddings with batched indexing and top-K search."""

    def __init__(self, client: QdrantClient, collection: str) -> None:
        self.client = client
        self.collection = collection

    @classmethod
    def open(
        cls,
        collection: str,
        *,
        path: str | Path | None = None,
        url: str | None = None,
        api_key: str | None = None,
    ) -> Self:
        """In-memory local mode (default), local mode at ``path``, or the server at ``url``."""
        if path is not None and url is not None:
            raise ConfigError("give either a Qdrant path (local mode) or a URL (server), not both")
        client: QdrantClient
        if url is not None:
            client = QdrantClient(url=url, api_key=api_key)
        elif path is not None:
            Path(path).mkdir(parents=True, exist_ok=True)
            client = QdrantClient(path=str(path))
        else:
            client = QdrantClient(":memory:")
        return cls(client, collection)

    def close(self) -> None:
        """Release the client (flushes local-mode storage)."""
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exists(self) -> bool:
        """Whether the collection exists."""
        return bool(self.client.collection_exists(self.collection))

    def count(self) -> int:
        """Number of points in the collection (0 when it does not exist)."""
        if not self.exists():
            return 0
        return int(self.client.count(self.collection, exact=True).count)

    def build(
        self,
        chunks: Sequence[Chunk],
        vectors: npt.NDArray[np.float32],
        *,
        batch_size: int = 256,
        progress: bool = False,
    ) -> None:
        """(Re)create the collection and upsert one point per chunk, ids 0..n-1."""
        if vectors.ndim != 2 or vectors.shape[0] != len(chunks):
            raise InputError(
                "shape-mismatch",
                f"need one vector per chunk: {len(chunks)} chunks, vectors of shape "
                f"{vectors.shape}",
            )
        if self.exists():
            self.client.delete_collection(self.collection)
        self.client.create_collection(
            self.collection,
            vectors_config=models.VectorParams(
                size=int(vectors.shape[1]), distance=models.Distance.COSINE
            ),
        )
        starts = range(0, len(chunks), batch_size)
        for start in tqdm(starts, desc="index", unit="batch", disable=not progress):
            stop = min(start + batch_size, len(chunks))
            self.client.upsert(
                self.collection,
                points=[
                    models.PointStruct(
                        id=i,
                        vector=vectors[i].tolist(),
                        payload={
                            "chunk_id": chunks[i].chunk_id,
                            "doc_id": chunks[i].doc_id,
                            "title": chunks[i].title,
                            "text": chunks[i].text,
                            "position": chunks[i].position,
                        },
                    )
                    for i in range(start, stop)
                ],
                wait=True,
            )

    def search(
        self,
        queries: npt.NDArray[np.float32],
        top_k: int,
        *,
        batch_size: int = 64,
        progress: bool = False,
    ) -> list[list[Hit]]:
        """Top-``top_k`` hits per query vector, best first, in batched requests."""
        if top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {top_k}")
        results: list[list[Hit]] = []
        starts = range(0, len(queries), batch_size)
        for start in tqdm(starts, desc="search", unit="batch", disable=not progress):
            requests = [
                models.QueryRequest(query=q.tolist(), limit=top_k, with_payload=True)
                for q in queries[start : start + batch_size]
            ]
            responses = self.client.query_batch_points(self.collection, requests=requests)
            results.extend([_hit(p) for p in r.points] for r in responses)
        return results


def _hit(point: models.ScoredPoint) -> Hit:
    payload = point.payload or {}
    return Hit(
        chunk_id=str(payload.get("chunk_id", point.id)),
        doc_id=str(payload.get("doc_id", "")),
        title=str(payload.get("title", "")),
        text=str(payload.get("text", "")),
        score=float(point.score),
    )
