"""LookbackRecorder: the AttentionSummary of any Hugging Face causal LM's ``generate()``.

The chunk-wise lookback ratios are the ones of docs/methods.md §Lookback-ratio
factuality (the source's eqs. 7-9) with the project summariser's conventions: step ``t`` is
the forward pass that *produces* answer token ``y_t`` (its attention row is the
last query row of that pass: the last prompt token for ``t = 1``); the step that
produced the end-of-sequence token is not counted unless the answer is empty.

How it records: forward hooks on the model's attention modules (models loaded
with ``attn_implementation="eager"`` return the attention probabilities from
every attention module), a forward pre-hook on the model (which token was fed,
so which step just ended) and a forward hook on the model (the step's final
logits, after any soft-capping, give its log-probabilities). Per forward pass
and layer, the hook takes the last query row (``H x keys``), reduces it at once
to ``K + 2`` segment sums and eqs. 7-8, and adds the result into running
arrays. Retained: two ``L x H x K`` and two ``L x H`` float64 arrays plus one
vocabulary-sized log-probability row, whatever the sequence length; no
attention tensor outlives its hook call.

A sliding-window layer (Mistral, Gemma2's local layers, ...) whose cache keeps only
the last ``window`` keys returns a row over those keys alone: the positions before
them are outside its window (attention 0), so the segment sums count only the
positions the row covers.

Not thread-safe per model: one recording at a time per model, whichever recorder
(``record`` refuses a second).
Batch size 1 without padding, greedy or sampled decoding with one forward pass per
token (no beam search, no assisted or prompt-lookup decoding): a forward pass whose
last query is not the step's position is refused.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from sidecar.contracts.events import FLOAT16_MAX, MAX_CHUNKS, AttentionSummary
from sidecar.exceptions import ConfigError, DataError

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the lookback recorder needs torch and transformers: "
        "pip install 'rag-guardrail-sidecar[ml]'"
    ) from exc

__all__ = [
    "LookbackRecord",
    "LookbackRecorder",
    "Recording",
    "find_attention_modules",
    "lookback_step",
]

Span = tuple[int, int]
Stopped = Literal["eos", "length"]
FloatArray = npt.NDArray[np.float64]

_TINY = 1e-30
_ATTENTION_SUFFIXES = (".self_attn", ".attn", ".attention", ".self_attention")
# the models a recording's hooks are on, whichever recorder put them there: the hooks of
# two recordings on one model would each see the other generation's forward passes
_RECORDING: weakref.WeakSet[Any] = weakref.WeakSet()
_RECORDING_LOCK = threading.Lock()


def lookback_step(
    segment_sums: FloatArray,
    *,
    prompt_length: int,
    chunk_lengths: FloatArray,
    n_output: int,
) -> tuple[FloatArray, FloatArray]:
    """Eqs. 7-8 for one step from one layer's attention-row segment sums.

    ``segment_sums`` is ``(H, K + 2)``: column 0 sums the row over the prompt
    (context), column 1 over the ``n_output`` earlier answer tokens, columns
    ``2..K+1`` over each chunk. Returns ``LR_t(c_i)`` ``(H, K)`` and the
    full-context ``LR_t`` ``(H,)``.
    """
    context = segment_sums[:, 0] / prompt_length
    output = segment_sums[:, 1] / max(n_output, 1)
    denom = np.maximum(context + output, _TINY)
    chunk_means = segment_sums[:, 2:] / chunk_lengths
    k = float(chunk_lengths.shape[0])
    return k * chunk_means / denom[:, None], context / denom


@dataclass(frozen=True, slots=True)
class LookbackRecord:
    """One generation's time-averaged lookback ratios (eq. 9) and what it produced."""

    answer_ids: tuple[int, ...]
    """The answer tokens, the final end-of-sequence token left out."""
    chunk_ratios: npt.NDArray[np.float32]
    """``(L, H, K)``: LR^{l,h}(c_i), chunks in the order of ``chunk_spans``."""
    context_ratios: npt.NDArray[np.float32]
    """``(L, H)``: the full-context lookback ratio."""
    mean_token_logprob: float
    steps: int
    stopped: Stopped

    def summary(self, variant: Literal["cw", "fc"] = "cw") -> AttentionSummary:
        """The wire form for ``GenerationFinal.attention``, clipped to the float16 range."""
        if variant == "cw":
            array = self.chunk_ratios
        elif variant == "fc":
            array = self.context_ratios[:, :, None]
        else:
            raise ConfigError(f"variant must be 'cw' or 'fc', got {variant!r}")
        return AttentionSummary.from_array(np.clip(array, 0.0, FLOAT16_MAX), variant=variant)


