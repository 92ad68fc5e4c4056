"""The verifier corpus: every source in one pair format, splits by document, length matching,
evidence windows, and the question-free coverage."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import pytest

from sidecar.claims.calibration import coverage
from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex, uncovered_terms
from sidecar.exceptions import ConfigError, InputError
from sidecar.lab.verifier.datasets import (
    ALL_SOURCES,
    FORMS,
    SOURCE_FORM,
    CorpusConfig,
    altered_copies,
    baselines,
    build_corpus,
    by_split,
    form_sets,
    length_auroc,
    length_matched,
    read_pairs,
    windowed,
    write_pairs,
)
from sidecar.lab.verifier.sources import (
    Pair,
    last_user_turn,
    read_begin,
    read_factcheckgpt,
    read_halueval_dialogue,
    read_halueval_summarization,
    read_summedits,
)
from tests.claims.conftest import DATA

DOC = (
    "The council approved a new park in 2021. The park lies on the east bank of the river. "
    "Its budget was 4 million euros. Local schools will plant 300 trees there. "
    "The mayor, Ana Ruiz, opened the first section in May 2023. "
    "A second section with a playground follows next year."
)


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_every_reader_gives_labelled_pairs_grouped_by_document(tmp_path: Path) -> None:
    summ = read_halueval_summarization(
        _jsonl(
            tmp_path / "s.jsonl",
            [{"document": DOC, "right_summary": "A park.", "hallucinated_summary": "A zoo."}],
        )
    )
    assert [(p.claim, p.label, p.evidence) for p in summ] == [
        ("A park.", 1, DOC),
        ("A zoo.", 0, DOC),
    ]
    assert summ[0].group == summ[1].group and summ[0].group.startswith("doc:")

    dialogue = read_halueval_dialogue(
        _jsonl(
            tmp_path / "d.jsonl",
            [
                {
                    "knowledge": "Inception was directed by Christopher Nolan.",
                    "dialogue_history": "[Human]: Hi [Assistant]: Hi! [Human]: Who made Inception?",
                    "right_response": "Christopher Nolan did.",
                    "hallucinated_response": "Steven Spielberg did.",
                }
            ],
        )
    )
    assert [p.label for p in dialogue] == [1, 0]
    assert dialogue[0].question == "Who made Inception?"

    edits = tmp_path / "summedits" / "data"
    edits.mkdir(parents=True)
    (edits / "summedits_news.json").write_text(
        json.dumps(
            [
                {"doc": DOC, "summary": "The park opened in 2023.", "label": "1"},
                {"doc": DOC, "summary": "The park opened in 2020.", "label": "0"},
            ]
        ),
        encoding="utf-8",
    )
    assert [p.label for p in read_summedits(tmp_path / "summedits")] == [1, 0]

    stances = ["completely-support", "partially-support", "refute", "irrelevant"]
    fc = read_factcheckgpt(
        _jsonl(
            tmp_path / "f.jsonl",
            [{"claim": "c", "evidence": f"e{k}", "stance": s} for k, s in enumerate(stances)],
        )
    )
    assert [(p.evidence, p.label) for p in fc] == [
        ("e0", 1),
        ("e2", 0),
        ("e3", 0),
    ]  # partial dropped
    assert len({p.group for p in fc}) == 1  # one claim, one group

    begin = tmp_path / "begin" / "wow"
    begin.mkdir(parents=True)
    header = "model_name\tdata_source\tknowledge\tmessage\tresponse\tbegin_label\n"
    rows = [
        "t5\twow\tthe river is 300 km long.\thow long?\tit is 300 km long.\tFully attributable\n",
        "t5\twow\tthe river is 300 km long.\thow long?\ti like rivers.\tGeneric\n",
        "t5\twow\tthe river is 300 km long.\thow long?\tit is 9 km.\tNot fully attributable\n",
    ]
    (begin / "begin_dev_wow.tsv").write_text(header + "".join(rows), encoding="utf-8")
    pairs = read_begin(tmp_path / "begin")
    assert [(p.label, p.question) for p in pairs] == [(1, "how long?"), (0, "how long?")]


def test_readers_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="'right_summary' must be a string"):
        read_halueval_summarization(_jsonl(tmp_path / "s.jsonl", [{"document": DOC}]))
    with pytest.raises(InputError, match="no summedits_"):
        read_summedits(tmp_path)


def test_a_document_never_spans_two_splits() -> None:
    pairs = [
        Pair(f"claim {k} {j}", f"doc {k}", j % 2, "x", "s", f"doc:{k}")
        for k in range(300)
        for j in range(3)
    ]
    parts = by_split(pairs)
    owners = {p.group: split for split, ps in parts.items() for p in ps}
    for split, ps in parts.items():
        assert all(owners[p.group] == split for p in ps)
    assert 0.05 < len(parts["test"]) / len(pairs) < 0.15


def test_length_matching_removes_the_length_signal() -> None:
    rng = random.Random(0)
    skewed = [Pair("w " * rng.randint(5, 20), "e", 1, "x", "s", str(k)) for k in range(400)] + [
        Pair("w " * rng.randint(10, 40), "e", 0, "x", "s", str(k)) for k in range(400)
    ]
    assert abs(length_auroc(skewed) - 0.5) > 0.3  # the hallucinated claims are longer
    matched = length_matched(skewed, seed=0)
    assert len(matched) > 100
    assert sum(p.label for p in matched) * 2 == len(matched)
    assert abs(length_auroc(matched) - 0.5) < 0.05
    assert length_matched(skewed, seed=0) == matched  # seeded


def test_windows_look_up_every_part_of_a_claim_within_the_budget() -> None:
    index = EvidenceIndex([EvidenceChunk("doc", DOC)])
    claim = "The mayor Ana Ruiz opened the park in May 2023. Schools will plant 300 trees."
    (one,) = index.windows(claim, max_windows=1, max_chars=200)
    assert "Ana Ruiz" in one and "300 trees" in one  # each claim sentence got its best sentence
    assert len(one) <= 200
    several = index.windows(claim, max_windows=3, max_chars=90)
    assert 1 < len(several) <= 3 and all(len(w) <= 90 for w in several)
    assert "Ana Ruiz" in several[0]  # best first
    assert index.windows("Nothing shared here.", max_windows=2, max_chars=120)  # falls back
    assert EvidenceIndex([]).windows("x") == ()
    with pytest.raises(ValueError, match="max_windows must be >= 1"):
        index.windows(claim, max_windows=0)


def test_windowed_pairs_read_a_window_not_the_whole_document() -> None:
    long_doc = " ".join(f"Filler sentence number {k} says nothing at all." for k in range(60))
    pair = Pair("The mayor opened the park.", long_doc + " " + DOC, 1, "x", "s", "g")
    (cut,) = windowed([pair], window_chars=300)
    assert len(cut.evidence) <= 300 and "mayor" in cut.evidence


def test_coverage_counts_only_what_the_answer_adds() -> None:
    question = "Who directed Taxi Driver?"
    claim = "Taxi Driver was directed by Paul Schrader."
    evidence = "Taxi Driver is a 1976 film directed by Martin Scorsese."
    assert uncovered_terms(claim, question) == ["paul", "schrader"]
    assert coverage(claim, evidence) > 0.5  # the restated question looks covered
    assert coverage(claim, evidence, question) == 0.0
    assert uncovered_terms("Taxi Driver.", question) == ["taxi", "driver"]  # nothing new: all count


def test_altered_copies_keep_length_but_not_support() -> None:
    pairs = [
        Pair(
            "the river is 300 km long.", "the river is 300 km long and wide.", 1, "b", "begin", "g1"
        ),
        Pair(
            "Nolan directed Inception.",
            "Inception was directed by Nolan in London.",
            1,
            "b",
            "begin",
            "g2",
        ),
        Pair("no.", "x", 0, "b", "begin", "g3"),
    ]
    altered = altered_copies(pairs, seed=0)
    assert altered and all(p.label == 0 and p.kind == "begin-altered" for p in altered)
    assert all(a.claim != p.claim for a, p in zip(altered, pairs, strict=False))
    assert {a.group for a in altered} <= {"g1", "g2"}  # stays in its document's split


def test_pairs_round_trip_and_baselines(tmp_path: Path) -> None:
    evidence = "Paris hosted the games."
    pairs = [
        Pair("Paris hosted.", evidence, 1, "k", "s", "g", "Who?"),
        Pair("Lyon built stadiums.", evidence, 0, "k", "s", "g"),
    ]
    write_pairs(tmp_path / "p.jsonl", pairs)
    assert read_pairs(tmp_path / "p.jsonl") == pairs
    numbers = baselines(pairs)
    assert numbers["n"] == 2 and numbers["overlap_auroc"] == 1.0 and numbers["length_auroc"] == 1.0


def test_last_user_turn() -> None:
    assert last_user_turn("[Human]: a [Assistant]: b [Human]: c d ") == "c d"
    assert last_user_turn("no markers") == "no markers"


def _tiny_data_dir(root: Path, docs: int = 80) -> Path:
    """Every corpus source in its own format: ``docs`` documents each, long enough to window."""
    places = ["Lisbon", "Oslo", "Quito", "Hanoi", "Dakar", "Lima", "Perth", "Turin"]

    def doc(k: int) -> str:
        place = places[k % len(places)]
        return " ".join(
            f"In {1900 + k + j} the {place} council number {k} approved project {j} for "
            f"{100 * j + k} workers near the river."
            for j in range(8)
        )

    halueval = root / "halueval"
    halueval.mkdir(parents=True)
    shutil.copyfile(DATA / "halueval_qa_test_slice.jsonl", halueval / "qa_data.json")
    summaries: list[dict[str, object]] = [
        {
            "document": doc(k),
            "right_summary": f"The council approved project 3 in {1903 + k}.",
            "hallucinated_summary": f"The council rejected project 3 in {1803 + k}.",
        }
        for k in range(docs)
    ]
    _jsonl(halueval / "summarization_train.jsonl", summaries)
    dialogue: list[dict[str, object]] = [
        {
            "knowledge": doc(k)[:300],
            "dialogue_history": f"[Human]: When did council {k} approve project 0?",
            "right_response": f"It approved it in {1900 + k}.",
            "hallucinated_response": f"It approved it in {2900 + k}.",
        }
        for k in range(docs)
    ]
    _jsonl(halueval / "dialogue_train.jsonl", dialogue)
    nq = root / "nq-open"
    nq.mkdir()
    with gzip.open(nq / "nq-open-oracle.dev.jsonl.gz", "wt", encoding="utf-8") as handle:
        for k in range(docs):
            row = {
                "question": f"when did council {k} approve project 2",
                "answers": [str(1902 + k)],
                "ctxs": [{"title": f"Council {k}", "text": doc(k)}],
            }
            handle.write(json.dumps(row) + "\n")
    grounding = root / "grounding"
    edits = grounding / "summedits" / "data"
    edits.mkdir(parents=True)
    rows = [
        {"doc": doc(k), "summary": f"Project 5 was approved in {1905 + k}.", "label": str(j)}
        for k in range(docs)
        for j in (0, 1)
    ]
    (edits / "summedits_news.json").write_text(json.dumps(rows), encoding="utf-8")
    facts = grounding / "factcheckgpt" / "subtasks"
    facts.mkdir(parents=True)
    stances = ["completely-support", "refute"]
    _jsonl(
        facts / "subtask3_claim_evidence_stance.jsonl",
        [
            {"claim": f"Council {k} approved project 1.", "evidence": doc(k), "stance": s}
            for k in range(docs)
            for s in stances
        ],
    )
    begin = grounding / "begin" / "wow"
    begin.mkdir(parents=True)
    header = "model_name\tdata_source\tknowledge\tmessage\tresponse\tbegin_label\n"
    lines = [
        f"t5\twow\t{doc(k)}\twhen?\tIt was in {1904 + k + 500 * j}.\t"
        + ("Fully attributable" if j == 0 else "Not fully attributable")
        + "\n"
        for k in range(docs)
        for j in (0, 1)
    ]
    (begin / "begin_dev_wow.tsv").write_text(header + "".join(lines), encoding="utf-8")
    return root


def test_form_sets_are_the_corpus_sets_before_their_evidence_is_windowed(tmp_path: Path) -> None:
    config = CorpusConfig(_tiny_data_dir(tmp_path / "data"), window_chars=200)
    corpus = build_corpus(config)
    test = form_sets(config, "test")
    assert set(test) == set(FORMS)
    for form in FORMS:  # the same pairs; only the evidence is whole
        assert corpus.test[form], form
        assert windowed(test[form], config.window_chars) == corpus.test[form], form
    assert any(len(p.evidence) > config.window_chars for p in test["summaries"])
    lines = (tmp_path / "data" / "halueval" / "summarization_train.jsonl").read_text("utf-8")
    documents = {json.loads(line)["document"] for line in lines.splitlines()}
    assert {p.evidence for p in test["summaries"]} <= documents
    val = form_sets(config, "val", [SOURCE_FORM[s] for s in ALL_SOURCES[2:]])
    grounding = [p for form in val.values() for p in windowed(form, config.window_chars)]
    assert grounding and corpus.val[-len(grounding) :] == grounding  # the corpus's val tail
    with pytest.raises(ConfigError, match="unknown: essays"):
        form_sets(config, "val", ["qa", "essays"])
