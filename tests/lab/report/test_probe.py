"""The leakage probe (seed 003 section 4.2) with a fake RAG loop: no torch, no model."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from sidecar.exceptions import ConfigError
from sidecar.lab.report.probe import (
    MAX_EXAMPLES,
    PROBE_FORMAT,
    answer_free_context,
    classify,
    is_abstention,
    load_probe,
    run_leakage_probe,
    write_probe,
)
from sidecar.lab.retrieval.corpus import QARecord
from sidecar.lab.retrieval.qdrant import Hit
from sidecar.stats.intervals import wilson_interval

GOLD_DOC = "Paris#gold"


def make_record(index: int = 0, answers: tuple[str, ...] = ("Paris",)) -> QARecord:
    return QARecord(
        index=index,
        question=f"what is the capital of france {index}",
        answers=answers,
        gold_doc_ids=frozenset({GOLD_DOC}),
        passages=(),
    )


def make_hit(name: str, score: float, *, doc_id: str = "", text: str = "", title: str = "") -> Hit:
    return Hit(
        chunk_id=name,
        doc_id=doc_id or f"{name}#doc",
        title=title or f"title {name}",
        text=text or f"filler text about {name}",
        score=score,
    )


def mixed_hits() -> list[Hit]:
    """Best first: gold passage, answer in text, answer in title, then clean ones."""
    return [
        make_hit("gold", 0.99, doc_id=GOLD_DOC),
        make_hit("answer-text", 0.95, text="The capital is Paris, on the Seine."),
        make_hit("answer-title", 0.93, title="Paris"),
        make_hit("clean-1", 0.90),
        make_hit("parisian", 0.85, text="A Parisian cafe sells croissants."),
        make_hit("clean-3", 0.80),
        make_hit("clean-4", 0.70),
    ]


@dataclass(frozen=True)
class FakeGenerated:
    text: str


@dataclass(frozen=True)
class FakeAnswer:
    generated: FakeGenerated
    seconds: float


@dataclass(frozen=True)
class FakeGenerator:
    generator_id: str = "fake-generator@1"


@dataclass(frozen=True)
class FakeCorpus:
    fingerprint: str = "corpus-fp"


class FakeEmbedder:
    model_id = "fake-embedder"
    dim = 2

    def embed(
        self, texts: Sequence[str], *, progress: bool = False, desc: str = "embed"
    ) -> npt.NDArray[np.float32]:
        return np.zeros((len(texts), self.dim), dtype=np.float32)


@dataclass
class FakeIndex:
    """Returns ``rows[i]`` for the i-th query, top ``top_k`` by score, in a shuffled order."""

    rows: list[list[Hit]]
    top_ks: list[int] = field(default_factory=list)

    def search(
        self, queries: npt.NDArray[np.float32], top_k: int, *, progress: bool = False
    ) -> list[list[Hit]]:
        self.top_ks.append(top_k)
        out = []
        for row in self.rows[: len(queries)]:
            best = sorted(row, key=lambda h: -h.score)[:top_k]
            out.append(best[::-1])  # worst first: the probe must sort
        return out


@dataclass
class FakeLoop:
    """A :class:`~sidecar.lab.report.probe.ProbeLoop` answering from a script keyed by question."""

    rows: list[list[Hit]]
    script: dict[int, str]
    generator: FakeGenerator = field(default_factory=FakeGenerator)
    embedder: FakeEmbedder = field(default_factory=FakeEmbedder)
    corpus: FakeCorpus | None = field(default_factory=FakeCorpus)
    max_new_tokens: int = 24
    prompts: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.index = FakeIndex(self.rows)

    def answer(self, record: QARecord, hits: Sequence[Hit]) -> FakeAnswer:
        self.prompts.append((record.index, tuple(h.chunk_id for h in hits)))
        return FakeAnswer(FakeGenerated(self.script[record.index]), seconds=0.5)


def test_gold_and_answer_chunks_are_dropped_and_the_best_k_kept_in_order() -> None:
    kept, n_gold, n_answer = answer_free_context(make_record(), mixed_hits(), 3)
    assert [h.chunk_id for h in kept] == ["clean-1", "parisian", "clean-3"]
    assert (n_gold, n_answer) == (1, 2)


def test_answer_match_uses_nq_normalisation_on_word_boundaries() -> None:
    record = make_record(answers=("The Beatles",))
    hits = [
        make_hit("punct", 0.9, text="songs by beatles!"),
        make_hit("inside-word", 0.8, text="the beatlesque sound"),
    ]
    kept, _, n_answer = answer_free_context(record, hits, 2)
    assert [h.chunk_id for h in kept] == ["inside-word"]
    assert n_answer == 1


def test_the_probe_prompts_with_the_best_answer_free_chunks() -> None:
    loop = FakeLoop(rows=[mixed_hits()], script={0: "Lyon"})
    result = run_leakage_probe(loop, [make_record()], k=2, candidates=7)
    assert loop.index.top_ks == [7]
    assert loop.prompts == [(0, ("clean-1", "parisian"))]
    assert (result.trials, result.errors, result.delta) == (1, 1, 1.0)
    assert (result.dropped_gold_chunks, result.dropped_answer_chunks) == (1, 2)
    assert result.examples[0].chunk_ids == ("clean-1", "parisian")
    assert result.examples[0].label == "error"


def test_only_the_candidates_are_considered() -> None:
    # with 4 candidates only clean-1 survives the filter: fewer than k=2, so skipped
    loop = FakeLoop(rows=[mixed_hits()], script={0: "Lyon"})
    result = run_leakage_probe(loop, [make_record()], k=2, candidates=4)
    assert loop.prompts == []
    assert (result.questions, result.skipped, result.trials) == (1, 1, 0)
    assert result.delta is None
    assert (result.delta_low, result.delta_high) == (0.0, 1.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "I don't know.",
        "I don\u2019t know",
        "i DO NOT KNOW the answer",
        "I'm sorry, but the documents do not mention the capital.",
        "The capital is not mentioned in the context.",
        "The documents don't provide this information.",
        "There is no information about it.",
        "This question cannot be answered from the documents.",
        "I cannot answer that.",
    ],
)
def test_abstentions(text: str) -> None:
    assert is_abstention(text)


@pytest.mark.parametrize(
    "text",
    [
        "Paris",
        "No",
        "The Tomb of the Unknown Soldier",
        "I know it: Lyon",
        "It was mentioned by Caesar in 52 BC.",
        "Notwithstanding the war, Berlin",
    ],
)
def test_answers_are_not_abstentions(text: str) -> None:
    assert not is_abstention(text)


def test_classify_order() -> None:
    assert classify("I don't know, maybe Paris", ["Paris"]) == "abstention"
    assert classify("The capital is Paris.", ["Paris"]) == "correct"
    assert classify("The capital is Lyon.", ["Paris"]) == "error"


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("The Mayflower sailed in 1620.", "May"),
        ("It ended in 1918.", "1"),
        ("She went to business school.", "US"),
    ],
)
def test_a_gold_answer_inside_another_word_is_not_known_from_memory(answer: str, gold: str) -> None:
    """Counting these as known would lower delta (and the bound): they are errors, as the
    answer-free chunk filter (word boundaries) already treats them."""
    assert classify(answer, [gold]) == "error"
    assert classify(f"{answer} {gold}.", [gold]) == "correct"


def ten_question_loop() -> tuple[FakeLoop, list[QARecord]]:
    """3 errors, 4 abstentions, 3 correct from memory."""
    answers = ["Lyon", "Nice", "Lille"] + ["I don't know"] * 4 + ["It is Paris"] * 3
    records = [make_record(i) for i in range(10)]
    rows = [mixed_hits() for _ in records]
    return FakeLoop(rows=rows, script=dict(enumerate(answers))), records


def test_delta_and_wilson_interval_on_three_errors_of_ten() -> None:
    loop, records = ten_question_loop()
    result = run_leakage_probe(
        loop, records, k=3, candidates=20, questions_sha256="ab" * 32, part="eval"
    )
    assert (result.trials, result.errors, result.abstentions, result.correct_from_memory) == (
        10,
        3,
        4,
        3,
    )
    assert result.delta == pytest.approx(0.3)
    # Wilson 95% for 3/10: [0.1078, 0.6032]
    assert result.delta_low == pytest.approx(0.1078, abs=5e-5)
    assert result.delta_high == pytest.approx(0.6032, abs=5e-5)
    assert result.interval == wilson_interval(3, 10, 0.95)
    assert result.seconds_per_question == pytest.approx(0.5)
    assert result.generator_model == "fake-generator@1"
    assert result.embedder == "fake-embedder"
    assert result.corpus_fingerprint == "corpus-fp"
    assert (result.k, result.candidates, result.part) == (3, 20, "eval")
    assert result.to_dict()["format"] == PROBE_FORMAT


def test_examples_are_capped() -> None:
    records = [make_record(i) for i in range(MAX_EXAMPLES + 5)]
    loop = FakeLoop(rows=[mixed_hits() for _ in records], script=dict.fromkeys(range(25), "Lyon"))
    result = run_leakage_probe(loop, records, k=1)
    assert result.trials == MAX_EXAMPLES + 5
    assert len(result.examples) == MAX_EXAMPLES
    assert result.corpus_fingerprint == "corpus-fp"


def test_bad_arguments_are_config_errors() -> None:
    loop, records = ten_question_loop()
    with pytest.raises(ConfigError, match="candidates must be >= k"):
        run_leakage_probe(loop, records, k=3, candidates=2)
    with pytest.raises(ConfigError, match="k must be >= 1"):
        run_leakage_probe(loop, records, k=0)
    with pytest.raises(ConfigError, match="at least one question"):
        run_leakage_probe(loop, [], k=3)


def test_load_probe_round_trip(tmp_path: Path) -> None:
    loop, records = ten_question_loop()
    result = run_leakage_probe(loop, records, k=3, questions_file="q.jsonl.gz", part="eval")
    path = tmp_path / "nested" / "probe.json"
    write_probe(result, path)
    assert load_probe(path) == result


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (json.dumps({"format": "lookback-dataset/1", "k": 3}), "format 'lookback-dataset/1'"),
        (json.dumps([1, 2, 3]), "format None"),
        ("not json {", "not JSON"),
    ],
)
def test_load_probe_rejects_other_files(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "other.json"
    path.write_text(content, "utf-8")
    with pytest.raises(ConfigError, match=match):
        load_probe(path)


def test_load_probe_rejects_inconsistent_counts(tmp_path: Path) -> None:
    loop, records = ten_question_loop()
    data = run_leakage_probe(loop, records, k=3).to_dict()
    data["errors"] = 5
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(data), "utf-8")
    with pytest.raises(ConfigError, match="must equal trials"):
        load_probe(path)


def test_load_probe_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_probe(tmp_path / "absent.json")