def _check_spans(prompt_length: int, chunk_spans: Sequence[Span]) -> tuple[Span, ...]:
    if prompt_length < 1:
        raise ConfigError(f"prompt_length must be >= 1, got {prompt_length}")
    if not chunk_spans:
        raise ConfigError("at least one chunk span is needed (K >= 1)")
    if len(chunk_spans) > MAX_CHUNKS:  # the summary could be recorded, never sent
        raise ConfigError(
            f"{len(chunk_spans)} chunk spans; an attention summary holds at most {MAX_CHUNKS}"
        )
    spans = tuple((int(s), int(e)) for s, e in chunk_spans)
    for i, (start, end) in enumerate(spans):
        if not 0 <= start < end <= prompt_length:
            raise ConfigError(
                f"chunk span {i} is [{start}, {end}); spans must be non-empty and lie "
                f"within the {prompt_length}-token prompt"
            )
    # a token in two spans counts for both chunks: the producer's chunk offsets are wrong
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    for a, b in itertools.pairwise(order):
        if spans[b][0] < spans[a][1]:
            raise ConfigError(
                f"chunk spans {a} {list(spans[a])} and {b} {list(spans[b])} overlap; each "
                "prompt token belongs to at most one chunk"
            )
    return spans


class Recording:
    """The running state of one generation; filled by the recorder's hooks."""

    def __init__(
        self,
        *,
        layers: int,
        heads: int,
        prompt_length: int,
        chunk_spans: Sequence[Span],
        eos_token_ids: Sequence[int],
        windows: Sequence[int | None] | None = None,
    ) -> None:
        self.spans = _check_spans(prompt_length, chunk_spans)
        self.windows = tuple(windows) if windows is not None else (None,) * layers
        """Per layer: the sliding window (keys a query sees), ``None`` for full attention."""
        self.prompt_length = prompt_length
        self.layers = layers
        self.heads = heads
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self._chunk_lengths = np.array([e - s for s, e in self.spans], dtype=np.float64)
        k = len(self.spans)
        self._sum_chunk = np.zeros((layers, heads, k))
        self._sum_context = np.zeros((layers, heads))
        self._step_chunk = np.zeros((layers, heads, k))
        self._step_context = np.zeros((layers, heads))
        self._step_logprobs: torch.Tensor | None = None
        self._layers_seen = 0
        self._logprob_sum = 0.0
        self._steps = 0
        self.forwards = 0
        self.peak_work_bytes = 0
        """Largest transient tensor a hook call made (its ``H x keys`` float64 row)."""

    def state_bytes(self) -> int:
        """Bytes this recording retains between hook calls (independent of the length)."""
        arrays = (self._sum_chunk, self._sum_context, self._step_chunk, self._step_context)
        held = sum(a.nbytes for a in arrays)
        if self._step_logprobs is not None:
            held += self._step_logprobs.element_size() * self._step_logprobs.nelement()
        return held

    # ------------------------------------------------------------------ hooks

    def begin_forward(
        self, input_ids: torch.Tensor | None, position_ids: torch.Tensor | None = None
    ) -> None:
        """A forward pass starts: the token it feeds ends the previous step.

        Its last query must be the step's: position ``prompt_length - 1`` for the
        first pass, one further for each later one (one new token per pass).
        """
        expected = self.prompt_length - 1 + self.forwards
        fed = 1 if input_ids is None else int(input_ids.shape[-1])
        if position_ids is not None and position_ids.ndim == 2:
            last = int(position_ids[0, -1])
        elif fed > (1 if self.forwards else self.prompt_length):
            last = fed - 1  # without position ids: more than the whole sequence, or no cache
        else:
            last = expected  # one new token, or (first pass) a prompt after a cached prefix
        if last != expected:
            raise ConfigError(
                f"forward pass {self.forwards + 1} ends at position {last}, not {expected}: the "
                f"recorder follows a {self.prompt_length}-token prompt without padding and one "
                "new token per forward pass (no assisted or prompt-lookup decoding)"
            )
        if self._step_logprobs is not None:
            if input_ids is None:
                raise ConfigError("a decoding step fed no input_ids; the recorder needs token ids")
            self._fold(int(input_ids[0, -1]))
        self.forwards += 1
        self._layers_seen = 0

    def layer(self, index: int, weights: torch.Tensor | None) -> None:
        """Layer ``index`` of the current step returned attention probabilities ``weights``."""
        if weights is None:
            raise ConfigError(
                "an attention module returned no probabilities; load the model with "
                "attn_implementation='eager'"
            )
        if weights.ndim != 4 or weights.shape[0] != 1 or weights.shape[1] != self.heads:
            raise ConfigError(
                f"attention probabilities of shape {tuple(weights.shape)}; the recorder needs "
                f"(1, {self.heads}, queries, keys): batch size 1"
            )
        n_output = self.forwards - 1
        keys = self.prompt_length + n_output
        seen = int(weights.shape[-1])
        window = self.windows[index]
        if seen >= keys:
            first = 0  # the row covers positions 0..keys-1; later keys are masked
            row = weights[0, :, -1, :keys].to(torch.float64)  # (H, keys)
        elif window is not None and seen >= window:
            first = keys - seen  # a sliding layer's cache: the last ``seen`` positions
            row = weights[0, :, -1, :].to(torch.float64)  # (H, seen)
        else:
            raise ConfigError(
                f"step {n_output} sees {seen} keys at layer {index}; a {self.prompt_length}-token "
                f"prompt and {n_output} answer tokens need {keys} (one forward pass per token)"
            )
        segments = [(0, self.prompt_length), (self.prompt_length, keys), *self.spans]
        sums = torch.stack(
            [row[:, max(s - first, 0) : max(e - first, 0)].sum(dim=-1) for s, e in segments],
            dim=-1,
        )
        self.peak_work_bytes = max(self.peak_work_bytes, row.element_size() * row.nelement())
        chunk, context = lookback_step(
            sums.cpu().numpy(),
            prompt_length=self.prompt_length,
            chunk_lengths=self._chunk_lengths,
            n_output=n_output,
        )
        self._step_chunk[index] = chunk
        self._step_context[index] = context
        self._layers_seen += 1

    def logits(self, logits: torch.Tensor) -> None:
        """The step's output logits: keep its log-probabilities until the token is known."""
        if self._layers_seen != self.layers:
            raise ConfigError(
                f"{self._layers_seen} of {self.layers} attention layers reported in this step"
            )
        self._step_logprobs = torch.log_softmax(logits[0, -1].to(torch.float64), dim=-1)

    def _fold(self, token: int) -> None:
        if self._step_logprobs is None:
            raise ConfigError("no step to count: the model's output layer never ran")
        self._sum_chunk += self._step_chunk
        self._sum_context += self._step_context
        self._logprob_sum += float(self._step_logprobs[token])
        self._steps += 1
        self._step_logprobs = None

    # ------------------------------------------------------------------ result

    def finish(self, generated_ids: Sequence[int]) -> LookbackRecord:
        """Eq. 9 over the counted steps; ``generated_ids`` are the tokens after the prompt."""
        ids = [int(i) for i in generated_ids]
        if not ids or len(ids) != self.forwards:
            raise ConfigError(
                f"{len(ids)} generated tokens for {self.forwards} recorded forward passes; "
                "record exactly one generate() call with at least one new token"
            )
        stopped: Stopped = "eos" if ids[-1] in self.eos_token_ids else "length"
        answer = ids[:-1] if stopped == "eos" else ids
        if answer == ids or not answer:
            self._fold(ids[-1])  # the EOS step counts only for an empty answer
        self._step_logprobs = None
        steps = self._steps
        if not (
            np.isfinite(self._logprob_sum)
            and np.isfinite(self._sum_chunk).all()
            and np.isfinite(self._sum_context).all()
        ):
            # NaN would pass min(0.0, ...) as a certain answer (0.0) or fail the contract
            raise DataError(
                "the model's log-probabilities or attention ratios are not finite (a float16 "
                "overflow?); run it in bfloat16 or float32"
            )
        return LookbackRecord(
            answer_ids=tuple(answer),
            chunk_ratios=(self._sum_chunk / steps).astype(np.float32),
            context_ratios=(self._sum_context / steps).astype(np.float32),
            mean_token_logprob=min(0.0, self._logprob_sum / steps),
            steps=steps,
            stopped=stopped,
        )


