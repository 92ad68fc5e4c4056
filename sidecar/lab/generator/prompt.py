"""The segmented prompt: ``context = {pre, c1, ..., cK, qu}``.

The method: docs/methods.md §Lookback-ratio factuality.

Each segment is tokenised on its own and the token ids are concatenated, so
every token of the prompt belongs to exactly one segment and the spans are
exact (no offset mapping, no boundary guessing). The chunks come in retrieval
order, highest score first, as the seed prescribes, so chunk column ``i`` of a
lookback summary always means "the i-th best retrieved chunk".

Pure Python: the tokenizer is passed in as an ``encode`` function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.exceptions import ConfigError

__all__ = [
    "PROMPT_TEMPLATE_VERSION",
    "PromptChunk",
    "SegmentedPrompt",
    "Span",
    "build_prompt",
    "segment",
]

PROMPT_TEMPLATE_VERSION = "chatml-nq/1"
"""Bump when the wording below changes: datasets and models record it."""

_PREAMBLE = (
    "<|im_start|>system\nYou are a helpful assistant. Answer the question using the documents. "
    "Keep the answer short.<|im_end|>\n<|im_start|>user\n"
)
_CHUNK = "[{i}] {title}: {text}\n"
_QUESTION = "\nQuestion: {question}\nAnswer in a few words.<|im_end|>\n<|im_start|>assistant\n"

Span = tuple[int, int]
"""``[start, end)`` token positions."""


@dataclass(frozen=True, slots=True)
class PromptChunk:
    """One retrieved chunk as the prompt shows it."""

    chunk_id: str
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class SegmentedPrompt:
    """Prompt token ids with the spans of ``pre``, ``c1..cK`` and ``qu``.

    The spans tile the prompt: ``pre`` starts at 0, each chunk starts where the
    previous segment ends, ``qu`` ends at ``len(input_ids)``. Every span is non-empty.
    """

    input_ids: tuple[int, ...]
    preamble: Span
    chunks: tuple[Span, ...]
    question: Span
    chunk_ids: tuple[str, ...]
    text: str = ""

    def __post_init__(self) -> None:
        if not self.chunks:
            raise ConfigError("a segmented prompt needs at least one chunk (K >= 1)")
        if len(self.chunk_ids) != len(self.chunks):
            raise ConfigError(f"{len(self.chunk_ids)} chunk ids for {len(self.chunks)} chunk spans")
        spans = (self.preamble, *self.chunks, self.question)
        cursor = 0
        for i, (start, end) in enumerate(spans):
            if start != cursor or end <= start:
                raise ConfigError(
                    f"segment {i} spans [{start}, {end}); segments must be non-empty and "
                    f"contiguous from position {cursor}"
                )
            cursor = end
        if cursor != len(self.input_ids):
            raise ConfigError(
                f"segments end at {cursor}, but the prompt has {len(self.input_ids)} tokens"
            )

    @property
    def k(self) -> int:
        """K: the number of chunks in the prompt."""
        return len(self.chunks)

    @property
    def length(self) -> int:
        """P: the number of prompt tokens (the context of eq. 8)."""
        return len(self.input_ids)


def segment(
    encode: Callable[[str], Sequence[int]],
    preamble: str,
    chunks: Sequence[str],
    question: str,
    chunk_ids: Sequence[str],
) -> SegmentedPrompt:
    """Tokenise each piece separately and record its span."""
    ids: list[int] = []

    def add(piece: str, what: str) -> Span:
        tokens = [int(t) for t in encode(piece)]
        if not tokens:
            raise ConfigError(f"the {what} encodes to no tokens")
        start = len(ids)
        ids.extend(tokens)
        return (start, len(ids))

    pre = add(preamble, "preamble")
    spans = tuple(add(text, f"chunk {i + 1}") for i, text in enumerate(chunks))
    qu = add(question, "question")
    return SegmentedPrompt(
        input_ids=tuple(ids),
        preamble=pre,
        chunks=spans,
        question=qu,
        chunk_ids=tuple(chunk_ids),
        text=preamble + "".join(chunks) + question,
    )


def build_prompt(
    encode: Callable[[str], Sequence[int]],
    question: str,
    chunks: Sequence[PromptChunk],
) -> SegmentedPrompt:
    """The ChatML prompt (template ``PROMPT_TEMPLATE_VERSION``) for ``question``.

    ``chunks`` must already be in retrieval order (best first).
    """
    q = question.strip()
    if not q:
        raise ConfigError("the question is empty")
    if not q.endswith("?"):
        q += "?"
    return segment(
        encode,
        _PREAMBLE,
        [_CHUNK.format(i=i + 1, title=c.title, text=c.text) for i, c in enumerate(chunks)],
        _QUESTION.format(question=q),
        [c.chunk_id for c in chunks],
    )
