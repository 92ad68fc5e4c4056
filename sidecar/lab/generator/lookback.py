"""Chunk-wise and full-context lookback ratios of a causal LM.

The method: docs/methods.md §Lookback-ratio factuality.

For every newly generated token ``t = 1..T``, layer ``l`` and head ``h``, the
attention row ``alpha^{l,h}_{t,p}`` over the positions ``p`` visible at that step
is reduced to segment means (eq. 7)::

    A_t(x) = (1 / N_x) * sum_{p in x} alpha_{t,p}      x in {context, output, c_1..c_K}

where ``context`` is the whole prompt (preamble, chunks, question) and
``output`` the answer tokens generated before step ``t``. Then (eqs. 8, 9)::

    LR_t(c_i) = K * A_t(c_i) / (A_t(context) + A_t(output))      chunk-wise (cw)
    LR(c_i)   = (1 / T) * sum_t LR_t(c_i)

and the full-context ratio of Lookback Lens (Chuang et al. 2024), the ``fc``
variant of the source's Fig. 6 (docs/methods.md §Lookback-ratio factuality)::

    LR_t = A_t(context) / (A_t(context) + A_t(output)),   LR = (1 / T) * sum_t LR_t

Conventions, fixed here and recorded with every dataset and model:

* **Which attention row is step t.** Step ``t`` is the forward pass that
  *produces* answer token ``y_t``: its query is the last prompt token for
  ``t = 1`` and ``y_{t-1}`` afterwards; its keys are the ``P`` prompt tokens and
  ``y_1..y_{t-1}``. So ``output`` is empty at ``t = 1`` and ``A_1(output) = 0``.
  Generation and teacher forcing of the same answer see the same rows.
* **Which steps count.** The steps that produced answer tokens; the step that
  produced the end-of-sequence token does not count, unless the answer is
  empty (then ``T = 1``: the EOS step). Teacher forcing an empty answer
  forces the first EOS id, so both paths agree.
* **Grouped-query attention** needs nothing special: the returned attention
  probabilities are per query head (SmolLM2: 30 layers x 9 heads).
* The ratios are **not** confined to [0, 1] (eq. 7 uses per-token means, so
  ``K * A(c_i)`` can exceed the context mean); the classifier's per-sample
  scaling maps them to [0, 1] (:mod:`sidecar.lookback.features`).

Memory: the prompt is pre-filled *without* attention outputs (one KV cache),
then each generated token (or a block of at most ``block_size`` teacher-forced
tokens) is run with ``output_attentions=True``; its ``L x H x (P + t)`` rows are
reduced at once into running sums of shape ``L x H x K`` and ``L x H``. No step's
attention map is kept, and no ``P x P`` map is ever returned.

The model must run with ``attn_implementation="eager"`` (the fused kernels do not
return attention probabilities).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from sidecar.contracts.events import FLOAT16_MAX, AttentionSummary
from sidecar.exceptions import ConfigError
from sidecar.lab.generator.prompt import SegmentedPrompt

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the lookback-ratio summariser needs torch and transformers: "
        "pip install 'rag-guardrail-sidecar[ml]'"
    ) from exc

__all__ = [
    "FLOAT16_MAX",
    "LookbackSummariser",
    "LookbackTrace",
    "StepRatios",
    "step_ratios",
]

_TINY = 1e-30


@dataclass(frozen=True, slots=True)
class LookbackTrace:
    """One answer and its time-averaged lookback ratios (eq. 9)."""

    answer_ids: tuple[int, ...]
    chunk_ratios: npt.NDArray[np.float32]
    """``(L, H, K)``: LR^{l,h}(c_i), eq. 9, chunks in prompt (= retrieval) order."""
    context_ratios: npt.NDArray[np.float32]
    """``(L, H)``: the full-context lookback ratio of Lookback Lens."""
    mean_token_logprob: float
    """Mean over the counted steps of ``log p(y_t | prompt, y_<t)``."""
    steps: int
    """T: how many steps were averaged."""
    stopped: Literal["eos", "length", "forced"]
    """Why decoding ended; ``forced`` for a teacher-forced answer."""

    def summary(self, variant: Literal["cw", "fc"] = "cw") -> AttentionSummary:
        """The wire form: float16 ``(L, H, K)`` for ``cw``, ``(L, H, 1)`` for ``fc``.

        Values are clipped to the float16 range (65504), which only a prompt of
        tens of thousands of tokens with a tiny chunk could exceed.
        """
        if variant == "cw":
            array = self.chunk_ratios
        elif variant == "fc":
            array = self.context_ratios[:, :, None]
        else:
            raise ConfigError(f"variant must be 'cw' or 'fc', got {variant!r}")
        clipped = np.clip(array, 0.0, FLOAT16_MAX)
        return AttentionSummary.from_array(clipped, variant=variant)


@dataclass(frozen=True, slots=True)
class StepRatios:
    """Per-step ratios of a block of consecutive steps (before time-averaging)."""

    chunk: torch.Tensor
    """``(S, L, H, K)`` float64: LR_t(c_i), eq. 8."""
    context: torch.Tensor
    """``(S, L, H)`` float64: the full-context LR_t."""


def step_ratios(
    attentions: Sequence[torch.Tensor], prompt: SegmentedPrompt, first_step: int
) -> StepRatios:
    """Eqs. 7-8 for a block of steps, from one forward pass's attention outputs.

    ``attentions`` holds one tensor per layer, ``(1, H, S, P + first_step + S - 1)``:
    query row ``j`` is step ``t = first_step + j`` (0-based), which sees the prompt
    and ``first_step + j`` earlier answer tokens. Positions a row cannot see are
    masked explicitly (not trusted to be exact zeros).
    """
    rows = torch.stack([a[0] for a in attentions]).to(torch.float64)  # (L, H, S, keys)
    _n_layers, _n_heads, n_steps, n_keys = rows.shape
    p_len = prompt.length
    if n_keys != p_len + first_step + n_steps - 1:
        raise ConfigError(
            f"attention rows see {n_keys} keys; a block of {n_steps} steps from step "
            f"{first_step} over a {p_len}-token prompt needs {p_len + first_step + n_steps - 1}"
        )
    rows = rows.permute(2, 0, 1, 3)  # (S, L, H, keys)
    ctx = rows[..., :p_len].mean(dim=-1)  # A_t(context), eq. 7
    n_out = torch.arange(first_step, first_step + n_steps, dtype=torch.float64)  # N_output
    pos = torch.arange(n_keys)
    visible_out = (pos[None, :] >= p_len) & (pos[None, :] < p_len + n_out[:, None].long())
    out_sum = (rows * visible_out[:, None, None, :].to(rows.dtype)).sum(dim=-1)
    out = out_sum / n_out.clamp(min=1.0)[:, None, None]  # A_t(output); 0 when empty
    denom = (ctx + out).clamp(min=_TINY)
    chunk_means = torch.stack([rows[..., s:e].mean(dim=-1) for s, e in prompt.chunks], dim=-1)
    k = float(prompt.k)
    return StepRatios(chunk=k * chunk_means / denom[..., None], context=ctx / denom)


class _Accumulator:
    """Running sums of eq. 8 over counted steps (eq. 9 at the end)."""

    def __init__(self) -> None:
        self.chunk: torch.Tensor | None = None
        self.context: torch.Tensor | None = None
        self.logprob = 0.0
        self.steps = 0

    def add(self, chunk: torch.Tensor, context: torch.Tensor, logprob: float) -> None:
        self.chunk = chunk if self.chunk is None else self.chunk + chunk
        self.context = context if self.context is None else self.context + context
        self.logprob += logprob
        self.steps += 1

    def trace(
        self, answer_ids: Sequence[int], stopped: Literal["eos", "length", "forced"]
    ) -> LookbackTrace:
        if self.chunk is None or self.context is None or self.steps == 0:
            raise ConfigError("no generation step was recorded (max_new_tokens must be >= 1)")
        return LookbackTrace(
            answer_ids=tuple(int(i) for i in answer_ids),
            chunk_ratios=(self.chunk / self.steps).numpy().astype(np.float32),
            context_ratios=(self.context / self.steps).numpy().astype(np.float32),
            mean_token_logprob=min(0.0, self.logprob / self.steps),
            steps=self.steps,
            stopped=stopped,
        )


class LookbackSummariser:
    """Greedy generation or teacher forcing with eqs. 7-9 accumulated per step.

    ``model`` is a transformers causal LM loaded with ``attn_implementation="eager"``;
    ``eos_token_ids`` end a generation (the first one is forced for an empty answer).
    """

    def __init__(
        self,
        model: Any,
        *,
        generator_id: str,
        eos_token_ids: Sequence[int],
        block_size: int = 32,
    ) -> None:
        if not eos_token_ids:
            raise ConfigError("at least one end-of-sequence token id is needed")
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        impl = getattr(model.config, "_attn_implementation", None)
        if impl != "eager":
            raise ConfigError(
                f"the model runs attention with {impl!r}; lookback ratios need "
                "attn_implementation='eager' (fused kernels return no attention probabilities)"
            )
        self.model = model
        self.generator_id = generator_id
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        self.block_size = block_size
        self.layers = int(model.config.num_hidden_layers)
        self.heads = int(model.config.num_attention_heads)
        # the KV cache's name in forward() and its output: ``cache`` from transformers 5.24,
        # ``past_key_values`` before (5.24 warns on the old name; 5.40 drops it)
        forward = inspect.signature(model.forward).parameters
        self._cache_name = "cache" if "cache" in forward else "past_key_values"
        model.eval()

    # ------------------------------------------------------------------ internals

    def _prefill(self, prompt: SegmentedPrompt) -> Any:
        """KV cache of all prompt tokens but the last, computed without attention outputs."""
        if prompt.length < 2:
            return None
        ids = torch.tensor([prompt.input_ids[:-1]], dtype=torch.long)
        out = self.model(input_ids=ids, use_cache=True, output_attentions=False)
        return self._cache(out)

    def _cache(self, out: Any) -> Any:
        return getattr(out, self._cache_name)

    def _forward(self, ids: Sequence[int], past: Any) -> Any:
        return self.model(
            input_ids=torch.tensor([list(ids)], dtype=torch.long),
            use_cache=True,
            output_attentions=True,
            **{self._cache_name: past},
        )

    def _check_attentions(self, attentions: Any) -> None:
        if attentions is None or len(attentions) != self.layers or attentions[0] is None:
            raise ConfigError(
                "the model returned no attention probabilities; load it with "
                "attn_implementation='eager'"
            )

    # ------------------------------------------------------------------ public

    @torch.inference_mode()
    def generate(self, prompt: SegmentedPrompt, max_new_tokens: int = 24) -> LookbackTrace:
        """Greedy decoding of at most ``max_new_tokens`` tokens, ratios accumulated per step."""
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        past = self._prefill(prompt)
        acc = _Accumulator()
        answer: list[int] = []
        next_ids: list[int] = [prompt.input_ids[-1]]
        stopped: Literal["eos", "length"] = "length"
        for step in range(max_new_tokens):
            out = self._forward(next_ids, past)
            self._check_attentions(out.attentions)
            ratios = step_ratios(out.attentions, prompt, first_step=step)
            logprobs = torch.log_softmax(out.logits[0, -1].to(torch.float64), dim=-1)
            token = int(torch.argmax(logprobs))
            if token in self.eos_token_ids:
                stopped = "eos"
                if not answer:
                    acc.add(ratios.chunk[0], ratios.context[0], float(logprobs[token]))
                break
            acc.add(ratios.chunk[0], ratios.context[0], float(logprobs[token]))
            answer.append(token)
            next_ids = [token]
            past = self._cache(out)
        return acc.trace(answer, stopped)

    @torch.inference_mode()
    def teacher_force(self, prompt: SegmentedPrompt, answer_ids: Sequence[int]) -> LookbackTrace:
        """The same ratios for a given answer (e.g. one a service already generated).

        Runs blocks of ``block_size`` answer tokens at once; an empty answer is
        scored as the single first EOS token.
        """
        answer = [int(i) for i in answer_ids]
        targets = answer or [self.eos_token_ids[0]]
        inputs = [prompt.input_ids[-1], *targets[:-1]]
        past = self._prefill(prompt)
        acc = _Accumulator()
        for start in range(0, len(targets), self.block_size):
            stop = min(start + self.block_size, len(targets))
            out = self._forward(inputs[start:stop], past)
            self._check_attentions(out.attentions)
            ratios = step_ratios(out.attentions, prompt, first_step=start)
            logprobs = torch.log_softmax(out.logits[0].to(torch.float64), dim=-1)
            for j in range(stop - start):
                lp = float(logprobs[j, targets[start + j]])
                acc.add(ratios.chunk[j], ratios.context[j], lp)
            past = self._cache(out)
        return acc.trace(answer, "forced")
