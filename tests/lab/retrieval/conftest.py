"""Factories for NQ-open-format files and a small deterministic embedder."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from sidecar.lab.retrieval.embedder import MiniLMEmbedder

REPO = Path(__file__).resolve().parents[3]
NQ_DEV = REPO.parent / "shared" / "data" / "nq-open" / "nq-open-oracle.dev.jsonl.gz"

WriteRecords = Callable[..., Path]


@pytest.fixture
def write_records(tmp_path: Path) -> WriteRecords:
    """Write NQ-open-format records to ``name`` (gzipped when it ends in .gz)."""

    def write(records: Sequence[dict[str, Any]], name: str = "data.jsonl.gz") -> Path:
        path = tmp_path / name
        text = "".join(json.dumps(r) + "\n" for r in records)
        if name.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
        return path

    return write


def record(question: str, answers: list[str], *ctxs: tuple[str, str, bool]) -> dict[str, Any]:
    return {
        "question": question,
        "answers": answers,
        "ctxs": [{"title": t, "text": x, "isgold": g, "hasanswer": g} for t, x, g in ctxs],
    }


class HashingEmbedder:
    """Bag of hashed words -> unit vector. Deterministic, instant, counts its calls."""

    def __init__(self, dim: int = 64) -> None:
        self._dim = dim
        self.calls: list[int] = []

    @property
    def model_id(self) -> str:
        return "test/hashing-embedder"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(
        self, texts: Sequence[str], *, progress: bool = False, desc: str = "embed"
    ) -> npt.NDArray[np.float32]:
        del progress, desc
        self.calls.append(len(texts))
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                h = int(hashlib.sha256(word.encode()).hexdigest()[:8], 16)
                out[i, h % self._dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.where(norms == 0, 1.0, norms)).astype(np.float32)


@pytest.fixture
def hashing_embedder() -> HashingEmbedder:
    return HashingEmbedder()


@pytest.fixture(scope="session")
def minilm() -> MiniLMEmbedder:
    """The real MiniLM embedder, loaded once per test session (a few seconds)."""
    return MiniLMEmbedder(batch_size=4, num_threads=2)
