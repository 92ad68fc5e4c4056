"""In-domain verifier pairs from the sidecar's own outcomes (SmolLM2 answers to NQ-open).

``guardrail eval report`` rows (``rows.jsonl``, :mod:`sidecar.lab.report.collect`)
hold a question, its NQ-open gold answers, the generator's answer, the NQ-open
label (``correct``: a normalised gold answer is contained in the answer) and
the retrieval with the certification's trusted chunks. The lookback dataset
(``out/lookback/<name>/shards/*.jsonl``) holds the same for more questions,
without chunk texts or trusted ids: texts come from the rebuilt corpus, trust
from the raw-score cut-off the certification applied on outcome rows.

Pairs are built as the sidecar checks an answer:

* each answer is cut by the production segmenter (:func:`segment_claims`);
* evidence is selected by the production selector
  (:class:`~sidecar.claims.evidence.EvidenceIndex`, 3 sentences / 450 chars)
  from the trusted chunks (all retrieved chunks when none is trusted); every
  claim gives one pair with the sentence window and, when it fits, one with the
  best chunk as a whole (the checker scores both and keeps the higher);
* labels (``correct`` is the NQ-open label of the whole answer):

  ==============  =====  ==================================================
  kind            label  claim
  ==============  =====  ==================================================
  ``nq-correct``    1    a claim of a correct answer that contains a gold
                         answer string (NQ-open normalisation)
  ``nq-wrong``      0    a claim of a wrong answer carrying answer content
  ``nq-swap``       0    an ``nq-correct`` claim with its gold answer replaced
                         by another question's answer of the same word count
                         (and digits iff the gold has digits)
  ==============  =====  ==================================================

  Dropped (documented, counted by :func:`outcome_pairs`): claims with no
  answer content (every content word already in the question, e.g. "The
  French immigrants settled in Texas." - a non-answer, not a checkable
  statement) and claims of a correct answer without the gold string (their
  truth is unknown).
* **length**: wrong answers are longer than right ones, so the ``nq-wrong``
  and ``nq-correct`` claims are subsampled per claim-length bin to equal
  counts (seeded); ``nq-swap`` claims have their positive's length. The
  length-only AUROC of the result is reported by the trainer.

Reading is offline tooling (never serving); pair building is pure.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex, content_terms
from sidecar.claims.segment import segment_claims
from sidecar.exceptions import InputError
from sidecar.lab.answers import normalize_answer
from sidecar.lab.verifier.jsonl import iter_json_objects
from sidecar.lab.verifier.sources import Pair

__all__ = [
    "OutcomeRecord",
    "gold_in",
    "labelled_claims",
    "outcome_pairs",
    "read_lookback",
    "read_outcome_rows",
    "trust_cutoff",
]

ROWS_FILE: Final = "rows.jsonl"
SOURCE: Final = "nq-outcomes"
_LENGTH_BIN: Final = 16  # characters per claim-length bin for the length balance


@dataclass(frozen=True, slots=True)
class OutcomeRecord:
    """One generated answer with its label and the chunks the checker would read."""

    qid: int
    question: str
    answers: tuple[str, ...]
    answer: str
    correct: bool
    chunks: tuple[EvidenceChunk, ...]


def gold_in(text: str, answers: Sequence[str]) -> bool:
    """NQ-open containment (as ``correct`` was computed): a normalised gold is in ``text``."""
    norm = f" {normalize_answer(text)} "
    return any((a := normalize_answer(g)) and f" {a} " in norm for g in answers if g.strip())


def _rows_path(path: Path) -> Path:
    return path / ROWS_FILE if path.is_dir() else path


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    return [obj for _, obj in iter_json_objects(path)]


def _record(row: dict[str, Any], chunks: Sequence[EvidenceChunk]) -> OutcomeRecord:
    """An outcome row's question, answers and label with the evidence chosen for it."""
    return OutcomeRecord(
        qid=int(row["qid"]),
        question=str(row["question"]),
        answers=tuple(str(a) for a in row["answers"]),
        answer=str(row["answer"]),
        correct=bool(row["correct"]),
        chunks=tuple(chunks),
    )


def read_outcome_rows(path: Path) -> list[OutcomeRecord]:
    """Report rows: evidence = the trusted hits of the row's certification, else all hits."""
    out: list[OutcomeRecord] = []
    for row in _load_jsonl(_rows_path(path)):
        hits = row["retrieval"]["hits"]
        signal = (row.get("verdict") or {}).get("signals", {}).get("retrieval") or {}
        trusted = set(signal.get("trusted_chunk_ids") or [])
        ok = signal.get("status") == "ok"
        chosen = [h for h in hits if ok and h["chunk_id"] in trusted] or list(hits)
        chunks = [EvidenceChunk(str(h["chunk_id"]), str(h["text"])) for h in chosen]
        out.append(_record(row, chunks))
    return out


def trust_cutoff(path: Path) -> float:
    """The raw retrieval score from which the certification trusted a hit on these rows.

    The midpoint between the highest untrusted and the lowest trusted raw score
    (one calibration, so one cut-off); raises when the rows are inconsistent.
    """
    trusted: list[float] = []
    untrusted: list[float] = []
    for row in _load_jsonl(_rows_path(path)):
        ids = set(row["verdict"]["signals"]["retrieval"]["trusted_chunk_ids"])
        for h in row["retrieval"]["hits"]:
            (trusted if h["chunk_id"] in ids else untrusted).append(float(h["score"]))
    if not trusted or not untrusted or min(trusted) <= max(untrusted):
        raise InputError("schema-violation", f"{path}: no single trust cut-off on raw scores")
    return (min(trusted) + max(untrusted)) / 2