def _sliding_windows(text_config: Any, layers: int) -> tuple[int | None, ...]:
    """Per layer, the sliding window of its attention (``None``: it sees every key).

    As transformers' caches read the config: ``layer_types`` when given
    (``sliding_attention`` / ``chunked_attention`` / ``full_attention``), else one
    ``sliding_window`` (or ``attention_chunk_size``) for every layer.
    """
    window = getattr(text_config, "sliding_window", None)
    chunk = getattr(text_config, "attention_chunk_size", None)
    types = getattr(text_config, "layer_types", None)
    if types is None:
        kind = (
            "sliding_attention"
            if window is not None
            else "chunked_attention"
            if chunk is not None
            else "full_attention"
        )
        types = [kind] * layers
    sizes: dict[str, Any] = {"sliding_attention": window, "chunked_attention": chunk}
    return tuple(None if sizes.get(k) is None else int(sizes[k]) for k in list(types)[:layers])


def find_attention_modules(model: Any, layers: int) -> list[Any]:
    """The ``layers`` attention modules of ``model`` (``*.self_attn``, ``*.attn``, ...)."""
    named = list(model.named_modules())
    for suffix in _ATTENTION_SUFFIXES:
        found = [m for name, m in named if name.endswith(suffix)]
        if len(found) == layers:
            return found
    raise ConfigError(
        f"found no set of {layers} attention modules named *{'/*'.join(_ATTENTION_SUFFIXES)}; "
        "pass attention_modules= explicitly"
    )


