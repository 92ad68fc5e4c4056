"""LookbackRecorder on tiny seeded Llama, Qwen2, Gemma2 and Mistral models: ratios, steps, memory.

Each model is built from a config with random weights (seed 0, no download). The
recorder wraps ``model.generate()``; the reference is the project's summariser
(its own step loop) and eqs. 7-9 computed from one uncached forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from transformers import (
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from guardrail_client.hf import (
    LookbackRecorder,
    Recording,
    find_attention_modules,
    lookback_step,
)
from sidecar.exceptions import ConfigError, DataError
from sidecar.lab.generator.lookback import LookbackSummariser
from sidecar.lab.generator.prompt import SegmentedPrompt
from tests.lab.generator.test_lookback_math import EOS, VOCAB, prompt_of, reference

Builder = Callable[..., Any]


def _shape(layers: int, heads: int) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": 8 * heads,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads // 2,
        "max_position_embeddings": 2048,
        "attn_implementation": "eager",
        "eos_token_id": EOS,
        "pad_token_id": EOS,
        "bos_token_id": 1,
    }


def _sharpen(model: Any) -> Any:
    # Sharper attention than the default init, so the segments really differ.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    model.train(False)
    return model


def llama(layers: int = 3, heads: int = 4) -> Any:
    torch.manual_seed(0)
    return _sharpen(LlamaForCausalLM(LlamaConfig(**_shape(layers, heads))))


def qwen2(layers: int = 3, heads: int = 4) -> Any:
    torch.manual_seed(0)
    return _sharpen(Qwen2ForCausalLM(Qwen2Config(**_shape(layers, heads))))


def gemma2(layers: int = 3, heads: int = 4) -> Any:
    torch.manual_seed(0)
    config = Gemma2Config(**_shape(layers, heads), head_dim=8, sliding_window=4096)
    return _sharpen(Gemma2ForCausalLM(config))


ARCHITECTURES: dict[str, Builder] = {"llama": llama, "qwen2": qwen2, "gemma2": gemma2}
CHUNKS = ["Alice wrote the book in 1901.", "Bob sells bikes.", "Cats sleep all day."]


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model(request: pytest.FixtureRequest) -> Any:
    return ARCHITECTURES[request.param]()


def _summariser(model: Any, eos: int = EOS) -> LookbackSummariser:
    return LookbackSummariser(model, generator_id="test/tiny", eos_token_ids=[eos])


def test_recorder_equals_the_summariser_and_the_definition(model: Any) -> None:
    prompt = prompt_of(CHUNKS)
    expected = _summariser(model).generate(prompt, max_new_tokens=8)
    got = LookbackRecorder(model, eos_token_ids=[EOS]).generate(
        prompt.input_ids, prompt.chunks, max_new_tokens=8
    )
    assert got.answer_ids == expected.answer_ids
    assert (got.steps, got.stopped) == (expected.steps, expected.stopped)
    assert got.chunk_ratios.shape == (3, 4, 3)
    np.testing.assert_allclose(got.chunk_ratios, expected.chunk_ratios, atol=1e-5)
    np.testing.assert_allclose(got.context_ratios, expected.context_ratios, atol=1e-5)
    assert got.mean_token_logprob == pytest.approx(expected.mean_token_logprob, abs=1e-5)
    cw, fc, steps = reference(model, prompt, got.answer_ids)
    assert got.steps == steps
    np.testing.assert_allclose(got.chunk_ratios, cw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.context_ratios, fc, rtol=1e-4, atol=1e-5)
    summary = got.summary()
    assert (summary.layers, summary.heads, summary.chunks, summary.variant) == (3, 4, 3, "cw")
    np.testing.assert_array_equal(summary.to_array(), expected.summary().to_array())
    fc_summary = got.summary("fc")
    assert (fc_summary.chunks, fc_summary.variant) == (1, "fc")


def mistral_window(window: int) -> Any:
    torch.manual_seed(0)
    return _sharpen(MistralForCausalLM(MistralConfig(**_shape(2, 4), sliding_window=window)))


def gemma2_window(window: int) -> Any:
    torch.manual_seed(0)  # layers alternate: sliding (local), full (global), sliding
    return _sharpen(
        Gemma2ForCausalLM(Gemma2Config(**_shape(3, 4), head_dim=8, sliding_window=window))
    )


@pytest.mark.parametrize("build", [mistral_window, gemma2_window], ids=["mistral", "gemma2"])
def test_a_sliding_window_shorter_than_the_prompt_follows_the_definition(build: Builder) -> None:
    # The cache of a sliding layer keeps only the last window of keys, so a decoding step
    # sees fewer keys than the prompt has; the earlier ones are outside the window.
    model = build(8)
    prompt = prompt_of(CHUNKS)
    assert prompt.length > 8
    got = LookbackRecorder(model, eos_token_ids=[EOS]).generate(
        prompt.input_ids, prompt.chunks, max_new_tokens=6
    )
    cw, fc, steps = reference(model, prompt, got.answer_ids)
    assert got.steps == steps > 1
    np.testing.assert_allclose(got.chunk_ratios, cw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.context_ratios, fc, rtol=1e-4, atol=1e-5)
    assert got.summary().chunks == 3


def test_the_eos_step_is_left_out_unless_the_answer_is_empty(model: Any) -> None:
    prompt = prompt_of(CHUNKS[:2])
    greedy = LookbackRecorder(model, eos_token_ids=[EOS]).generate(
        prompt.input_ids, prompt.chunks, max_new_tokens=6
    )
    ids = greedy.answer_ids
    cut = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # a first occurrence
    for eos, answer in ((ids[cut], ids[:cut]), (ids[0], ())):
        got = LookbackRecorder(model, eos_token_ids=[eos]).generate(
            prompt.input_ids, prompt.chunks, max_new_tokens=6
        )
        expected = _summariser(model, eos=eos).generate(prompt, max_new_tokens=6)
        assert (got.answer_ids, got.stopped) == (answer, "eos")
        assert got.steps == expected.steps == max(1, len(answer))
        np.testing.assert_allclose(got.chunk_ratios, expected.chunk_ratios, atol=1e-5)
        assert got.mean_token_logprob == pytest.approx(expected.mean_token_logprob, abs=1e-5)


def test_the_recorder_works_inside_a_caller_owned_generate_with_a_streamer() -> None:
    model = llama()
    prompt = prompt_of(CHUNKS)
    recorder = LookbackRecorder(model, eos_token_ids=[EOS])
    seen: list[int] = []

    class Streamer:
        def put(self, value: torch.Tensor) -> None:
            seen.extend(int(v) for v in value.reshape(-1))

        def end(self) -> None:
            seen.append(-1)

    ids = torch.tensor([list(prompt.input_ids)])
    with torch.no_grad(), recorder.record(prompt.length, prompt.chunks) as rec:
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=5,
            do_sample=False,
            streamer=Streamer(),
        )
        with pytest.raises(ConfigError, match="already recording"):
            recorder.record(prompt.length, prompt.chunks).__enter__()
    got = rec.finish(out[0, prompt.length :].tolist())
    assert seen[prompt.length :] == [*got.answer_ids, -1][: len(seen) - prompt.length]
    direct = recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=5)
    np.testing.assert_allclose(got.chunk_ratios, direct.chunk_ratios, atol=1e-6)
    # the hooks are gone after the block: a plain forward pass records nothing
    model(input_ids=ids)
    assert rec.forwards == 5


def test_a_cached_prefix_and_uncached_steps_follow_the_definition() -> None:
    model = llama()
    prompt = prompt_of(CHUNKS)
    recorder = LookbackRecorder(model, eos_token_ids=[EOS])
    uncached = recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=5, use_cache=False)
    cache = DynamicCache(config=model.config)  # the first 30 prompt tokens, run before
    with torch.no_grad():
        model(input_ids=torch.tensor([prompt.input_ids[:30]]), cache=cache)
    prefixed = recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=5, cache=cache)
    for got in (uncached, prefixed):
        cw, fc, _ = reference(model, prompt, got.answer_ids)
        np.testing.assert_allclose(got.chunk_ratios, cw, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got.context_ratios, fc, rtol=1e-4, atol=1e-5)


def test_forward_passes_it_cannot_follow_are_refused() -> None:
    # Prompt lookup feeds candidate tokens after the prompt (and later after each token):
    # the last query row is then a candidate's, not the step's.
    model = llama()
    prompt = prompt_of(CHUNKS)
    recorder = LookbackRecorder(model, eos_token_ids=[EOS])
    with pytest.raises(ConfigError, match="assisted"):
        recorder.generate(
            prompt.input_ids, prompt.chunks, max_new_tokens=4, prompt_lookup_num_tokens=3
        )
    # a left-padded prompt: the pads are not context, and positions start after them
    pad = 3
    ids = torch.tensor([[0] * pad + list(prompt.input_ids)])
    mask = torch.tensor([[0] * pad + [1] * prompt.length])
    spans = [(s + pad, e + pad) for s, e in prompt.chunks]
    with (
        pytest.raises(ConfigError, match="padding"),
        torch.no_grad(),
        recorder.record(ids.shape[1], spans),
    ):
        model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0
        )
    # and the recorder is free again
    assert recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=2).steps == 2


def test_without_position_ids_the_fed_length_says_where_a_pass_ends() -> None:
    def first_pass(fed: int) -> None:
        rec = Recording(
            layers=1, heads=1, prompt_length=10, chunk_spans=[(0, 3)], eos_token_ids=[0]
        )
        rec.begin_forward(torch.zeros((1, fed), dtype=torch.long))

    first_pass(10)  # the prompt
    first_pass(4)  # its last 4 tokens after a cached prefix
    with pytest.raises(ConfigError, match="ends at position 12, not 9"):
        first_pass(13)  # the prompt and 3 candidate tokens (assisted decoding)


def test_one_recording_at_a_time_per_model_whichever_recorder() -> None:
    # A server that builds a recorder per request: the hooks of both would see
    # both generations' forward passes.
    model = llama(2, 2)
    prompt = prompt_of(CHUNKS[:1])
    first = LookbackRecorder(model, eos_token_ids=[EOS])
    second = LookbackRecorder(model, eos_token_ids=[EOS])
    with first.record(prompt.length, prompt.chunks):
        with pytest.raises(ConfigError, match="already recording on this model"):
            second.generate(prompt.input_ids, prompt.chunks, max_new_tokens=2)
    assert second.generate(prompt.input_ids, prompt.chunks, max_new_tokens=2).steps == 2


def test_generate_takes_a_pad_id_and_names_the_arguments_it_sets_itself() -> None:
    model = llama(2, 2)
    prompt = prompt_of(CHUNKS[:1])
    recorder = LookbackRecorder(model, eos_token_ids=[EOS])
    plain = recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=3)
    padded = recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=3, pad_token_id=0)
    np.testing.assert_array_equal(padded.chunk_ratios, plain.chunk_ratios)
    with pytest.raises(ConfigError, match="eos_token_ids"):
        recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=3, eos_token_id=5)
    model.generation_config.return_dict_in_generate = True  # generate() returns an output object
    as_dict = recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=3)
    np.testing.assert_array_equal(as_dict.chunk_ratios, plain.chunk_ratios)
    model.generation_config.num_beams = 2  # a model whose generation config asks for beams
    with pytest.raises(ConfigError, match="num_beams must be 1"):
        recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=3)
    beams_off = recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=3, num_beams=1)
    np.testing.assert_array_equal(beams_off.chunk_ratios, plain.chunk_ratios)


def test_a_non_finite_logit_is_an_error_not_a_certain_answer() -> None:
    # A float16 overflow gives +inf logits: log p is NaN, and min(0.0, NaN) read 0.0,
    # a perfectly confident answer.
    model = llama(2, 2)
    prompt = prompt_of(CHUNKS[:1])
    recorder = LookbackRecorder(model, eos_token_ids=[EOS])

    def overflow(_m: Any, _args: Any, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_fill(-1, torch.tensor([3, 4]), float("inf"))

    handle = model.lm_head.register_forward_hook(overflow)
    try:
        with pytest.raises(DataError, match="not finite"):
            recorder.generate(prompt.input_ids, prompt.chunks, max_new_tokens=3)
    finally:
        handle.remove()


def test_bad_setups_are_refused_with_what_is_allowed() -> None:
    sdpa = LlamaForCausalLM(LlamaConfig(**{**_shape(2, 2), "attn_implementation": "sdpa"}))
    with pytest.raises(ConfigError, match="eager"):
        LookbackRecorder(sdpa, eos_token_ids=[EOS])
    model = llama(2, 2)
    recorder = LookbackRecorder(model, eos_token_ids=[EOS])
    with pytest.raises(ConfigError, match="within the 10-token prompt"):
        recorder.generate(list(range(10)), [(4, 12)], max_new_tokens=2)
    with pytest.raises(ConfigError, match="K >= 1"):
        recorder.generate(list(range(10)), [], max_new_tokens=2)
    # both were recorded: overlapping spans counted their shared tokens for two chunks, and
    # 1,025 chunks failed only at summary(), after the whole generation
    with pytest.raises(ConfigError, match=r"chunk spans 1 \[3, 6\] and 0 \[5, 8\] overlap"):
        recorder.generate(list(range(10)), [(5, 8), (3, 6)], max_new_tokens=2)
    with pytest.raises(ConfigError, match="1025 chunk spans; an attention summary holds at most"):
        recorder.generate(list(range(2000)), [(i, i + 1) for i in range(1025)], max_new_tokens=2)
    recorder.generate(list(range(10)), [(5, 8), (2, 5)], max_new_tokens=2)  # touching is fine
    with pytest.raises(ConfigError, match="num_beams"):
        recorder.generate(list(range(10)), [(2, 5)], max_new_tokens=2, num_beams=2)
    with pytest.raises(ConfigError, match="attention modules"):
        find_attention_modules(model, 5)


def test_lookback_step_is_eqs_7_and_8() -> None:
    sums = np.array([[0.6, 0.4, 0.3, 0.1]])  # context, output, c1, c2 for one head
    chunk, context = lookback_step(
        sums, prompt_length=6, chunk_lengths=np.array([3.0, 1.0]), n_output=2
    )
    a_ctx, a_out = 0.6 / 6, 0.4 / 2
    np.testing.assert_allclose(context, [a_ctx / (a_ctx + a_out)])
    np.testing.assert_allclose(chunk, [[2 * 0.1 / (a_ctx + a_out), 2 * 0.1 / (a_ctx + a_out)]])


# ---------------------------------------------------------------------- memory


def _prompt(chunks: int, words: int) -> SegmentedPrompt:
    return prompt_of([" ".join(["word"] * words)] * chunks)


def _no_eos(model: Any, prompt: SegmentedPrompt, steps: int) -> LookbackRecorder:
    """A recorder whose EOS id the tiny model never emits, so it runs all ``steps``."""
    with torch.no_grad():
        ids = torch.tensor([list(prompt.input_ids)])
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
            do_sample=False, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    unused = sorted(set(range(VOCAB)) - set(out[0].tolist()))
    return LookbackRecorder(model, eos_token_ids=[unused[0]])


def _run(model: Any, prompt: SegmentedPrompt, steps: int) -> tuple[int, int, int]:
    recorder = _no_eos(model, prompt, steps)
    peak_state = 0
    with torch.no_grad(), recorder.record(prompt.length, prompt.chunks) as rec:
        ids = torch.tensor([list(prompt.input_ids)])

        def watch(*_: Any) -> None:
            nonlocal peak_state
            peak_state = max(peak_state, rec.state_bytes())

        handle = model.register_forward_hook(watch)
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
            do_sample=False, eos_token_id=list(recorder.eos_token_ids), pad_token_id=0,
        )  # fmt: skip
        handle.remove()
    record = rec.finish(out[0, prompt.length :].tolist())
    assert record.steps == steps
    return peak_state, rec.peak_work_bytes, prompt.length


@pytest.mark.parametrize("build", [llama, qwen2], ids=["llama", "qwen2"])
def test_retained_memory_grows_with_layers_heads_chunks_not_with_length(build: Builder) -> None:
    model = build(3, 4)
    prompt = _prompt(chunks=3, words=6)
    runs = {steps: _run(model, prompt, steps) for steps in (4, 32, 160)}
    state = {steps: r[0] for steps, r in runs.items()}
    vocab_row = 8 * VOCAB  # one float64 log-probability row, until the step's token is known
    assert set(state.values()) == {8 * 2 * 3 * 4 * (3 + 1) + vocab_row}, state
    # the one transient a hook makes is its own H x keys row: linear in the length
    for steps, (_, work, p_len) in runs.items():
        assert work == 8 * 4 * (p_len + steps - 1)
    # and the retained state follows L x H x (K + 1), nothing else
    for layers, heads, chunks in ((2, 2, 1), (5, 4, 2), (3, 8, 6)):
        peak, _, _ = _run(build(layers, heads), _prompt(chunks=chunks, words=4), 6)
        assert peak == 8 * 2 * layers * heads * (chunks + 1) + vocab_row
