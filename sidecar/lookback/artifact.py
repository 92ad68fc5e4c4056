"""The lookback model directory: ``model.onnx`` plus ``metadata.json`` that describes it.

The metadata says what the classifier may score and how its input is built:
the generator model id, L, H, K and the variant (checked against every
``GenerationFinal`` event's ``AttentionSummary``), the padding and scaling
convention (:mod:`sidecar.lookback.features`), the ONNX input / output names,
the sha256 of the ONNX bytes (checked on load), the training data hash, split
and metrics, and golden outputs: a few feature vectors with the p(factual) the
export computed, which the scorer recomputes at load (:mod:`sidecar.golden`).
``version`` = ``<name>@<first 12 hex of the ONNX sha256>`` is what verdicts
report as the lookback model version; golden outputs live in this JSON, not in
the ONNX file, so adding them leaves the sha256 and the version unchanged.

Pure pydantic, hashlib and numpy: no onnxruntime, no scikit-learn.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidecar.contracts.codec import summarise_validation
from sidecar.exceptions import ArtifactError
from sidecar.golden import GoldenOutputs
from sidecar.lookback.features import feature_vector

__all__ = [
    "GOLDEN_CASES",
    "GOLDEN_DECIMALS",
    "GOLDEN_TOLERANCE",
    "METADATA_FILE",
    "MODEL_FORMAT",
    "ONNX_FILE",
    "PADDING",
    "LookbackMetrics",
    "LookbackModelMetadata",
    "LookbackTraining",
    "golden_features",
    "load_metadata",
    "save_metadata",
]

MODEL_FORMAT: Final = "lookback-classifier/1"
METADATA_FILE = "metadata.json"
ONNX_FILE = "model.onnx"
PADDING = (
    "cw: keep the trusted chunks' columns in retrieval order (all columns without an ok "
    "certification), then zero columns up to K; fc: none (K = 1)"
)
# Max |p(factual) - golden p(factual)| at load (one vector at a time and as one batch). Chosen
# from measured drift across instruction sets, threads and batching with headroom; the numbers
# are in models/lookback/README.md ("Same outputs on every x86 CPU").
GOLDEN_TOLERANCE = 1e-5
GOLDEN_CASES = 5
GOLDEN_DECIMALS = 4  # golden inputs are stored rounded, so JSON holds them exactly as read


def golden_features(
    layers: int, heads: int, chunks: int, cases: int = GOLDEN_CASES, seed: int = 0
) -> list[list[float]]:
    """Fixed feature vectors for golden outputs, built as the scorer builds served ones.

    Case ``i`` has lookback ratios for ``min(i, chunks)`` trusted chunks (seeded
    gamma draws), padded and scaled by :func:`~sidecar.lookback.features.feature_vector`:
    case 0 is the all-zero vector of an answer without a trusted chunk. Values are
    rounded to :data:`GOLDEN_DECIMALS` decimals, so the JSON holds them exactly.
    """
    rng = np.random.default_rng(seed)
    out: list[list[float]] = []
    for i in range(cases):
        ratios = rng.gamma(2.0, 0.5, size=(layers, heads, min(i, chunks)))
        vector = feature_vector(ratios, chunks)
        out.append([round(float(v), GOLDEN_DECIMALS) for v in vector])
    return out


class LookbackMetrics(BaseModel):
    """Held-out and training performance, with two one-number baselines."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(ge=0)
    n_train: int = Field(ge=0)
    n_test: int = Field(ge=0)
    positive_rate: float
    train_positive_rate: float
    test_positive_rate: float
    train_auroc: float
    test_auroc: float
    test_auroc_mean_logprob: float | None = Field(
        default=None, description="baseline: mean token log-probability alone"
    )
    test_auroc_answer_tokens: float | None = Field(
        default=None, description="baseline: answer length in tokens alone (shorter = correct)"
    )


class LookbackTraining(BaseModel):
    """How the classifier was trained."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    estimator: str
    sklearn_version: str
    data_dir: str
    data_sha256: str
    questions_sha256: str
    question_part: str
    question_split_seed: int
    question_eval_fraction: float
    corpus_fingerprint: str
    embedder: str
    chunk_words: int
    max_new_tokens: int
    split: str
    train_fraction: float
    seed: int
    train_qids_sha256: str


class LookbackModelMetadata(BaseModel):
    """``metadata.json`` of a lookback model directory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["lookback-classifier/1"] = MODEL_FORMAT
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._\-]+$")
    generator_model: str = Field(min_length=1)
    layers: int = Field(ge=1)
    heads: int = Field(ge=1)
    chunks: int = Field(ge=1, description="K of the feature vector (1 for fc)")
    variant: Literal["cw", "fc"]
    scaling: Literal["per-sample-minmax"] = "per-sample-minmax"
    padding: str = PADDING
    feature_order: Literal["C(layer,head,chunk)"] = "C(layer,head,chunk)"
    prompt_template: str
    step_convention: str
    onnx_file: str = ONNX_FILE
    onnx_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    onnx_input: str
    onnx_output: str
    onnx_opset: int
    training: LookbackTraining
    metrics: LookbackMetrics
    # p(factual) of golden feature vectors at export, checked when the scorer loads
    # (None: a model written before golden outputs existed; it loads with a warning).
    golden: GoldenOutputs[list[float]] | None = None
    created_at: datetime

    @property
    def version(self) -> str:
        """``name@<12 hex of the ONNX sha256>``: reported in verdicts."""
        return f"{self.name}@{self.onnx_sha256[:12]}"

    @property
    def n_features(self) -> int:
        """L * H * K."""
        return self.layers * self.heads * self.chunks


def load_metadata(model_dir: str | Path) -> tuple[LookbackModelMetadata, bytes]:
    """The metadata of ``model_dir`` and its ONNX bytes, hash-checked."""
    root = Path(model_dir)
    meta_path = root / METADATA_FILE
    if not meta_path.is_file():
        raise ArtifactError(f"{root} is not a lookback model directory ({METADATA_FILE} missing)")
    try:
        meta = LookbackModelMetadata.model_validate_json(meta_path.read_text("utf-8"))
    except ValidationError as exc:
        raise ArtifactError(
            f"{meta_path} is not valid lookback model metadata: {summarise_validation(exc, 5)}"
        ) from None
    except (OSError, ValueError) as exc:  # not UTF-8, unreadable
        raise ArtifactError(f"{meta_path} cannot be read: {exc}") from None
    onnx_path = root / meta.onnx_file
    if not onnx_path.is_file():
        raise ArtifactError(f"{onnx_path} is missing")
    data = onnx_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta.onnx_sha256:
        raise ArtifactError(
            f"{onnx_path} has sha256 {digest[:12]}..., metadata says {meta.onnx_sha256[:12]}...: "
            "the model file was changed after training"
        )
    return meta, data


def save_metadata(model_dir: str | Path, metadata: LookbackModelMetadata) -> Path:
    """Write ``model_dir/metadata.json`` (the ONNX file is written by its producer)."""
    path = Path(model_dir) / METADATA_FILE
    path.write_text(metadata.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return path
