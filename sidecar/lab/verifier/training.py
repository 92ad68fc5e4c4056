"""The verifier training recipes: QA-only train and ship, corpus fit, export from a checkpoint.

The claim check (docs/methods.md §Claim verification) asks an LLM about
each claim; the sidecar replaces that call by a small cross-encoder
(:mod:`sidecar.lab.verifier.model`) so every claim can be checked
mid-stream on CPU. No licensed NLI model is available offline (data README),
so it is trained here:

* **data**: :mod:`sidecar.lab.verifier.datasets` - HaluEval QA and NQ-open pairs
  built so that length does not predict the label (length-only AUROC of the
  training mixture is recorded in the artifact); split by question hash;
  optionally in-domain pairs (:mod:`sidecar.lab.verifier.mixing`);
* **lifecycle**: :class:`~sidecar.lab.verifier.trainer.VerifierTrainer`
  (fit -> export -> calibrate -> artifact), checked by
  :mod:`sidecar.lab.verifier.export` (parity, the int8 gate, held-out
  scores) and described by :mod:`sidecar.lab.verifier.card`.

Reproduce with ``guardrail train verifier --out models/verifier`` (fixed
seeds; ``--limit N`` trains on fewer records).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from sidecar.claims.artifact import VerifierArtifact
from sidecar.claims.verifier import OnnxVerifier, PairEncoder, save_artifact
from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.lab.verifier.card import render_card, render_corpus_card
from sidecar.lab.verifier.checkpoints import Checkpoints, pairs_sha256
from sidecar.lab.verifier.datasets import CorpusConfig, length_auroc, read_corpus
from sidecar.lab.verifier.export import evaluate_onnx, int8_holds, onnx_parity, score_sets
from sidecar.lab.verifier.mixing import load_or_build_corpus, mix, outcome_counts, outcome_split
from sidecar.lab.verifier.ml import BertModel
from sidecar.lab.verifier.model import CrossEncoder, lowest_layers
from sidecar.lab.verifier.outcomes import read_outcome_rows
from sidecar.lab.verifier.pairs import build_eval_sets, build_training_pairs
from sidecar.lab.verifier.settings import (
    CARD_FILE,
    FP32_FILE,
    INT8_FILE,
    TOKENIZER_FILE,
    TrainConfig,
)
from sidecar.lab.verifier.sources import Pair, read_halueval_qa, read_nq_open
from sidecar.lab.verifier.trainer import VerifierTrainer

__all__ = ["export_from_checkpoint", "fit_on_corpus", "train_verifier"]

log = logging.getLogger(__name__)


def train_verifier(config: TrainConfig, out_dir: Path) -> VerifierArtifact:
    """The whole recipe: data -> fit -> export -> calibrate -> evaluate -> ship -> card."""
    if not config.halueval_path.is_file():
        raise ConfigError(f"HaluEval QA file not found: {config.halueval_path}")
    qa = read_halueval_qa(config.halueval_path)
    nq = read_nq_open(config.nq_path) if config.nq_path is not None else []
    held = {r.question.strip().lower() for p in config.holdout for r in read_outcome_rows(p)}
    nq = [r for r in nq if r.question.strip().lower() not in held]
    limit_nq = None if config.limit is None else max(1, config.limit // 4)
    train = build_training_pairs(
        qa, nq, "train", seed=config.seed, limit_qa=config.limit, limit_nq=limit_nq
    )
    val = build_training_pairs(
        qa,
        nq,
        "val",
        seed=config.seed + 1,
        limit_qa=config.val_limit,
        limit_nq=config.val_limit // 4,
    )
    sets = build_eval_sets(qa, nq, split="test", seed=config.seed + 2, limit=config.test_limit)
    outcomes = outcome_split(config, held)
    train = mix(train, outcomes["train"] * config.outcomes_repeat, config.seed)
    val = [*val, *outcomes["val"]]
    log.info(
        "pairs: train %d (length AUROC %.3f), val %d, test %s",
        len(train), length_auroc(train), len(val), {k: len(v) for k, v in sets.items()},
    )  # fmt: skip
    trainer = VerifierTrainer(config).fit(train)
    fp32_path = trainer.export(out_dir)
    trainer.calibrate(val)
    parity = onnx_parity(trainer, out_dir, val[:64])
    fp32 = evaluate_onnx(out_dir, FP32_FILE, sets, *trainer.calibrations[FP32_FILE])
    int8 = evaluate_onnx(out_dir, INT8_FILE, sets, *trainer.calibrations[INT8_FILE])
    ship_int8 = int8_holds(fp32, int8, config.int8_tolerance)
    metrics: dict[str, dict[str, float | int | str]] = {
        **{f"fp32/{k}": v for k, v in fp32.items()},
        **{f"int8/{k}": v for k, v in int8.items()},
        "parity": parity,
        "training": {
            "steps": trainer.steps,
            "seconds": round(trainer.history[-1]["seconds"], 1) if trainer.history else 0.0,
            "final_loss": round(trainer.history[-1]["loss"], 4) if trainer.history else 0.0,
            "shipped": "int8" if ship_int8 else "fp32",
            "config": json.dumps({k: str(v) for k, v in asdict(config).items()}),
        },
    }
    if config.outcomes or config.lookback:
        metrics["outcomes"] = {
            "train_pairs": len(outcomes["train"]),
            "val_pairs": len(outcomes["val"]),
            "length_auroc_train": round(length_auroc(outcomes["train"]), 4),
            **{f"claims_{k}": v for k, v in sorted(outcome_counts(outcomes["train"]).items())},
        }
    shipped = out_dir / (INT8_FILE if ship_int8 else FP32_FILE)
    artifact = trainer.artifact(shipped, metrics)
    save_artifact(out_dir, artifact)
    if ship_int8:
        fp32_path.unlink()  # 90 MB: not shipped (the card keeps its numbers)
    (out_dir / CARD_FILE).write_text(render_card(artifact, config, sets), encoding="utf-8")
    return artifact


def fit_on_corpus(
    config: TrainConfig, corpus_config: CorpusConfig, *, resume: bool = False
) -> VerifierTrainer:
    """Fit on the whole mixture (:func:`~sidecar.lab.verifier.datasets.build_corpus`), resumably.

    Checkpoints go to ``config.work_dir/checkpoints``; the corpus is cached in
    ``config.work_dir/corpus``. A fixed seeded slice of the validation pairs
    is scored at every checkpoint for the log.
    """
    if config.work_dir is None:
        raise ConfigError("training on the corpus needs a work_dir (checkpoints, corpus cache)")
    corpus = load_or_build_corpus(corpus_config, config.work_dir)
    log.info("train pairs %s", corpus.manifest["train"])
    trainer = VerifierTrainer(config)
    rng = random.Random(config.seed)  # noqa: S311 - a monitoring slice, not cryptography
    trainer.monitor = rng.sample(corpus.val, min(config.monitor_pairs, len(corpus.val)))
    return trainer.fit(corpus.train, resume=resume)


def _sample(pairs: Sequence[Pair], limit: int | None, seed: int) -> list[Pair]:
    if limit is None or len(pairs) <= limit:
        return list(pairs)
    return random.Random(seed).sample(list(pairs), limit)  # noqa: S311 - an eval subsample


def export_from_checkpoint(
    config: TrainConfig,
    out_dir: Path,
    *,
    checkpoint: Path | None = None,
    calibration_pairs: int = 2000,
    test_limit: int | None = 800,
    compare: Path | None = None,
    command: str = "",
) -> VerifierArtifact:
    """A checkpoint of the corpus run -> ONNX (fp32, int8) -> calibrate -> held-out sets -> card.

    Calibration and band: a seeded sample of ``calibration_pairs`` validation
    pairs. Held-out: every test set of the corpus (at most ``test_limit`` pairs
    each, seeded), for fp32, int8 and, with ``compare``, another verifier
    directory (the shipped one) scored on the same pairs through its own
    input settings. Writes ``out_dir`` (never the shipped directory unless
    asked to) with ``verifier.json`` and ``MODEL_CARD.md``. The network's
    settings (max length, seed, batch ...) come from the checkpoint, the
    window size from the corpus manifest, so they cannot differ from training.
    """
    work_dir = config.work_dir
    if work_dir is None:
        raise ConfigError("export needs the work_dir of the training run")
    corpus = read_corpus(work_dir / "corpus")
    saved = Checkpoints(work_dir / "checkpoints")
    path = checkpoint or saved.latest()
    if path is None:
        raise ArtifactError(f"no checkpoint under {saved.folder}: train first")
    state = saved.load(path)
    if state["pairs_sha256"] != pairs_sha256(corpus.train):
        raise ConfigError(f"{path} was not trained on the corpus in {work_dir}/corpus")
    trained = state["fingerprint"]
    config = replace(
        config,
        seed=int(trained["seed"]),
        batch_size=int(trained["batch_size"]),
        epochs=int(trained["epochs"]),
        learning_rate=float(trained["learning_rate"]),
        head_learning_rate=float(trained["head_learning_rate"]),
        freeze_layers=int(trained["freeze_layers"]),
        max_length=int(trained["max_length"]),
        question_in_input=trained["question_in_input"] == "True",
        question_dropout=float(trained["question_dropout"]),
        pairwise_weight=float(trained.get("pairwise_weight", 0.0)),
        layers=int(trained["layers"]) if "layers" in trained else None,
        init_from=None,  # recorded in the card from the fingerprint, not reloaded
        window_chars=int(corpus.manifest["window_chars"]),  # type: ignore[call-overload]
        coverage_excludes_question=True,
    )
    recorded = work_dir / "command.txt"
    command = command or (
        recorded.read_text(encoding="utf-8").strip() if recorded.is_file() else ""
    )
    trainer = VerifierTrainer(config)
    trainer.encoder = PairEncoder.from_file(
        config.base_model_dir / TOKENIZER_FILE, config.max_length
    )
    bert = BertModel.from_pretrained(str(config.base_model_dir), add_pooling_layer=False)
    model = CrossEncoder(lowest_layers(bert, config.layers))
    model.load_state_dict(state["model"])
    trainer.model = model.eval()
    trainer.steps = int(state["step"])
    trainer.history = list(state["history"])
    trainer.n_train = len(corpus.train)
    trainer.train_sha256 = str(state["pairs_sha256"])
    trainer.train_length_auroc = length_auroc(corpus.train)
    trainer.data_sources = sorted(dict(corpus.manifest["files_sha256"]))  # type: ignore[call-overload]
    trainer.split_rule = str(corpus.manifest["split_rule"])
    fp32_path = trainer.export(out_dir)
    val = _sample(corpus.val, calibration_pairs, config.seed)
    trainer.calibrate(val)
    sets = {
        name: _sample(pairs, test_limit, config.seed + 3) for name, pairs in corpus.test.items()
    }
    scored = {}
    for name in (FP32_FILE, INT8_FILE):
        platt, band = trainer.calibrations[name]
        twin = OnnxVerifier.load(out_dir, onnx_file=name, calibration=platt, band=band)
        scored[name] = score_sets(twin, sets)
    fp32, int8 = scored[FP32_FILE], scored[INT8_FILE]
    ship_int8 = int8_holds(fp32, int8, config.int8_tolerance)
    metrics: dict[str, dict[str, float | int | str]] = {
        **{f"fp32/{k}": v for k, v in fp32.items()},
        **{f"int8/{k}": v for k, v in int8.items()},
        "parity": onnx_parity(trainer, out_dir, val[:64]),
        "training": {
            "steps": trainer.steps,
            "total_steps": int(state["fingerprint"]["total_steps"]),
            "checkpoint": path.name,
            "seconds": round(trainer.history[-1]["seconds"], 1) if trainer.history else 0.0,
            "final_loss": round(trainer.history[-1]["loss"], 4) if trainer.history else 0.0,
            "shipped": "int8" if ship_int8 else "fp32",
            "command": command,
            "init_from": state["fingerprint"].get("init_from", "None"),
            "teacher": state["fingerprint"].get("teacher", "None"),
            "distill_weight": float(state["fingerprint"].get("distill_weight", 0.0)),
            "device": str(state.get("device", "cpu")),
            "config": json.dumps({k: str(v) for k, v in asdict(config).items()}),
        },
    }
    if compare is not None:
        other = OnnxVerifier.load(compare)
        previous = score_sets(other, sets)
        metrics.update(
            {f"compare/{k}": {**v, "verifier": other.version} for k, v in previous.items()}
        )
    shipped = out_dir / (INT8_FILE if ship_int8 else FP32_FILE)
    artifact = trainer.artifact(shipped, metrics)
    save_artifact(out_dir, artifact)
    if ship_int8:
        fp32_path.unlink()
    (out_dir / CARD_FILE).write_text(
        render_corpus_card(artifact, config, corpus.manifest, sets), encoding="utf-8"
    )
    return artifact
