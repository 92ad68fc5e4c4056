"""Resumable training state: the run's objects, its settings fingerprint and checkpoint files.

A checkpoint holds what a resumed run needs to continue exactly where the
last one stopped (same batches, same dropout masks): the model, optimizer
and scheduler states, the RNG states and the step (the position in the
seeded batch plan); the sha256 of the training pairs and the settings
fingerprint guard against resuming on other data or settings.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.lab.verifier.ml import torch
from sidecar.lab.verifier.model import CrossEncoder
from sidecar.lab.verifier.settings import TrainConfig
from sidecar.lab.verifier.sources import Pair

__all__ = ["Checkpoints", "TrainingRun", "fingerprint", "pairs_sha256"]


def pairs_sha256(pairs: Sequence[Pair]) -> str:
    """sha256 over the pairs' claims, evidence and labels, in order (a checkpoint's data key)."""
    h = hashlib.sha256()
    for p in pairs:
        h.update(json.dumps([p.claim, p.evidence, p.label]).encode("utf-8"))
    return h.hexdigest()


def fingerprint(cfg: TrainConfig, total_steps: int) -> dict[str, str]:
    """The settings a resumed run must share with the run that wrote the checkpoint."""
    names = (
        "seed", "batch_size", "epochs", "max_steps", "learning_rate", "head_learning_rate",
        "freeze_layers", "warmup_fraction", "max_length", "question_in_input", "question_dropout",
    )  # fmt: skip
    found = {name: str(getattr(cfg, name)) for name in names} | {"total_steps": str(total_steps)}
    if cfg.pairwise_weight or cfg.init_from is not None:  # absent from older checkpoints
        found |= {"pairwise_weight": str(cfg.pairwise_weight), "init_from": str(cfg.init_from)}
    if cfg.layers is not None:
        found |= {"layers": str(cfg.layers)}
    if cfg.distill_weight:
        found |= {"teacher": str(cfg.teacher), "distill_weight": str(cfg.distill_weight)}
    return found


@dataclass(frozen=True, slots=True)
class TrainingRun:
    """One training run: the network, its optimizer and schedule, and the batch plan."""

    model: CrossEncoder
    optim: Any
    sched: Any
    plan: list[list[Pair]]
    pairs_sha256: str
    fingerprint: dict[str, str]
    device: str = "cpu"  # where the steps ran, as the card says it ("cuda (NVIDIA H100 ...)")


class Checkpoints:
    """``step-NNNNNNN.pt`` files in one folder: written atomically, the newest ``keep`` kept.

    A checkpoint holds the model, optimizer and scheduler states, the RNG
    states (torch, numpy, Python; CUDA after a GPU run), the step (the position in the seeded batch
    plan), the sha256 of the training pairs, the settings fingerprint and the
    loss history; ``progress.json`` beside them says where training stands.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.history: list[dict[str, float]] = []
        self.validation: list[dict[str, float]] = []

    def all(self) -> list[Path]:
        return sorted(self.folder.glob("step-*.pt"))

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None

    def save(
        self,
        run: TrainingRun,
        step: int,
        *,
        history: list[dict[str, float]],
        validation: list[dict[str, float]],
        keep: int,
    ) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "pairs_sha256": run.pairs_sha256,
            "fingerprint": run.fingerprint,
            "device": run.device,
            "model": run.model.state_dict(),
            "optimizer": run.optim.state_dict(),
            "scheduler": run.sched.state_dict(),
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
                # dropout masks of a run on a GPU come from the CUDA generator
                **({"cuda": torch.cuda.get_rng_state_all()} if run.device != "cpu" else {}),
            },
            "history": history,
            "validation": validation,
        }
        path = self.folder / f"step-{step:07d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
        for old in self.all()[:-keep]:
            old.unlink()
        progress = {
            "step": step,
            "total_steps": len(run.plan),
            "checkpoint": str(path),
            "loss": history[-1]["loss"] if history else None,
            "seconds": history[-1]["seconds"] if history else None,
            "validation": validation[-1] if validation else None,
            "written_at": datetime.now(UTC).isoformat(),
        }
        (self.folder / "progress.json").write_text(json.dumps(progress, indent=2), encoding="utf-8")
        return path

    def load(self, path: Path | None = None) -> dict[str, Any]:
        """The newest checkpoint (or ``path``) as saved."""
        path = path or self.latest()
        if path is None:
            raise ArtifactError(f"no checkpoint under {self.folder}")
        state: dict[str, Any] = torch.load(
            path, map_location="cpu", weights_only=False
        )  # our own file
        return state

    def restore(self, run: TrainingRun) -> int:
        """Load the newest checkpoint into the objects; the step to continue from."""
        state = self.load()
        if state["pairs_sha256"] != run.pairs_sha256:
            raise ConfigError(
                f"the checkpoints under {self.folder} were trained on other pairs "
                f"(sha256 {state['pairs_sha256'][:12]}..., now {run.pairs_sha256[:12]}...): "
                "use the same corpus or another work dir"
            )
        saved, now = state["fingerprint"], run.fingerprint
        changed = {
            k: (saved.get(k), now.get(k)) for k in sorted(saved.keys() | now.keys())
            if saved.get(k) != now.get(k)
        }  # fmt: skip
        if changed:
            detail = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            raise ConfigError(f"resume needs the settings of the checkpoint; changed: {detail}")
        run.model.load_state_dict(state["model"])
        run.optim.load_state_dict(state["optimizer"])
        run.sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.history = list(state["history"])
        self.validation = list(state["validation"])
        return int(state["step"])
