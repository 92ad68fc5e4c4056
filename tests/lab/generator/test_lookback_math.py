"""Eqs. 7-9 of seed 000 checked against a direct numpy computation on a tiny random Llama.

The tiny model is built from a config (random weights, no download). The reference
runs one full forward pass over prompt + answer without any cache, takes every
attention row as numpy and applies eqs. 7-9 with explicit loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sidecar.exceptions import ConfigError
from sidecar.lab.generator.lookback import LookbackSummariser, LookbackTrace, step_ratios
from sidecar.lab.generator.prompt import SegmentedPrompt, segment

VOCAB = 97
EOS = 96


def tiny_llama(attn: str = "eager") -> LlamaForCausalLM:
    torch.manual_seed(0)
    fields: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "attn_implementation": attn,
    }
    model = LlamaForCausalLM(LlamaConfig(**fields))
    # Sharper attention than the default init, so the segments really differ.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    model.train(False)
    return model


def encode(text: str) -> list[int]:
    return [ord(c) % (VOCAB - 1) for c in text]


def prompt_of(chunks: Sequence[str]) -> SegmentedPrompt:
    return segment(
        encode,
        "<sys>Answer from the documents.\n",
        [f"[{i + 1}] {c}\n" for i, c in enumerate(chunks)],
        "Q: who wrote it?\nA:",
        [f"c{i}" for i in range(len(chunks))],
    )


def reference(
    model: LlamaForCausalLM, prompt: SegmentedPrompt, answer: Sequence[int]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], int]:
    """Eqs. 7-9 straight from the definition, on one uncached forward pass (float64)."""
    steps = max(1, len(answer))
    ids = list(prompt.input_ids) + list(answer[: steps - 1])
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    att = np.stack([a[0].double().numpy() for a in out.attentions])  # (L, H, S, S)
    n_layers, n_heads, n_keys = att.shape[0], att.shape[1], att.shape[3]
    # Causal: a query never sees a later position (rows are exact probabilities).
    assert np.allclose(att.sum(-1), 1.0)
    assert not np.triu(att[0, 0], k=1).any()
    assert n_keys == len(ids)
    p_len, k = prompt.length, prompt.k
    cw = np.zeros((n_layers, n_heads, k))
    fc = np.zeros((n_layers, n_heads))
    for t in range(steps):  # step t produces answer token t (0-based)
        row = att[:, :, p_len - 1 + t, :]  # its query position; (L, H, keys)
        a_ctx = row[:, :, :p_len].sum(-1) / p_len  # eq. 7, x = context
        a_out = row[:, :, p_len : p_len + t].sum(-1) / t if t else 0.0  # eq. 7, x = output
        for i, (s, e) in enumerate(prompt.chunks):
            a_ci = row[:, :, s:e].sum(-1) / (e - s)  # eq. 7, x = c_i
            cw[:, :, i] += k * a_ci / (a_ctx + a_out)  # eq. 8
        fc += a_ctx / (a_ctx + a_out)
    return cw / steps, fc / steps, steps  # eq. 9


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama()


def summariser(model: LlamaForCausalLM, eos: int = EOS, block: int = 32) -> LookbackSummariser:
    return LookbackSummariser(
        model, generator_id="test/tiny", eos_token_ids=[eos], block_size=block
    )


def assert_matches(trace: LookbackTrace, model: LlamaForCausalLM, prompt: SegmentedPrompt) -> None:
    cw, fc, steps = reference(model, prompt, trace.answer_ids)
    assert trace.steps == steps
    assert trace.chunk_ratios.shape == (3, 4, prompt.k)
    assert trace.context_ratios.shape == (3, 4)
    np.testing.assert_allclose(trace.chunk_ratios, cw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(trace.context_ratios, fc, rtol=1e-4, atol=1e-5)


def test_generation_matches_the_definition(model: LlamaForCausalLM) -> None:
    prompt = prompt_of(["Alice wrote the book in 1901.", "Bob sells bikes.", "Cats sleep."])
    trace = summariser(model).generate(prompt, max_new_tokens=6)
    assert trace.stopped in ("eos", "length")
    assert len(trace.answer_ids) == trace.steps
    assert_matches(trace, model, prompt)
    assert trace.mean_token_logprob <= 0.0


@pytest.mark.parametrize("block", [1, 2, 32])
def test_teacher_forcing_matches_generation_and_definition(
    model: LlamaForCausalLM, block: int
) -> None:
    prompt = prompt_of(["The river is long.", "Paris is in France."])
    generated = summariser(model).generate(prompt, max_new_tokens=5)
    forced = summariser(model, block=block).teacher_force(prompt, generated.answer_ids)
    np.testing.assert_allclose(forced.chunk_ratios, generated.chunk_ratios, atol=1e-5)
    np.testing.assert_allclose(forced.context_ratios, generated.context_ratios, atol=1e-6)
    assert forced.mean_token_logprob == pytest.approx(generated.mean_token_logprob, abs=1e-5)
    assert forced.stopped == "forced"
    # Any answer, not only the greedy one.
    other = [5, 17, 42, 8, 60, 3, 11]
    assert_matches(summariser(model, block=block).teacher_force(prompt, other), model, prompt)


def test_empty_answer_counts_the_eos_step(model: LlamaForCausalLM) -> None:
    prompt = prompt_of(["One chunk only."])
    first = summariser(model).generate(prompt, max_new_tokens=1).answer_ids[0]
    trace = summariser(model, eos=first).generate(prompt, max_new_tokens=4)
    assert (trace.answer_ids, trace.steps, trace.stopped) == ((), 1, "eos")
    # At t = 1 nothing was generated yet: A(output) = 0, so the full-context ratio is 1.
    np.testing.assert_allclose(trace.context_ratios, 1.0, atol=1e-6)
    assert_matches(trace, model, prompt)
    forced = summariser(model, eos=first).teacher_force(prompt, [])
    np.testing.assert_allclose(forced.chunk_ratios, trace.chunk_ratios, atol=1e-6)


def test_chunk_ratios_are_bounded_by_the_context_share(model: LlamaForCausalLM) -> None:
    """At t = 1, sum_i N_i LR(c_i) / (K P) is the attention share of the chunks: in (0, 1]."""
    prompt = prompt_of(["aaaa", "bbbb", "cccc"])
    trace = summariser(model).generate(prompt, max_new_tokens=1)
    assert trace.steps == 1
    # t = 1: A(output) = 0, so K * A(c_i) / A(context) and sum_i N_i A(c_i) <= P A(context).
    lengths = np.array([e - s for s, e in prompt.chunks], dtype=np.float64)
    share = (trace.chunk_ratios.astype(np.float64) * lengths).sum(-1) / prompt.k / prompt.length
    assert (share > 0.0).all()
    assert (share <= 1.0 + 1e-5).all()


def test_summary_wire_format(model: LlamaForCausalLM) -> None:
    prompt = prompt_of(["x1", "x2"])
    trace = summariser(model).generate(prompt, max_new_tokens=3)
    cw, fc = trace.summary("cw"), trace.summary("fc")
    assert (cw.layers, cw.heads, cw.chunks, cw.variant) == (3, 4, 2, "cw")
    assert (fc.layers, fc.heads, fc.chunks, fc.variant) == (3, 4, 1, "fc")
    np.testing.assert_allclose(cw.to_array(), trace.chunk_ratios, rtol=1e-3)
    np.testing.assert_allclose(fc.to_array()[..., 0], trace.context_ratios, rtol=1e-3)


def test_step_ratios_rejects_rows_of_the_wrong_width(model: LlamaForCausalLM) -> None:
    prompt = prompt_of(["x1"])
    rows = [torch.full((1, 4, 1, prompt.length + 3), 0.1) for _ in range(3)]
    with pytest.raises(ConfigError, match="keys"):
        step_ratios(rows, prompt, first_step=0)


def test_fused_attention_is_refused() -> None:
    with pytest.raises(ConfigError, match="eager"):
        LookbackSummariser(tiny_llama("sdpa"), generator_id="t", eos_token_ids=[EOS])
    with pytest.raises(ConfigError, match="end-of-sequence"):
        LookbackSummariser(tiny_llama(), generator_id="t", eos_token_ids=[])
