"""NQ-open-format loading, document ids, chunking, and the deterministic split."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from sidecar.exceptions import ConfigError, InputError
from sidecar.lab.retrieval.corpus import (
    chunk_passages,
    load_passages,
    load_questions,
    make_doc_id,
    split_words,
)
from sidecar.lab.retrieval.split import select_split, split_indices
from tests.lab.retrieval.conftest import WriteRecords, record


def test_doc_id_is_title_and_text_hash() -> None:
    digest = hashlib.sha256(b"some text").hexdigest()[:16]
    assert make_doc_id("Title", "some text") == f"Title#{digest}"
    assert make_doc_id("Title", "other text") != make_doc_id("Title", "some text")


def test_questions_and_gold_documents(write_records: WriteRecords) -> None:
    path = write_records(
        [
            record("q1", ["a1"], ("T1", "gold one", True), ("T2", "distractor", False)),
            record("q2", ["a2", "b2"], ("T2", "distractor", True)),
        ]
    )
    qs = load_questions(path)
    assert [q.question for q in qs] == ["q1", "q2"]
    assert [q.index for q in qs] == [0, 1]
    assert qs[0].gold_doc_ids == {make_doc_id("T1", "gold one")}
    assert qs[1].answers == ("a2", "b2")
    assert qs[1].gold_doc_ids == {make_doc_id("T2", "distractor")}


def test_hasanswer_is_used_without_isgold(write_records: WriteRecords) -> None:
    rec = {
        "question": "q",
        "answers": ["x"],
        "ctxs": [
            {"title": "A", "text": "has x", "hasanswer": True},
            {"title": "B", "text": "no", "hasanswer": False},
        ],
    }
    (q,) = load_questions(write_records([rec], name="plain.jsonl"))
    assert q.gold_doc_ids == {make_doc_id("A", "has x")}


def test_corpus_is_the_union_without_duplicates(write_records: WriteRecords) -> None:
    a = write_records([record("q1", [], ("T1", "one", True), ("T2", "two", False))], "a.jsonl.gz")
    b = write_records([record("q2", [], ("T2", "two", True), ("T3", "three", True))], "b.jsonl")
    passages = load_passages([a, b])
    assert [p.title for p in passages] == ["T1", "T2", "T3"]


@pytest.mark.parametrize(
    ("n_words", "size", "expected"),
    [(10, 4, [4, 3, 3]), (8, 4, [4, 4]), (3, 64, [3]), (65, 64, [33, 32]), (0, 5, [])],
)
def test_balanced_chunks(n_words: int, size: int, expected: list[int]) -> None:
    text = " ".join(f"w{i}" for i in range(n_words))
    pieces = split_words(text, size)
    assert [len(p.split()) for p in pieces] == expected
    assert " ".join(pieces) == text


def test_chunk_ids_and_bad_size(write_records: WriteRecords) -> None:
    path = write_records([record("q", [], ("T", "a b c d e", True))])
    chunks = chunk_passages(load_passages([path]), 2)
    assert [c.text for c in chunks] == ["a b", "c d", "e"]
    assert [c.chunk_id for c in chunks] == [f"{chunks[0].doc_id}@{i}" for i in range(3)]
    assert [c.position for c in chunks] == [0, 1, 2]
    with pytest.raises(ConfigError, match="chunk_words"):
        split_words("a b", 0)


def test_malformed_files(write_records: WriteRecords, tmp_path: pytest.TempPathFactory) -> None:
    bad = write_records([{"question": 3, "answers": [], "ctxs": []}])
    with pytest.raises(InputError, match="'question' must be a string") as info:
        load_questions(bad)
    assert info.value.reason == "schema-violation"
    broken = write_records([], name="broken.jsonl.gz")
    broken.write_bytes(gzip.compress(b'{"question": "q"\n'))
    with pytest.raises(InputError) as info:
        load_questions(broken)
    assert info.value.reason == "malformed-json"
    with pytest.raises(ConfigError, match="does not exist"):
        load_questions(broken.with_name("missing.jsonl"))


def test_split_is_deterministic_disjoint_and_complete(write_records: WriteRecords) -> None:
    path = write_records([record(f"question {i}", [], ("T", f"p{i}", True)) for i in range(101)])
    qs = load_questions(path)
    cal, test = split_indices(qs, seed=0, cal_fraction=0.5)
    assert len(cal) == 50  # round(50.5) is 50 (banker's rounding)
    assert not set(cal) & set(test)
    assert sorted(cal + test) == list(range(101))
    assert (cal, test) == split_indices(qs, seed=0, cal_fraction=0.5)
    assert cal != split_indices(qs, seed=1, cal_fraction=0.5)[0]
    assert [q.index for q in select_split(qs, "cal", seed=0, cal_fraction=0.5)] == cal
    assert [
        q.index for q in select_split(qs, "test", seed=0, cal_fraction=0.5, max_questions=3)
    ] == test[:3]
    assert len(select_split(qs, "all", seed=0, cal_fraction=0.5)) == 101
    with pytest.raises(ConfigError):
        split_indices(qs, seed=0, cal_fraction=1.0)
