"""The segmented prompt: spans tile the prompt, chunks keep retrieval order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.exceptions import ConfigError
from sidecar.lab.generator.prompt import PromptChunk, SegmentedPrompt, build_prompt, segment


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


@given(st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=6), st.text(max_size=20))
def test_spans_tile_the_prompt(chunks: list[str], question: str) -> None:
    prompt = segment(encode, "pre:", chunks, "q:" + question, [f"c{i}" for i in range(len(chunks))])
    assert prompt.k == len(chunks)
    assert prompt.preamble[0] == 0
    assert prompt.question[1] == prompt.length
    for (s, e), text in zip(prompt.chunks, chunks, strict=True):
        assert list(prompt.input_ids[s:e]) == encode(text)


def test_build_prompt_uses_the_given_order_and_adds_a_question_mark() -> None:
    chunks = [PromptChunk("b", "B", "second best"), PromptChunk("a", "A", "best")]
    prompt = build_prompt(encode, "who wrote hamlet", chunks)
    assert prompt.chunk_ids == ("b", "a")
    s, e = prompt.chunks[0]
    assert "".join(map(chr, prompt.input_ids[s:e])) == "[1] B: second best\n"
    assert "Question: who wrote hamlet?\n" in prompt.text
    assert prompt.text.endswith("<|im_start|>assistant\n")


def test_invalid_prompts_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least one chunk"):
        segment(encode, "p", [], "q", [])
    with pytest.raises(ConfigError, match="encodes to no tokens"):
        segment(encode, "p", [""], "q", ["c"])
    with pytest.raises(ConfigError, match="contiguous"):
        SegmentedPrompt(
            input_ids=(1, 2, 3),
            preamble=(0, 1),
            chunks=((2, 3),),
            question=(3, 3),
            chunk_ids=("c",),
        )
    with pytest.raises(ConfigError, match="question is empty"):
        build_prompt(encode, "  ", [PromptChunk("a", "A", "t")])
