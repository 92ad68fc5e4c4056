"""The leakage-probe result: the artifact that gives the coverage bound its delta.

Written by ``guardrail probe leakage`` (the lab, ``sidecar/lab/report/probe.py``) and
read by the serving sidecar, which only needs this file: the format, its
validation and :func:`load_probe`.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sidecar.exceptions import ConfigError
from sidecar.stats.intervals import ProportionInterval, wilson_interval

__all__ = [
    "ABSTENTION_RULE",
    "CONFIDENCE",
    "MAX_EXAMPLES",
    "PROBE_FORMAT",
    "LeakageProbeResult",
    "ProbeExample",
    "ProbeLabel",
    "load_probe",
]

PROBE_FORMAT: Final = "leakage-probe/1"
MAX_EXAMPLES: Final = 20
"""Examples kept in a result (the first ones, in question order)."""
CONFIDENCE: Final = 0.95

ABSTENTION_RULE: Final = "phrases/1"
"""Bump when the lab's abstention phrases or rule change: results record it."""

ProbeLabel = Literal["abstention", "correct", "error"]


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
    label: str = "nq-open normalised gold answer contained in the answer, on word boundaries"
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
