"""Memory of the LookbackRecorder against the generation length, layers, heads and chunks.

For tiny seeded Llama and Qwen2 models (random weights, eager attention, CPU) and
several generation lengths T, measures what the recorder retains between hook
calls (its running arrays), the largest transient a hook makes (one ``H x keys``
row), the Python-heap peak during ``generate`` (tracemalloc: numpy state and
Python objects; torch's CPU allocator is not traced) with and without the
recorder, and, for contrast, the
attention tensors ``generate(output_attentions=True, return_dict_in_generate=True)``
keeps. Writes one JSON file (not a timed test).

    PYTHONPATH=. .venv/bin/python bench/recorder_memory.py --out bench/results/recorder_memory.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tracemalloc
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from guardrail_client.hf import LookbackRecorder

VOCAB = 128
NO_EOS = VOCAB + 1  # an id the model cannot emit: every run makes exactly T steps


def _model(arch: str, layers: int, heads: int) -> Any:
    torch.manual_seed(0)
    fields: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 8 * heads,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads // 2,
        "max_position_embeddings": 8192,
        "attn_implementation": "eager",
    }
    pair: tuple[Any, Any] = (
        (LlamaForCausalLM, LlamaConfig) if arch == "llama" else (Qwen2ForCausalLM, Qwen2Config)
    )
    cls, cfg = pair
    return cls(cfg(**fields)).eval()


def _prompt(chunks: int, chunk_tokens: int) -> tuple[list[int], list[tuple[int, int]]]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (16 + chunks * chunk_tokens + 16,), generator=gen).tolist()
    spans = [(16 + i * chunk_tokens, 16 + (i + 1) * chunk_tokens) for i in range(chunks)]
    return ids, spans


def _recorder_run(model: Any, ids: list[int], spans: Any, steps: int) -> dict[str, int]:
    recorder = LookbackRecorder(model, eos_token_ids=[NO_EOS])
    peak_state = 0
    tensor = torch.tensor([ids])
    tracemalloc.start()
    with torch.inference_mode(), recorder.record(len(ids), spans) as rec:

        def watch(*_: Any) -> None:
            nonlocal peak_state
            peak_state = max(peak_state, rec.state_bytes())

        handle = model.register_forward_hook(watch)
        out = model.generate(
            input_ids=tensor,
            attention_mask=torch.ones_like(tensor),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            eos_token_id=NO_EOS,
            pad_token_id=0,
        )
        handle.remove()
    _, heap_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    record = rec.finish(out[0, len(ids) :].tolist())
    if record.steps != steps:
        raise RuntimeError(f"recorded {record.steps} steps, expected {steps}")
    return {
        "recorder_state_peak_bytes": peak_state,
        "recorder_hook_transient_peak_bytes": rec.peak_work_bytes,
        "python_heap_peak_bytes": heap_peak,
    }


def _plain_heap_peak(model: Any, ids: list[int], steps: int) -> int:
    """tracemalloc peak of the same generate() without the recorder (the baseline)."""
    tensor = torch.tensor([ids])
    tracemalloc.start()
    with torch.inference_mode():
        model.generate(
            input_ids=tensor,
            attention_mask=torch.ones_like(tensor),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            eos_token_id=NO_EOS,
            pad_token_id=0,
        )
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def _naive_bytes(model: Any, ids: list[int], steps: int) -> int:
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            input_ids=tensor,
            attention_mask=torch.ones_like(tensor),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            eos_token_id=NO_EOS,
            pad_token_id=0,
            output_attentions=True,
            return_dict_in_generate=True,
        )
    return sum(a.element_size() * a.nelement() for step in out.attentions for a in step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for arch in ("llama", "qwen2"):
        for layers, heads, chunks in ((4, 8, 4), (8, 8, 4), (4, 16, 4), (4, 8, 8)):
            model = _model(arch, layers, heads)
            ids, spans = _prompt(chunks, 32)
            lengths = args.lengths if (layers, heads, chunks) == (4, 8, 4) else args.lengths[:1]
            for steps in lengths:
                row = {
                    "arch": arch,
                    "layers": layers,
                    "heads": heads,
                    "chunks": chunks,
                    "prompt_tokens": len(ids),
                    "new_tokens": steps,
                    "python_heap_peak_bytes_without_recorder": _plain_heap_peak(model, ids, steps),
                    **_recorder_run(model, ids, spans, steps),
                    "generate_output_attentions_bytes": _naive_bytes(model, ids, steps),
                }
                rows.append(row)
                print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "recorder_memory",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "vocab": VOCAB,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
