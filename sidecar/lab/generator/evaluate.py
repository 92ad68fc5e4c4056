"""``guardrail eval lookback`` live: the RAG loop on held-out questions, scored as served.

Each held-out question is retrieved, answered by SmolLM2 and turned into the
``GenerationFinal`` event a service would publish; the event is checked and
scored by :class:`~sidecar.lookback.serving.OnnxLookbackScorer` exactly as the
sidecar does (see :mod:`sidecar.lab.lookback.evaluation`, which also scores a
recorded held-out dataset without a generator).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sidecar.contracts.events import GenerationFinal
from sidecar.exceptions import ConfigError
from sidecar.hashing import sha256_file
from sidecar.lab.lookback.evaluation import NO_CERTIFICATION, check_disjoint, report
from sidecar.lab.retrieval.corpus import QARecord
from sidecar.lookback.serving import OnnxLookbackScorer

if TYPE_CHECKING:  # the RAG loop imports torch
    from sidecar.lab.generator.rag import RagAnswer, RagLoop

__all__ = ["evaluate_live", "final_event"]


def final_event(
    answer: RagAnswer, variant: str, request_id: str, generator_id: str
) -> GenerationFinal:
    """The ``GenerationFinal`` a service would publish for ``answer``."""
    trace = answer.generated.trace
    return GenerationFinal(
        request_id=request_id,
        answer=answer.generated.text,
        generator_model=generator_id,
        attention=trace.summary("fc" if variant == "fc" else "cw"),
        mean_token_logprob=trace.mean_token_logprob,
    )


def evaluate_live(
    model_dirs: Sequence[Path],
    *,
    loop_factory: Callable[[], RagLoop],
    questions_file: str | Path,
    questions: Sequence[QARecord],
    part: str,
    records_out: Path | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Answer ``questions`` once and evaluate every model in ``model_dirs`` on the answers."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    if not model_dirs:
        raise ConfigError("at least one model directory is needed")
    scorers = [OnnxLookbackScorer.from_dir(d) for d in model_dirs]
    digest = sha256_file(questions_file)
    for scorer in scorers:
        check_disjoint(scorer, digest, part)
    loop = loop_factory()
    hits = loop.retrieve(questions, progress=progress)
    labels: list[int] = []
    logprobs: list[float] = []
    probs: list[list[float]] = [[] for _ in scorers]
    score_us: list[float] = []
    gen_s: list[float] = []
    records: list[dict[str, Any]] = []
    pairs = list(zip(questions, hits, strict=True))
    for record, row in tqdm(pairs, desc="eval lookback", disable=not progress):
        answer = loop.answer(record, row)
        labels.append(int(answer.correct))
        logprobs.append(answer.generated.trace.mean_token_logprob)
        gen_s.append(answer.seconds)
        rec = answer.to_record()
        for j, scorer in enumerate(scorers):
            final = final_event(
                answer, scorer.metadata.variant, f"eval-{record.index}", loop.generator.generator_id
            )
            scorer.check(final)
            started = time.perf_counter()
            signal = scorer.score(final, NO_CERTIFICATION)
            score_us.append((time.perf_counter() - started) * 1e6)
            if signal.p_factual is None:
                raise ConfigError(f"{scorer.version} could not score question {record.index}")
            probs[j].append(signal.p_factual)
            rec[f"p_factual_{scorer.metadata.variant}"] = signal.p_factual
        records.append(rec)
    if records_out is not None:
        records_out.parent.mkdir(parents=True, exist_ok=True)
        with records_out.open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    extra = {
        "k": loop.k,
        "generation_s_per_question": float(np.mean(gen_s)) if gen_s else 0.0,
        "score_us_median": float(np.median(score_us)) if score_us else 0.0,
    }
    return [
        report(scorer, p, labels, part=part, source="live", mean_logprob=logprobs, extra=extra)
        for scorer, p in zip(scorers, probs, strict=True)
    ]
