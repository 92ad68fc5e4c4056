"""In-domain verifier pairs from report rows (sidecar.lab.verifier.outcomes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.claims.evidence import EvidenceChunk
from sidecar.exceptions import InputError
from sidecar.lab.verifier.datasets import length_auroc
from sidecar.lab.verifier.outcomes import (
    OutcomeRecord,
    gold_in,
    labelled_claims,
    outcome_pairs,
    read_lookback,
    read_outcome_rows,
    trust_cutoff,
)

PASSAGE = (
    "The Eiffel Tower was completed in 1889 in Paris. It was designed by the engineering "
    "company of Gustave Eiffel. The tower is 330 metres tall."
)


def _record(
    qid: int, question: str, answers: tuple[str, ...], answer: str, correct: bool
) -> OutcomeRecord:
    return OutcomeRecord(
        qid, question, answers, answer, correct, (EvidenceChunk(f"c{qid}", PASSAGE),)
    )


def _row(
    qid: int, trusted: list[str], scores: list[float], answer: str = "It is Paris."
) -> dict[str, Any]:
    hits = [
        {"chunk_id": f"k{j}", "doc_id": "d", "score": s, "text": f"text {j} about Paris."}
        for j, s in enumerate(scores)
    ]
    return {
        "qid": qid,
        "question": f"question {qid}",
        "answers": ["Paris"],
        "answer": answer,
        "correct": True,
        "retrieval": {"hits": hits},
        "verdict": {"signals": {"retrieval": {"status": "ok", "trusted_chunk_ids": trusted}}},
    }


def test_gold_in_uses_nq_normalisation() -> None:
    assert gold_in("It was finished in 1889.", ["1889"])
    assert gold_in("The answer is the Beatles!", ["Beatles"])
    assert not gold_in("It was finished in 18890.", ["1889"])


def test_labels_and_drops() -> None:
    records = [
        _record(
            1, "when was the eiffel tower completed", ("1889",), "It was completed in 1889.", True
        ),
        _record(
            2,
            "who designed the eiffel tower",
            ("Gustave Eiffel",),
            "Pierre Curie designed it.",
            False,
        ),
        _record(
            3,
            "when was the eiffel tower completed",
            ("1889",),
            "The Eiffel Tower was completed.",
            False,
        ),
        _record(
            4, "how tall is the eiffel tower", ("330 metres",), "It is very tall and heavy.", True
        ),
    ]
    items, dropped = labelled_claims(records)
    assert [(i.label, i.kind) for i in items] == [(1, "nq-correct"), (0, "nq-wrong")]
    assert dropped["no-answer-content"] == 1  # restates the question
    assert dropped["correct-without-gold"] == 1


def test_pairs_swap_and_balance() -> None:
    records = [
        _record(
            1, "when was the eiffel tower completed", ("1889",), "It was completed in 1889.", True
        ),
        _record(
            2,
            "who designed the eiffel tower",
            ("Gustave Eiffel",),
            "Pierre Curie designed it.",
            False,
        ),
        _record(
            3, "in which year did the tower open", ("1887",), "The tower opened in 1887.", True
        ),
        _record(4, "who built it", ("Gustave Eiffel",), "Marie Curie built the tower.", False),
    ]
    pairs, counts = outcome_pairs(records, seed=0)
    assert counts["nq-correct"] == counts["nq-wrong"]
    swaps = [p for p in pairs if p.kind == "nq-swap"]
    assert swaps and all(p.label == 0 for p in swaps)
    assert {p.claim for p in swaps} <= {"It was completed in 1887.", "The tower opened in 1889."}
    assert all(p.evidence for p in pairs)
    again, _ = outcome_pairs(records, seed=0)
    assert again == pairs  # seeded
    assert 0.0 <= length_auroc(pairs) <= 1.0


def test_read_rows_uses_trusted_chunks(tmp_path: Path) -> None:
    rows = [_row(1, ["k0"], [0.7, 0.4]), _row(2, [], [0.45, 0.4])]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    records = read_outcome_rows(tmp_path)
    assert [c.chunk_id for c in records[0].chunks] == ["k0"]
    assert [c.chunk_id for c in records[1].chunks] == ["k0", "k1"]  # none trusted: all
    assert trust_cutoff(tmp_path) == pytest.approx((0.7 + 0.45) / 2)


def test_trust_cutoff_rejects_inconsistent_rows(tmp_path: Path) -> None:
    rows = [_row(1, ["k1"], [0.7, 0.4])]
    (tmp_path / "rows.jsonl").write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(InputError):
        trust_cutoff(tmp_path)


def test_read_lookback(tmp_path: Path) -> None:
    row = {
        "qid": 5, "question": "Q five", "answers": ["Paris"], "answer": "Paris.",
        "correct": True, "chunk_ids": ["a", "b"], "scores": [0.6, 0.3],
    }  # fmt: skip
    (tmp_path / "part-00000.jsonl").write_text(json.dumps(row) + "\n")
    texts = {"a": "A text.", "b": "B text."}
    records = read_lookback(tmp_path, texts, 0.5)
    assert [c.chunk_id for c in records[0].chunks] == ["a"]
    assert read_lookback(tmp_path, texts, 0.5, exclude=["q five"]) == []
    with pytest.raises(InputError):
        read_lookback(tmp_path, {"a": "A text."}, 0.5)
