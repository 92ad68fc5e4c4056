"""The calibrated leakage probe: how often the generator guesses wrong.

The method: docs/methods.md §Coverage bound.

Assumption A2 of the coverage bound says that when the retrieved context holds
no evidence for the answer, the generator hallucinates with probability at
most delta. ``estimate_delta`` measures it: for each question, retrieve the
``candidates`` best chunks, drop every chunk that comes from a gold passage
(``doc_id`` in the question's gold document ids) or whose title or text
contains a gold answer (NQ-open normalisation, on word boundaries), keep the
best ``k`` that remain (best first, the prompt shape the generator sees in
deployment) and let the generator answer. Each answer is one of

* an **abstention** (:func:`is_abstention`: an explicit refusal, "I don't
  know", "not mentioned in the documents", an empty answer ...);
* **correct from memory** (a gold answer is in the answer, NQ-open
  normalisation on word boundaries, although no chunk contained it: the model
  knew it, which is not a hallucination);
* else an **error**: a confident wrong answer, a hallucination.

``delta = errors / trials`` with a Wilson 95% interval. A question whose
candidates leave fewer than ``k`` answer-free chunks is skipped (counted in
``skipped``), so every trial shows the generator exactly ``k`` chunks.

The loop is anything shaped like :class:`sidecar.lab.generator.rag.RagLoop`
(:class:`ProbeLoop`), so tests run with fakes and without torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt
from tqdm.auto import tqdm

from sidecar.confidence.probe_result import (
    ABSTENTION_RULE,
    CONFIDENCE,
    MAX_EXAMPLES,
    PROBE_FORMAT,
    LeakageProbeResult,
    ProbeExample,
    ProbeLabel,
    load_probe,
)
from sidecar.exceptions import ConfigError
from sidecar.lab.report.collect import contains_answer
from sidecar.lab.retrieval.corpus import QARecord
from sidecar.lab.retrieval.embedder import Embedder
from sidecar.lab.retrieval.qdrant import Hit
from sidecar.stats.intervals import wilson_interval

__all__ = [
    "ABSTENTION_PHRASES",
    "ABSTENTION_RULE",
    "MAX_EXAMPLES",
    "PROBE_FORMAT",
    "LeakageProbeResult",
    "ProbeExample",
    "ProbeLabel",
    "ProbeLoop",
    "answer_free_context",
    "classify",
    "is_abstention",
    "load_probe",
    "run_leakage_probe",
    "write_probe",
]

ABSTENTION_PHRASES: Final[tuple[str, ...]] = (
    # not knowing
    "i don't know",
    "i do not know",
    "i dont know",
    "i'm not sure",
    "i am not sure",
    "no idea",
    # refusing or failing to answer
    "i cannot answer",
    "i can't answer",
    "i'm unable to",
    "i am unable to",
    "unable to answer",
    "unable to determine",
    "unable to find",
    "cannot be answered",
    "can't be answered",
    "cannot be determined",
    "can't be determined",
    "cannot determine",
    "can't determine",
    "i'm sorry",
    "i am sorry",
    "i apologize",
    # the context does not have it
    "not mentioned",
    "not provided",
    "not specified",
    "not stated",
    "not included",
    "not found in",
    "no mention",
    "does not mention",
    "doesn't mention",
    "do not mention",
    "don't mention",
    "does not say",
    "doesn't say",
    "does not specify",
    "doesn't specify",
    "does not provide",
    "doesn't provide",
    "do not provide",
    "don't provide",
    "does not contain",
    "doesn't contain",
    "do not contain",
    "don't contain",
    "no information",
    "not enough information",
    "insufficient information",
    "there is no answer",
)
"""Lower-case phrases that mark an answer as an abstention (matched on word boundaries).