def read_lookback(
    shards: Path, texts: dict[str, str], cutoff: float, exclude: Iterable[str] = ()
) -> list[OutcomeRecord]:
    """Lookback shards: chunk texts from ``texts``, trusted = raw score >= ``cutoff``."""
    skip = {q.strip().lower() for q in exclude}
    out: list[OutcomeRecord] = []
    for path in sorted(shards.glob("*.jsonl")):
        for row in _load_jsonl(path):
            if str(row["question"]).strip().lower() in skip:
                continue
            ids = [str(c) for c in row["chunk_ids"]]
            missing = [c for c in ids if c not in texts]
            if missing:
                raise InputError("schema-violation", f"{path}: unknown chunk ids {missing[:3]}")
            scored = list(zip(ids, (float(s) for s in row["scores"]), strict=True))
            chosen = [c for c, s in scored if s >= cutoff] or ids
            out.append(_record(row, [EvidenceChunk(c, texts[c]) for c in chosen]))
    return out


def _answer_content(claim: str, question: str) -> bool:
    return bool(set(content_terms(claim)) - set(content_terms(question)))


def _gold_span(claim: str, answers: Sequence[str]) -> str | None:
    """The longest gold answer found verbatim (case-insensitive) in ``claim``."""
    for gold in sorted((a.strip() for a in answers if a.strip()), key=len, reverse=True):
        if re.search(rf"(?<!\w){re.escape(gold)}(?!\w)", claim, re.IGNORECASE):
            return gold
    return None


def _swap(claim: str, gold: str, pool: dict[tuple[int, bool], list[str]], rng: random.Random,
          answers: Sequence[str]) -> str | None:  # fmt: skip
    key = (len(gold.split()), any(ch.isdigit() for ch in gold))
    cands = [
        a
        for a in pool.get(key, [])
        if not gold_in(a, answers) and normalize_answer(a) not in normalize_answer(claim)
    ]
    if not cands:
        return None
    other = rng.choice(cands)
    pattern = re.compile(rf"(?<!\w){re.escape(gold)}(?!\w)", re.IGNORECASE)
    return pattern.sub(lambda _m: other, claim, count=1)


@dataclass(frozen=True, slots=True)
class _Labelled:
    claim: str
    label: int
    kind: str
    record: OutcomeRecord
    gold: str | None


def labelled_claims(records: Sequence[OutcomeRecord]) -> tuple[list[_Labelled], dict[str, int]]:
    """The labelled claims of ``records`` (no swaps, no balance) and the drop counts."""
    out: list[_Labelled] = []
    dropped = {"no-answer-content": 0, "correct-without-gold": 0, "no-claims": 0}
    for r in records:
        claims = segment_claims(r.answer)
        if not claims:
            dropped["no-claims"] += 1
        for c in claims:
            if not _answer_content(c.text, r.question):
                dropped["no-answer-content"] += 1
            elif r.correct:
                gold = _gold_span(c.text, r.answers)
                if gold is None or not gold_in(c.text, r.answers):
                    dropped["correct-without-gold"] += 1
                else:
                    out.append(_Labelled(c.text, 1, "nq-correct", r, gold))
            else:
                out.append(_Labelled(c.text, 0, "nq-wrong", r, None))
    return out, dropped


def _pairs(item: _Labelled, claim: str, label: int, kind: str) -> list[Pair]:
    index = EvidenceIndex(item.record.chunks)
    group = item.record.question
    sel = index.select(claim, group)
    out = [Pair(claim, sel.window, label, kind, SOURCE, group, group)]
    if sel.best_chunk is not None:
        out.append(Pair(claim, sel.best_chunk, label, kind, SOURCE, group, group))
    return out


def _balance(items: list[_Labelled], rng: random.Random) -> list[_Labelled]:
    """Equal positives and negatives in every claim-length bin (seeded subsample)."""
    bins: dict[int, tuple[list[_Labelled], list[_Labelled]]] = defaultdict(lambda: ([], []))
    for item in items:
        bins[len(item.claim) // _LENGTH_BIN][item.label].append(item)
    kept: list[_Labelled] = []
    for key in sorted(bins):
        neg, pos = bins[key]
        n = min(len(neg), len(pos))
        kept.extend(rng.sample(neg, n) + rng.sample(pos, n))
    return kept


def outcome_pairs(
    records: Sequence[OutcomeRecord],
    *,
    seed: int = 0,
    swap: bool = True,
    balance: bool = True,
    answer_pool: Sequence[str] = (),
) -> tuple[list[Pair], dict[str, int]]:
    """Training / evaluation pairs of ``records`` and counts (kept per kind, dropped).

    ``balance`` subsamples ``nq-wrong`` and ``nq-correct`` to equal counts per
    claim-length bin; ``swap`` adds one ``nq-swap`` negative per kept positive
    where a replacement exists (answers of ``answer_pool``, default: the gold
    answers of ``records``).
    """
    rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
    items, counts = labelled_claims(records)
    if balance:
        items = _balance(items, rng)
    pool: dict[tuple[int, bool], list[str]] = defaultdict(list)
    for a in answer_pool or [a for r in records for a in r.answers[:1]]:
        if a.strip():
            pool[(len(a.split()), any(ch.isdigit() for ch in a))].append(a.strip())
    pairs: list[Pair] = []
    for item in items:
        pairs.extend(_pairs(item, item.claim, item.label, item.kind))
        counts[item.kind] = counts.get(item.kind, 0) + 1
        if swap and item.label == 1 and item.gold is not None:
            swapped = _swap(item.claim, item.gold, pool, rng, item.record.answers)
            if swapped is not None and swapped != item.claim:
                pairs.extend(_pairs(item, swapped, 0, "nq-swap"))
                counts["nq-swap"] = counts.get("nq-swap", 0) + 1
    rng.shuffle(pairs)
    return pairs, counts
