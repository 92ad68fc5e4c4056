"""The calibrated leakage probe of seed 003 section 4.2: how often the generator guesses wrong.

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
* **correct from memory** (the NQ-open label :func:`~sidecar.lookback.labels.is_correct`
  holds although no chunk contained the answer: the model knew it, which is
  not a hallucination);
* else an **error**: a confident wrong answer, a hallucination.

``delta = errors / trials`` with a Wilson 95% interval. A question whose
candidates leave fewer than ``k`` answer-free chunks is skipped (counted in
``skipped``), so every trial shows the generator exactly ``k`` chunks.

The loop is anything shaped like :class:`sidecar.generator.rag.RagLoop`
(:class:`ProbeLoop`), so tests run with fakes and without torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tqdm.auto import tqdm

from sidecar.exceptions import ConfigError
from sidecar.lookback.labels import is_correct
from sidecar.report.collect import contains_answer
from sidecar.retrieval.corpus import QARecord
from sidecar.retrieval.embedder import Embedder
from sidecar.retrieval.qdrant import Hit
from sidecar.stats.intervals import ProportionInterval, wilson_interval

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

PROBE_FORMAT: Final = "leakage-probe/1"
MAX_EXAMPLES: Final = 20
"""Examples kept in a result (the first ones, in question order)."""
CONFIDENCE: Final = 0.95

ABSTENTION_RULE: Final = "phrases/1"
"""Bump when :data:`ABSTENTION_PHRASES` or :func:`is_abstention` changes: results record it."""

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

ProbeLabel = Literal["abstention", "correct", "error"]


def is_abstention(text: str) -> bool:
    """Whether ``text`` is empty or contains one of :data:`ABSTENTION_PHRASES` (any case)."""
    norm = " ".join(text.lower().replace("\u2019", "'").replace("\u2018", "'").split())
    return not norm or _ABSTENTION.search(norm) is not None


def classify(text: str, answers: Iterable[str]) -> ProbeLabel:
    """``abstention``, else ``correct`` (NQ-open label: known from memory), else ``error``."""
    if is_abstention(text):
        return "abstention"
    return "correct" if is_correct(text, answers) else "error"


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


class ProbeExample(BaseModel):
    """One probed question, as a result shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    qid: int
    question: str
    gold: tuple[str, ...]
    answer: str
    label: ProbeLabel
    chunk_ids: tuple[str, ...]


class LeakageProbeResult(BaseModel):
    """delta with its interval, the counts behind it and what produced them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["leakage-probe/1"] = PROBE_FORMAT
    generator_model: str
    embedder: str
    k: int = Field(ge=1, description="answer-free chunks in every prompt")
    candidates: int = Field(ge=1, description="chunks retrieved before the gold ones are dropped")
    max_new_tokens: int = Field(ge=1)
    corpus_fingerprint: str | None = None
    questions_file: str | None = None
    questions_sha256: str | None = None
    part: str | None = None
    abstention_rule: str = ABSTENTION_RULE
    label: str = "nq-open normalised gold answer contained in the answer"
    questions: int = Field(ge=0, description="questions asked for: trials + skipped")
    skipped: int = Field(ge=0, description="questions with fewer than k answer-free candidates")
    trials: int = Field(ge=0)
    abstentions: int = Field(ge=0)
    correct_from_memory: int = Field(ge=0)
    errors: int = Field(ge=0, description="confident wrong answers: hallucinations")
    delta: float | None = Field(description="errors / trials (None without trials)")
    confidence: float = CONFIDENCE
    delta_low: float = Field(ge=0.0, le=1.0)
    delta_high: float = Field(ge=0.0, le=1.0)
    dropped_gold_chunks: int = Field(ge=0)
    dropped_answer_chunks: int = Field(ge=0)
    seconds_per_question: float = Field(ge=0.0, description="mean generation time per trial")
    examples: tuple[ProbeExample, ...] = Field(default=(), max_length=MAX_EXAMPLES)
    created_at: datetime | None = None

    @model_validator(mode="after")
    def _counts_add_up(self) -> Self:
        if self.abstentions + self.correct_from_memory + self.errors != self.trials:
            raise ValueError(
                f"abstentions + correct_from_memory + errors must equal trials ({self.trials}), "
                f"got {self.abstentions} + {self.correct_from_memory} + {self.errors}"
            )
        if self.trials + self.skipped != self.questions:
            raise ValueError(
                f"trials + skipped must equal questions ({self.questions}), "
                f"got {self.trials} + {self.skipped}"
            )
        if self.candidates < self.k:
            raise ValueError(f"candidates must be >= k ({self.k}), got {self.candidates}")
        return self

    @property
    def interval(self) -> ProportionInterval:
        """The Wilson interval of delta, recomputed from the counts."""
        return wilson_interval(self.errors, self.trials, self.confidence)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this result."""
        return self.model_dump(mode="json")

    def summary(self) -> str:
        """One line for a terminal."""
        delta = "n/a" if self.delta is None else f"{self.delta:.3f}"
        return (
            f"leakage probe {self.generator_model}: delta={delta} "
            f"[{self.delta_low:.3f}, {self.delta_high:.3f}] ({self.confidence:.0%} Wilson), "
            f"errors={self.errors} abstentions={self.abstentions} "
            f"correct_from_memory={self.correct_from_memory} trials={self.trials} "
            f"skipped={self.skipped} k={self.k} candidates={self.candidates} "
            f"{self.seconds_per_question:.2f}s/question"
        )


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
    """What the probe needs of :class:`sidecar.generator.rag.RagLoop`."""

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


def load_probe(path: str | Path) -> LeakageProbeResult:
    """Read a result written by :func:`write_probe`; :class:`ConfigError` if it is not one."""
    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"leakage probe result {source} does not exist")
    try:
        data = json.loads(source.read_text("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{source} is not a leakage probe result: not JSON ({exc})") from exc
    found = data.get("format") if isinstance(data, dict) else None
    if found != PROBE_FORMAT:
        raise ConfigError(
            f"{source} is not a leakage probe result: format {found!r}, expected {PROBE_FORMAT!r} "
            "(write one with 'guardrail probe leakage')"
        )
    try:
        return LeakageProbeResult.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source} is not a valid {PROBE_FORMAT} result: {exc}") from exc
