"""The lookback dataset on disk: resumable shards of ratios, labels and records.

A dataset directory holds::

    meta.json                  LookbackDatasetMeta: generator, shape, prompt, retrieval, split
    shards/part-00000.jsonl    one JSON record per question (answer, hits, label, timings)
    shards/part-00000.npz      qid, label, cw (n, L, H, K) f16, fc (n, L, H) f16, logprob, steps

Ratios are stored as float16, exactly what an ``AttentionSummary`` carries on
the wire, so the trainer sees the very values the sidecar will score. A shard
is committed by writing its ``.jsonl`` and then atomically renaming its
``.npz`` into place; a shard without its ``.npz`` never happened, so an
interrupted build resumes at the first question not in a committed shard.

The question split (``fit`` part for dataset building and training, ``eval``
part for ``guardrail eval lookback``) is a deterministic hash split of the
question file (:func:`sidecar.lab.retrieval.split.split_indices`), so the two
commands agree on it without sharing state and never overlap.

Pure numpy, pydantic and JSON: no torch, no scikit-learn.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.lab.retrieval.corpus import QARecord
from sidecar.lab.retrieval.split import Split, select_split

__all__ = [
    "DATASET_FORMAT",
    "EVAL_FRACTION",
    "LOOKBACK_SPLIT_SEED",
    "LookbackDataset",
    "LookbackDatasetMeta",
    "Part",
    "ShardRows",
    "ShardWriter",
    "load_dataset",
    "select_part",
]

DATASET_FORMAT: Final = "lookback-dataset/1"
LOOKBACK_SPLIT_SEED = 4033
"""Seed of the fit / eval question split (independent of the retrieval calibration split)."""
EVAL_FRACTION = 0.25
"""Share of the question file held out for ``guardrail eval lookback``."""

Part = Literal["fit", "eval", "all"]
T = TypeVar("T", bound=QARecord)


_SPLIT_OF: Final[dict[str, Split]] = {"eval": "cal", "fit": "test", "all": "all"}


def select_part(
    records: Sequence[T],
    part: Part,
    *,
    seed: int = LOOKBACK_SPLIT_SEED,
    eval_fraction: float = EVAL_FRACTION,
    limit: int | None = None,
) -> list[T]:
    """The questions of ``part`` in file order (``all``: every question), first ``limit`` only.

    The question split of :func:`sidecar.lab.retrieval.split.select_split`, its first part
    (``eval_fraction`` of the file) held out as ``eval``, the rest ``fit``.
    """
    return select_split(
        records, _SPLIT_OF[part], seed=seed, cal_fraction=eval_fraction, max_questions=limit
    )


class LookbackDatasetMeta(BaseModel):
    """What produced a dataset; a resumed build must match it field for field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["lookback-dataset/1"] = DATASET_FORMAT
    generator_model: str
    layers: int = Field(ge=1)
    heads: int = Field(ge=1)
    k: int = Field(ge=1, description="K: chunks retrieved and put in every prompt")
    prompt_template: str
    max_new_tokens: int = Field(ge=1)
    step_convention: str
    embedder: str
    chunk_words: int = Field(ge=1)
    corpus_fingerprint: str
    questions_file: str
    questions_sha256: str
    part: Part
    split_seed: int
    eval_fraction: float
    label: str = "nq-open normalised gold answer contained in the answer"
    created_at: datetime | None = None

    def compatible(self, other: LookbackDatasetMeta) -> list[str]:
        """Fields (other than ``created_at`` and the file path) that differ from ``other``."""
        mine = self.model_dump(exclude={"created_at", "questions_file"})
        theirs = other.model_dump(exclude={"created_at", "questions_file"})
        return sorted(k for k in mine if mine[k] != theirs[k])