class LookbackRecorder:
    """Records lookback ratios while a Hugging Face causal LM generates.

    ``model`` must run ``attn_implementation="eager"``; ``eos_token_ids``
    defaults to the model's generation config.
    """

    def __init__(
        self,
        model: Any,
        *,
        eos_token_ids: Sequence[int] | None = None,
        attention_modules: Sequence[Any] | None = None,
    ) -> None:
        config = model.config
        impl = getattr(config, "_attn_implementation", None)
        if impl != "eager":
            raise ConfigError(
                f"the model runs attention with {impl!r}; lookback ratios need "
                "attn_implementation='eager' (fused kernels return no attention probabilities)"
            )
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.layers = int(text.num_hidden_layers)
        self.heads = int(text.num_attention_heads)
        self.windows = _sliding_windows(text, self.layers)
        self.model = model
        self.attention = tuple(attention_modules or find_attention_modules(model, self.layers))
        if len(self.attention) != self.layers:
            raise ConfigError(
                f"{len(self.attention)} attention modules for {self.layers} hidden layers"
            )
        if eos_token_ids is None:
            eos = getattr(model.generation_config, "eos_token_id", None)
            eos_token_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if not eos_token_ids:
            raise ConfigError("at least one end-of-sequence token id is needed")
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        self._active: Recording | None = None

    @contextmanager
    def record(self, prompt_length: int, chunk_spans: Sequence[Span]) -> Iterator[Recording]:
        """Hooks on while the block runs one ``generate()`` over a ``prompt_length`` prompt."""
        rec = Recording(
            layers=self.layers,
            heads=self.heads,
            prompt_length=prompt_length,
            chunk_spans=chunk_spans,
            eos_token_ids=self.eos_token_ids,
            windows=self.windows,
        )

        def pre(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            rec.begin_forward(ids, kwargs.get("position_ids"))

        def attention_hook(index: int) -> Any:
            def hook(_m: Any, _args: Any, output: Any) -> None:
                weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
                rec.layer(index, weights)

            return hook

        def post(_m: Any, _args: Any, output: Any) -> None:
            rec.logits(output.logits if hasattr(output, "logits") else output[0])

        with _RECORDING_LOCK:
            if self._active is not None:
                raise ConfigError("this recorder is already recording; one generation at a time")
            if self.model in _RECORDING:
                raise ConfigError(
                    "another recorder is already recording on this model; one generation at "
                    "a time per model (serialise the generations, e.g. with a lock)"
                )
            _RECORDING.add(self.model)
            self._active = rec
        handles: list[Any] = []
        try:
            handles.append(self.model.register_forward_pre_hook(pre, with_kwargs=True))
            handles += [
                module.register_forward_hook(attention_hook(i))
                for i, module in enumerate(self.attention)
            ]
            handles.append(self.model.register_forward_hook(post))
            yield rec
        finally:
            for handle in handles:
                handle.remove()
            with _RECORDING_LOCK:
                _RECORDING.discard(self.model)
                self._active = None

    def generate(
        self,
        input_ids: Sequence[int],
        chunk_spans: Sequence[Span],
        *,
        max_new_tokens: int = 64,
        **generate_kwargs: Any,
    ) -> LookbackRecord:
        """``model.generate`` (greedy unless told otherwise) with the ratios recorded.

        Extra keyword arguments (``streamer``, ``do_sample``, ``pad_token_id``, ...) go to
        ``generate``; the prompt, its attention mask and the end-of-sequence ids are the
        recorder's.
        """
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        taken = sorted(generate_kwargs.keys() & {"input_ids", "attention_mask", "eos_token_id"})
        if taken:
            raise ConfigError(
                f"{', '.join(taken)} set by the recorder: the prompt is input_ids (one, "
                "unpadded) and the end-of-sequence ids are LookbackRecorder(eos_token_ids=...)"
            )
        config = getattr(self.model, "generation_config", None)
        for name in ("num_beams", "num_return_sequences"):
            value = generate_kwargs.get(name, getattr(config, name, 1))
            if int(value or 1) != 1:
                raise ConfigError(
                    f"the recorder follows one sequence: {name} must be 1, got {value} "
                    f"(pass {name}=1 to override the model's generation config)"
                )
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=self.model.device)
        generate_kwargs.setdefault("do_sample", False)
        generate_kwargs.setdefault("pad_token_id", self.eos_token_ids[0])
        with torch.inference_mode(), self.record(len(input_ids), chunk_spans) as rec:
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                eos_token_id=list(self.eos_token_ids),
                **generate_kwargs,
            )
            sequences = getattr(out, "sequences", out)  # return_dict_in_generate: an output
            return rec.finish(sequences[0, len(input_ids) :].tolist())
