"""The Qdrant adapter in embedded local mode (in memory and on disk)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from sidecar.exceptions import ConfigError, InputError
from sidecar.lab.conformal.labels import label_run
from sidecar.lab.retrieval.corpus import Chunk, load_questions
from sidecar.lab.retrieval.qdrant import QdrantIndex
from sidecar.lab.retrieval.workflow import load_corpus, open_index, retrieve
from tests.lab.retrieval.conftest import HashingEmbedder, WriteRecords, record


def _chunks(n: int) -> list[Chunk]:
    return [Chunk(f"c{i}", f"d{i // 2}", f"T{i}", f"text {i}", i % 2) for i in range(n)]


def _unit(rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float32]:
    out: npt.NDArray[np.float32] = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(
        np.float32
    )
    return out


def test_top_k_by_cosine_in_memory() -> None:
    rng = np.random.default_rng(0)
    vectors = _unit(rng.normal(size=(30, 8)))
    queries = _unit(rng.normal(size=(7, 8)))
    with QdrantIndex.open("test") as index:
        index.build(_chunks(30), vectors, batch_size=7)
        assert index.count() == 30
        hits = index.search(queries, 5, batch_size=3)
    assert len(hits) == 7
    for q, row in zip(queries, hits, strict=True):
        cosine = vectors @ q
        expected = np.argsort(-cosine)[:5]
        assert [h.chunk_id for h in row] == [f"c{i}" for i in expected]
        np.testing.assert_allclose([h.score for h in row], cosine[expected], rtol=1e-5)
        assert row[0].doc_id == f"d{expected[0] // 2}"
        assert row[0].text == f"text {expected[0]}"


def test_argument_checks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not both"):
        QdrantIndex.open("x", path=tmp_path / "never", url="http://localhost:6333")
    assert not (tmp_path / "never").exists()
    with QdrantIndex.open("x") as index:
        with pytest.raises(InputError) as info:
            index.build(_chunks(3), np.zeros((2, 4), dtype=np.float32))
        assert info.value.reason == "shape-mismatch"
        assert index.count() == 0
        with pytest.raises(ConfigError, match="top_k"):
            index.search(np.zeros((1, 4), dtype=np.float32), 0)


def test_on_disk_index_is_reused(
    write_records: WriteRecords, hashing_embedder: HashingEmbedder, tmp_path: Path
) -> None:
    path = write_records(
        [
            record("who wrote frankenstein", ["Mary Shelley"],
                   ("Frankenstein", "Frankenstein was written by Mary Shelley in 1818.", True)),
            record("capital of france", ["Paris"],
                   ("France", "Paris is the capital and largest city of France.", True)),
            record("largest planet", ["Jupiter"],
                   ("Jupiter", "Jupiter is the largest planet in the Solar System.", True)),
        ]
    )  # fmt: skip
    corpus = load_corpus([path], chunk_words=5)
    store = tmp_path / "qdrant"
    index = open_index(corpus, hashing_embedder, path=store)
    assert index.count() == len(corpus.chunks)
    index.close()
    assert hashing_embedder.calls == [len(corpus.chunks)]

    index = open_index(corpus, hashing_embedder, path=store)  # same chunks: no re-embedding
    try:
        assert hashing_embedder.calls == [len(corpus.chunks)]
        run = retrieve(load_questions(path), index, hashing_embedder, 3)
    finally:
        index.close()
    assert [len(row) for row in run.hits] == [3, 3, 3]
    assert run.recall() == 1.0  # word overlap finds each question's own passage
    assert all(row == sorted(row, reverse=True) for row in run.scores)
    labels = label_run(run, 0.0).labels
    assert [any(row) for row in labels] == [True, True, True]

    other = load_corpus([path], chunk_words=50)  # different chunks: another collection
    index = open_index(other, hashing_embedder, path=store)
    index.close()
    assert hashing_embedder.calls[-1] == len(other.chunks)
