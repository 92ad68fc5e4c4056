"""A tiny randomly initialised BERT saved like the MiniLM folder, and small training settings."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.lab.verifier.settings import TrainConfig, minilm_dir


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 layers, 32 wide (config, safetensors, tokenizer.json): training takes seconds."""
    torch = pytest.importorskip("torch", reason="the [ml] extra (torch) trains the verifier")
    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    tiny_bert().save_pretrained(folder)
    shutil.copyfile(minilm_dir() / "tokenizer.json", folder / "tokenizer.json")
    return folder


def tiny_bert() -> Any:
    """A randomly initialised BERT of 2 layers, 32 wide, with MiniLM's vocabulary (seed first)."""
    transformers = pytest.importorskip("transformers", reason="the [ml] extra trains the verifier")
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return transformers.BertModel(config, add_pooling_layer=False)


def small_config(base: Path, work: Path, **changes: object) -> TrainConfig:
    """Settings for ``tiny_base``: 48 tokens, batches of 4, checkpoints every 3 steps."""
    config = TrainConfig(
        halueval_path=work / "unused.json",
        nq_path=None,
        base_model_dir=base,
        max_length=48,
        batch_size=4,
        epochs=2,
        freeze_layers=0,
        threads=1,
        question_in_input=True,
        work_dir=work,
        checkpoint_every=3,
        keep_checkpoints=5,
    )
    return replace(config, **changes)  # type: ignore[arg-type]
