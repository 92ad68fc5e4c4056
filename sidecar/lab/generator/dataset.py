"""``guardrail dataset lookback``: run the RAG loop for real and record eqs. 7-9.

For each question of the chosen part (in file order, ``--limit`` first ones):
retrieve the top K chunks, prompt SmolLM2 with them in retrieval order, decode
greedily (at most ``max_new_tokens``), keep the chunk-wise (cw) and full-context
(fc) lookback ratios, the mean token log-probability and the NQ-open label.
Rows are committed in shards (:mod:`sidecar.lab.lookback.dataset`); running the
same command again skips every question already committed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sidecar.hashing import sha256_file
from sidecar.lab.generator.prompt import PROMPT_TEMPLATE_VERSION
from sidecar.lab.generator.rag import RagAnswer, RagLoop
from sidecar.lab.lookback.dataset import (
    EVAL_FRACTION,
    LOOKBACK_SPLIT_SEED,
    LookbackDatasetMeta,
    Part,
    ShardRows,
    ShardWriter,
)
from sidecar.lab.retrieval.corpus import QARecord

__all__ = ["STEP_CONVENTION", "BuildReport", "build_dataset", "dataset_meta"]

log = logging.getLogger(__name__)

STEP_CONVENTION = "produce-token/v1"
"""Step t = the forward pass producing y_t; EOS step counted only for an empty answer
(see :mod:`sidecar.lab.generator.lookback`)."""


def dataset_meta(loop: RagLoop, questions_file: str | Path, part: Part) -> LookbackDatasetMeta:
    """The metadata of a dataset built by ``loop`` from ``questions_file``."""
    corpus = loop.corpus
    if corpus is None:
        raise ValueError("the RAG loop was built without its corpus")
    summariser = loop.generator.summariser
    return LookbackDatasetMeta(
        generator_model=loop.generator.generator_id,
        layers=summariser.layers,
        heads=summariser.heads,
        k=loop.k,
        prompt_template=PROMPT_TEMPLATE_VERSION,
        max_new_tokens=loop.max_new_tokens,
        step_convention=STEP_CONVENTION,
        embedder=loop.embedder.model_id,
        chunk_words=corpus.chunk_words,
        corpus_fingerprint=corpus.fingerprint,
        questions_file=str(questions_file),
        questions_sha256=sha256_file(questions_file),
        part=part,
        split_seed=LOOKBACK_SPLIT_SEED,
        eval_fraction=EVAL_FRACTION,
    )


class BuildReport:
    """Counts of one build run."""

    def __init__(self) -> None:
        self.skipped = 0
        self.processed = 0
        self.correct = 0
        self.seconds = 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "skipped": self.skipped,
            "processed": self.processed,
            "correct": self.correct,
            "seconds_per_question": self.seconds / self.processed if self.processed else 0.0,
        }


def _rows(answers: Sequence[RagAnswer]) -> ShardRows:
    return ShardRows(
        qid=np.array([a.record.index for a in answers], dtype=np.int64),
        label=np.array([int(a.correct) for a in answers], dtype=np.int8),
        cw=np.stack([a.generated.trace.summary("cw").to_array() for a in answers]).astype(
            np.float16
        ),
        fc=np.stack([a.generated.trace.summary("fc").to_array()[..., 0] for a in answers]).astype(
            np.float16
        ),
        logprob=np.array([a.generated.trace.mean_token_logprob for a in answers]),
        steps=np.array([a.generated.trace.steps for a in answers], dtype=np.int32),
    )


def build_dataset(
    loop: RagLoop,
    questions: Sequence[QARecord],
    writer: ShardWriter,
    *,
    shard_size: int = 20,
    progress: bool = False,
) -> BuildReport:
    """Answer every question of ``questions`` not yet in ``writer``'s directory."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    report = BuildReport()
    done = writer.done_qids()
    todo = [q for q in questions if q.index not in done]
    report.skipped = len(questions) - len(todo)
    if report.skipped:
        log.info("resuming: %d of %d questions already recorded", report.skipped, len(questions))
    hits = loop.retrieve(todo, progress=progress)
    buffer: list[RagAnswer] = []
    bar = tqdm(total=len(todo), desc="lookback dataset", unit="q", disable=not progress)
    try:
        for record, row in zip(todo, hits, strict=True):
            answer = loop.answer(record, row)
            buffer.append(answer)
            report.processed += 1
            report.correct += int(answer.correct)
            report.seconds += answer.seconds
            bar.update(1)
            bar.set_postfix(correct=f"{report.correct / report.processed:.2f}")
            if len(buffer) >= shard_size:
                writer.write(_rows(buffer), [a.to_record() for a in buffer])
                buffer = []
    finally:
        # Finished rows are complete: keep them even when interrupted (Ctrl-C, a crash).
        if buffer:
            writer.write(_rows(buffer), [a.to_record() for a in buffer])
        bar.close()
    return report