@dataclass(frozen=True, slots=True)
class ShardRows:
    """Rows of one shard, in processing order."""

    qid: npt.NDArray[np.int64]
    label: npt.NDArray[np.int8]
    cw: npt.NDArray[np.float16]
    fc: npt.NDArray[np.float16]
    logprob: npt.NDArray[np.float64]
    steps: npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class LookbackDataset:
    """Every committed row of a dataset directory, sorted by question id."""

    meta: LookbackDatasetMeta
    rows: ShardRows
    records: tuple[dict[str, Any], ...]

    def __len__(self) -> int:
        return int(self.rows.qid.shape[0])

    def ratios(self, variant: Literal["cw", "fc"]) -> npt.NDArray[np.float16]:
        """``(n, L, H, K)`` for ``cw``, ``(n, L, H, 1)`` for ``fc`` (the wire shapes)."""
        if variant == "cw":
            return self.rows.cw
        if variant == "fc":
            return self.rows.fc[..., None]
        raise ConfigError(f"variant must be 'cw' or 'fc', got {variant!r}")

    @property
    def positive_rate(self) -> float:
        """Share of correct answers."""
        return float(self.rows.label.mean()) if len(self) else 0.0

    def sha256(self) -> str:
        """Hash of the rows (qid, label, both ratio arrays): identifies the training data."""
        h = hashlib.sha256()
        for arr in (self.rows.qid, self.rows.label, self.rows.cw, self.rows.fc):
            h.update(str(arr.dtype).encode())
            h.update(str(arr.shape).encode())
            h.update(np.ascontiguousarray(arr).tobytes())
        return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ShardWriter:
    """Appends committed shards to a dataset directory (creating or resuming it)."""

    def __init__(self, directory: str | Path, meta: LookbackDatasetMeta) -> None:
        self.directory = Path(directory)
        self.shards = self.directory / "shards"
        self.shards.mkdir(parents=True, exist_ok=True)
        meta_path = self.directory / "meta.json"
        if meta_path.is_file():
            existing = LookbackDatasetMeta.model_validate_json(meta_path.read_text("utf-8"))
            diff = existing.compatible(meta)
            if diff:
                raise ConfigError(
                    f"{self.directory} holds a dataset built with other settings "
                    f"({', '.join(diff)} differ); use a new --out directory"
                )
            self.meta = existing
        else:
            self.meta = meta.model_copy(update={"created_at": datetime.now(UTC)})
            _atomic_write(meta_path, self.meta.model_dump_json(indent=2).encode("utf-8"))
        self._next = len(_committed(self.shards))

    def done_qids(self) -> set[int]:
        """Question ids already in committed shards."""
        done: set[int] = set()
        for npz in _committed(self.shards):
            with np.load(npz) as data:
                done.update(int(q) for q in data["qid"])
        return done

    def write(self, rows: ShardRows, records: Sequence[dict[str, Any]]) -> Path:
        """Commit one shard: records first, then the ``.npz`` (the commit marker)."""
        n = int(rows.qid.shape[0])
        if n == 0:
            raise ConfigError("an empty shard cannot be written")
        if len(records) != n:
            raise ConfigError(f"{len(records)} records for {n} rows")
        stem = f"part-{self._next:05d}"
        lines = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
        _atomic_write(self.shards / f"{stem}.jsonl", lines.encode("utf-8"))
        buf = _npz_bytes(rows)
        target = self.shards / f"{stem}.npz"
        _atomic_write(target, buf)
        self._next += 1
        return target


def _npz_bytes(rows: ShardRows) -> bytes:
    import io  # noqa: PLC0415 - only for writing

    out = io.BytesIO()
    np.savez(
        out,
        qid=rows.qid.astype(np.int64),
        label=rows.label.astype(np.int8),
        cw=rows.cw.astype(np.float16),
        fc=rows.fc.astype(np.float16),
        logprob=rows.logprob.astype(np.float64),
        steps=rows.steps.astype(np.int32),
    )
    return out.getvalue()


def _committed(shards: Path) -> list[Path]:
    return sorted(shards.glob("part-*.npz"))


def load_dataset(directory: str | Path) -> LookbackDataset:
    """All committed shards of ``directory``, rows and records sorted by question id."""
    root = Path(directory)
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise ArtifactError(f"{root} is not a lookback dataset (meta.json missing)")
    meta = LookbackDatasetMeta.model_validate_json(meta_path.read_text("utf-8"))
    parts: dict[str, list[npt.NDArray[Any]]] = {
        k: [] for k in ("qid", "label", "cw", "fc", "logprob", "steps")
    }
    records: list[dict[str, Any]] = []
    for npz in _committed(root / "shards"):
        with np.load(npz) as data:
            for key, acc in parts.items():
                acc.append(data[key])
        jsonl = npz.with_suffix(".jsonl")
        if not jsonl.is_file():
            raise ArtifactError(f"{npz} has no records file {jsonl.name}")
        records.extend(json.loads(line) for line in jsonl.read_text("utf-8").split("\n") if line)
    if not parts["qid"]:
        raise ArtifactError(f"{root} holds no committed shard yet")
    qid = np.concatenate(parts["qid"]).astype(np.int64)
    if len(np.unique(qid)) != len(qid):
        raise ArtifactError(f"{root} holds a question more than once")
    if len(records) != len(qid):
        raise ArtifactError(f"{root}: {len(records)} records for {len(qid)} rows")
    order = np.argsort(qid, kind="stable")
    rows = ShardRows(
        qid=qid[order],
        label=np.concatenate(parts["label"]).astype(np.int8)[order],
        cw=np.concatenate(parts["cw"]).astype(np.float16)[order],
        fc=np.concatenate(parts["fc"]).astype(np.float16)[order],
        logprob=np.concatenate(parts["logprob"]).astype(np.float64)[order],
        steps=np.concatenate(parts["steps"]).astype(np.int32)[order],
    )
    expected = (meta.layers, meta.heads, meta.k)
    if rows.cw.shape[1:] != expected or rows.fc.shape[1:] != expected[:2]:
        raise ArtifactError(
            f"{root}: ratio arrays of shape {rows.cw.shape[1:]} / {rows.fc.shape[1:]}, "
            f"meta.json says L x H x K = {expected}"
        )
    by_qid = {int(r["qid"]): r for r in records}
    return LookbackDataset(meta=meta, rows=rows, records=tuple(by_qid[int(q)] for q in rows.qid))
