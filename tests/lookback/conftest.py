"""Synthetic lookback datasets and trained models (no generator needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sidecar.lab.lookback.dataset import LookbackDatasetMeta, ShardRows, ShardWriter

GENERATOR = "test/tiny-generator"
LAYERS, HEADS, K = 4, 3, 3


def make_meta(**overrides: object) -> LookbackDatasetMeta:
    fields: dict[str, object] = {
        "generator_model": GENERATOR,
        "layers": LAYERS,
        "heads": HEADS,
        "k": K,
        "prompt_template": "test/1",
        "max_new_tokens": 8,
        "step_convention": "produce-token/v1",
        "embedder": "test-embedder",
        "chunk_words": 64,
        "corpus_fingerprint": "0" * 64,
        "questions_file": "questions.jsonl",
        "questions_sha256": "1" * 64,
        "part": "fit",
        "split_seed": 4033,
        "eval_fraction": 0.25,
    }
    fields.update(overrides)
    return LookbackDatasetMeta.model_validate(fields)


def synthetic_rows(n: int, seed: int = 0, start: int = 0) -> ShardRows:
    """Correct answers look more at chunk 1 in the later layers (a learnable pattern)."""
    rng = np.random.default_rng(seed)
    label = (rng.uniform(size=n) < 0.4).astype(np.int8)
    cw = rng.gamma(2.0, 0.5, size=(n, LAYERS, HEADS, K))
    cw[:, 2:, :, 0] += 1.5 * label[:, None, None]
    fc = rng.uniform(0.3, 1.0, size=(n, LAYERS, HEADS))
    fc[:, 3, :] += 0.3 * label[:, None]
    return ShardRows(
        qid=np.arange(start, start + n, dtype=np.int64),
        label=label,
        cw=cw.astype(np.float16),
        fc=fc.astype(np.float16),
        logprob=-rng.uniform(0.1, 2.0, size=n),
        steps=rng.integers(1, 9, size=n).astype(np.int32),
    )


def write_dataset(
    directory: Path, n: int = 240, shard: int = 60, *, part: str = "fit", seed: int = 0
) -> Path:
    writer = ShardWriter(directory, make_meta(part=part))
    for i, start in enumerate(range(0, n, shard)):
        rows = synthetic_rows(min(shard, n - start), seed=seed + i, start=start)
        records = [
            {"qid": int(q), "answer": f"a{q}", "correct": bool(y)}
            for q, y in zip(rows.qid, rows.label, strict=True)
        ]
        writer.write(rows, records)
    return directory


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("lookback-data"))


@pytest.fixture(scope="session")
def cw_model(dataset_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sidecar.lab.lookback.training import train_and_export

    out = tmp_path_factory.mktemp("models") / "tiny-cw"
    train_and_export(dataset_dir, out, variant="cw", name="tiny-cw")
    return out


@pytest.fixture(scope="session")
def fc_model(dataset_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sidecar.lab.lookback.training import train_and_export

    out = tmp_path_factory.mktemp("models") / "tiny-fc"
    train_and_export(dataset_dir, out, variant="fc", name="tiny-fc")
    return out