Chosen for short instruction-tuned models such as SmolLM2, which refuse in
sentences ("I'm sorry, but the documents do not mention ..."). Curly
apostrophes are read as straight ones. A bare "no" or "unknown" is *not* an
abstention: both are legitimate short answers.
"""

_ABSTENTION = re.compile(
    r"(?<![\w'])(?:" + "|".join(re.escape(p) for p in ABSTENTION_PHRASES) + r")(?![\w'])"
)


def is_abstention(text: str) -> bool:
    """Whether ``text`` is empty or contains one of :data:`ABSTENTION_PHRASES` (any case)."""
    norm = " ".join(text.lower().replace("\u2019", "'").replace("\u2018", "'").split())
    return not norm or _ABSTENTION.search(norm) is not None


def classify(text: str, answers: Iterable[str]) -> ProbeLabel:
    """``abstention``, else ``correct`` (known from memory), else ``error``.

    ``correct``: a normalised gold answer occurs in the normalised answer on word
    boundaries (the test that drops answer-bearing chunks). The plain NQ-open
    substring test would take "Mayflower" for gold "May" and "1918" for "1": every
    such answer counted as known lowers delta, and the bound with it.
    """
    if is_abstention(text):
        return "abstention"
    return "correct" if contains_answer(text, list(answers)) else "error"


def answer_free_context(
    record: QARecord, hits: Sequence[Hit], k: int
) -> tuple[tuple[Hit, ...], int, int]:
    """The best ``k`` hits that neither come from a gold passage nor contain a gold answer.

    ``hits`` must be best first. Returns the kept hits (best first, at most
    ``k``), the number dropped for being from a gold passage and the number
    dropped for containing a gold answer (in the title or the text).
    """
    kept: list[Hit] = []
    dropped_gold = dropped_answer = 0
    for hit in hits:
        if hit.doc_id in record.gold_doc_ids:
            dropped_gold += 1
        elif contains_answer(hit.text, record.answers) or contains_answer(
            hit.title, record.answers
        ):
            dropped_answer += 1
        elif len(kept) < k:
            kept.append(hit)
    return tuple(kept), dropped_gold, dropped_answer


class _Generator(Protocol):
    @property
    def generator_id(self) -> str: ...


class _Index(Protocol):
    def search(
        self, queries: npt.NDArray[np.float32], top_k: int, *, progress: bool = False
    ) -> list[list[Hit]]: ...


class _Corpus(Protocol):
    @property
    def fingerprint(self) -> str: ...


class _Generated(Protocol):
    @property
    def text(self) -> str: ...


class _Answer(Protocol):
    @property
    def generated(self) -> _Generated: ...

    @property
    def seconds(self) -> float: ...


class ProbeLoop(Protocol):
    """What the probe needs of :class:`sidecar.lab.generator.rag.RagLoop`."""

    @property
    def generator(self) -> _Generator: ...

    @property
    def embedder(self) -> Embedder: ...

    @property
    def index(self) -> _Index: ...

    @property
    def corpus(self) -> _Corpus | None: ...

    @property
    def max_new_tokens(self) -> int: ...

    def answer(self, record: QARecord, hits: Sequence[Hit]) -> _Answer: ...


def run_leakage_probe(
    loop: ProbeLoop,
    questions: Sequence[QARecord],
    *,
    k: int,
    candidates: int = 20,
    progress: bool = False,
    questions_file: str | Path | None = None,
    questions_sha256: str | None = None,
    part: str | None = None,
) -> LeakageProbeResult:
    """Estimate delta on ``questions`` with answer-free contexts of ``k`` chunks."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if candidates < k:
        raise ConfigError(f"candidates must be >= k ({k}), got {candidates}")
    if not questions:
        raise ConfigError("the leakage probe needs at least one question")
    vectors = loop.embedder.embed(
        [q.question for q in questions], progress=progress, desc="embed questions"
    )
    rows = loop.index.search(vectors, candidates, progress=progress)
    if len(rows) != len(questions):
        raise ConfigError(
            f"the index returned {len(rows)} hit lists for {len(questions)} questions"
        )
    counts: dict[ProbeLabel, int] = {"abstention": 0, "correct": 0, "error": 0}
    skipped = dropped_gold = dropped_answer = 0
    seconds: list[float] = []
    examples: list[ProbeExample] = []
    pairs = list(zip(questions, rows, strict=True))
    for record, row in tqdm(pairs, desc="leakage probe", unit="question", disable=not progress):
        ranked = sorted(row, key=lambda h: -h.score)
        kept, n_gold, n_answer = answer_free_context(record, ranked, k)
        dropped_gold += n_gold
        dropped_answer += n_answer
        if len(kept) < k:
            skipped += 1
            continue
        answer = loop.answer(record, kept)
        text = answer.generated.text
        label = classify(text, record.answers)
        counts[label] += 1
        seconds.append(answer.seconds)
        if len(examples) < MAX_EXAMPLES:
            examples.append(
                ProbeExample(
                    qid=record.index,
                    question=record.question,
                    gold=record.answers,
                    answer=text,
                    label=label,
                    chunk_ids=tuple(h.chunk_id for h in kept),
                )
            )
    trials = len(seconds)
    interval = wilson_interval(counts["error"], trials, CONFIDENCE)
    corpus = loop.corpus
    return LeakageProbeResult(
        generator_model=loop.generator.generator_id,
        embedder=loop.embedder.model_id,
        k=k,
        candidates=candidates,
        max_new_tokens=loop.max_new_tokens,
        corpus_fingerprint=corpus.fingerprint if corpus is not None else None,
        questions_file=str(questions_file) if questions_file is not None else None,
        questions_sha256=questions_sha256,
        part=part,
        questions=len(questions),
        skipped=skipped,
        trials=trials,
        abstentions=counts["abstention"],
        correct_from_memory=counts["correct"],
        errors=counts["error"],
        delta=interval.estimate if trials else None,
        confidence=CONFIDENCE,
        delta_low=interval.low,
        delta_high=interval.high,
        dropped_gold_chunks=dropped_gold,
        dropped_answer_chunks=dropped_answer,
        seconds_per_question=sum(seconds) / trials if trials else 0.0,
        examples=tuple(examples),
        created_at=datetime.now(UTC),
    )


def write_probe(result: LeakageProbeResult, path: str | Path) -> None:
    """Write ``result`` as indented JSON (parent directories created)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n", "utf-8")
