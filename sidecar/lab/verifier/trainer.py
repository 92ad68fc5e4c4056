"""The verifier's lifecycle: fit (resumable loop, progress) -> export -> calibrate -> artifact.

:meth:`VerifierTrainer.fit` trains with binary cross-entropy (plus, with
``pairwise_weight``, a ranking term between the right and the wrong pair of
one group; with a ``teacher``, against the label mixed with the teacher's
probability: :mod:`sidecar.lab.verifier.distill`), AdamW and a
linear warm-up/decay, the embeddings and the lowest ``freeze_layers`` layers
frozen to fit a CPU budget, checkpointing under ``work_dir``
(:mod:`sidecar.lab.verifier.checkpoints`) ->
:meth:`~VerifierTrainer.export` (fp32 and int8 ONNX,
:mod:`sidecar.lab.verifier.export`) -> :meth:`~VerifierTrainer.calibrate`
(for each ONNX file, the file that would ship: Platt scaling on logit +
lexical coverage and the uncertain band on the validation split,
:mod:`sidecar.claims.calibration`) -> :meth:`~VerifierTrainer.artifact`
(the metadata with golden logits, :mod:`sidecar.golden`). Each step refuses
to run before the previous one (``LifecycleError``).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from sidecar.claims.artifact import PrecisionBand, VerifierArtifact, VerifierData
from sidecar.claims.calibration import Band, Platt, coverage
from sidecar.claims.verifier import (
    OnnxVerifier,
    PairEncoder,
    first_segment,
    record_verifier_golden,
    save_artifact,
)
from sidecar.exceptions import ConfigError, LifecycleError
from sidecar.hashing import sha256_file
from sidecar.lab.verifier.calibration import BAND_TARGETS, band_table, fit_platt
from sidecar.lab.verifier.checkpoints import Checkpoints, TrainingRun, fingerprint, pairs_sha256
from sidecar.lab.verifier.datasets import length_auroc
from sidecar.lab.verifier.distill import teacher_logits
from sidecar.lab.verifier.export import write_onnx
from sidecar.lab.verifier.metrics import auroc_or_nan
from sidecar.lab.verifier.ml import BertModel, nn, torch
from sidecar.lab.verifier.model import CrossEncoder, lowest_layers, state_for
from sidecar.lab.verifier.quantization import QUANTIZATION
from sidecar.lab.verifier.recover import state_from_onnx
from sidecar.lab.verifier.settings import (
    BASE_MODEL,
    FP32_FILE,
    INPUTS,
    INT8_FILE,
    TOKENIZER_FILE,
    TrainConfig,
)
from sidecar.lab.verifier.sources import Pair

__all__ = ["VerifierTrainer", "pairwise_loss"]

log = logging.getLogger(__name__)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _batches(pairs: Sequence[Pair], size: int, rng: random.Random) -> list[list[Pair]]:
    """Shuffled batches of similar length (less padding), in shuffled order."""
    return _packed([[p] for p in pairs], size, rng)


def _group_batches(pairs: Sequence[Pair], size: int, rng: random.Random) -> list[list[Pair]]:
    """Like :func:`_batches`, but the pairs of one group share a batch (for the pairwise term).

    A group larger than a batch is cut.
    """
    groups: dict[str, list[Pair]] = {}
    for p in pairs:
        groups.setdefault(p.group, []).append(p)
    return _packed(
        [g[k : k + size] for g in groups.values() for k in range(0, len(g), size)], size, rng
    )


def _packed(units: list[list[Pair]], size: int, rng: random.Random) -> list[list[Pair]]:
    """``units`` (shuffled, then sorted by length in blocks) packed whole into batches of at
    most ``size``, in shuffled order. With one pair per unit the batches are exactly the
    length-sorted slices of ``size`` (the plan of every checkpointed run so far)."""
    rng.shuffle(units)
    chunk = size * 50  # units per length-sorted block

    def length(unit: list[Pair]) -> int:
        return sum(len(p.claim) + len(p.evidence) for p in unit)

    batches: list[list[Pair]] = []
    for k in range(0, len(units), chunk):
        current: list[Pair] = []
        for unit in sorted(units[k : k + chunk], key=length):
            if len(current) + len(unit) > size:
                batches.append(current)
                current = []
            current.extend(unit)
        if current:
            batches.append(current)
    rng.shuffle(batches)
    return batches


def pairwise_loss(logits: Any, batch: Sequence[Pair]) -> Any:
    """Mean softplus(z_wrong - z_right) over the (supported, not) pairs of a group in the batch.

    Zero (a tensor, so it adds to the loss) when no group has both labels here.
    """
    right: list[int] = []
    wrong: list[int] = []
    for i, p in enumerate(batch):
        for j, q in enumerate(batch):
            if p.group == q.group and p.label == 1 and q.label == 0:
                right.append(i)
                wrong.append(j)
    if not right:
        return logits.sum() * 0.0
    at = logits.device
    margin = logits[torch.tensor(wrong, device=at)] - logits[torch.tensor(right, device=at)]
    return nn.functional.softplus(margin).mean()


def _tensors(
    encoder: PairEncoder,
    pairs: Sequence[Pair],
    *,
    question_in_input: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    texts = [
        (first_segment(p.claim, p.question, question_in_input=question_in_input), p.evidence)
        for p in pairs
    ]
    arrays = encoder.encode(texts)
    return {name: torch.from_numpy(arr).to(device) for name, arr in arrays.items()}


def _device(name: str) -> str:
    """``name`` if torch can use it here; ``cuda`` without a GPU is a configuration error."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device here (use --device cpu)")
    return name


def _drop_questions(pairs: Sequence[Pair], fraction: float, seed: int) -> list[Pair]:
    """``fraction`` of the pairs (seeded) without their question.

    Bare QA answers (kinds ``qa-*``: "Martin Scorsese") keep it: without the
    question, a distractor named in the evidence would be as supported as
    the right answer.
    """
    rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
    return [
        replace(p, question="") if rng.random() < fraction and not p.kind.startswith("qa-") else p
        for p in pairs
    ]


@dataclass
class VerifierTrainer:
    """fit -> export -> calibrate -> artifact, with guards against calling them out of order."""

    config: TrainConfig
    model: CrossEncoder | None = None
    encoder: PairEncoder | None = None
    out_dir: Path | None = None
    calibrations: dict[str, tuple[Platt, Band]] = field(default_factory=dict)
    # the band for each of BAND_TARGETS, on the same validation pairs (VerifierArtifact.bands)
    band_tables: dict[str, list[PrecisionBand]] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    n_train: int = 0
    n_val: int = 0
    train_sha256: str = ""
    train_length_auroc: float | None = None
    steps: int = 0
    monitor: list[Pair] = field(default_factory=list)  # validation pairs scored at checkpoints
    data_sources: list[str] = field(default_factory=list)  # the corpus path names its own
    split_rule: str = ""
    validation: list[dict[str, float]] = field(default_factory=list)
    # the teacher's p(supported) per training pair (by identity; distill_weight > 0 only)
    _soft: dict[int, float] = field(default_factory=dict, repr=False)

    def _require(self, what: str, ok: bool, before: str) -> None:
        if not ok:
            raise LifecycleError(f"{what} called before {before}")

    # ------------------------------------------------------------------ fit

    def fit(self, pairs: Sequence[Pair], *, resume: bool = False) -> VerifierTrainer:
        """Train on ``pairs``: ``epochs`` passes, or ``max_steps`` steps.

        With ``config.work_dir`` a checkpoint (model, optimizer, scheduler, RNG
        states, the step = the data position in the seeded batch plan, the
        pairs' sha256) is written under it every ``checkpoint_every`` steps;
        ``resume=True`` continues from the newest one exactly where it left
        off (same batches, same dropout masks), after checking that it was
        made from the same pairs and settings.
        """
        cfg = self.config
        if len(pairs) < cfg.batch_size:
            raise ConfigError(f"need at least {cfg.batch_size} training pairs, got {len(pairs)}")
        if resume and cfg.work_dir is None:
            raise ConfigError("resume needs a work_dir holding the checkpoints")
        run = self._prepare(pairs)
        checkpoints = None if cfg.work_dir is None else Checkpoints(cfg.work_dir / "checkpoints")
        start = 0
        if resume and checkpoints is not None and checkpoints.latest() is not None:
            start = checkpoints.restore(run)
            self.history, self.validation = checkpoints.history, checkpoints.validation
            log.info("resumed at step %d of %d", start, len(run.plan))
        elif cfg.init_from is None:  # a fresh head: centre its logits
            assert self.encoder is not None  # noqa: S101 - set by _prepare
            run.model.eval()
            first = [p for b in run.plan[:4] for p in b]
            qin = cfg.question_in_input
            run.model.centre(
                **_tensors(self.encoder, first, question_in_input=qin, device=cfg.device)
            )
        end = self._loop(run, start, checkpoints)
        run.model.to("cpu").eval()  # export, calibration and logits() run on the CPU
        self.model = run.model
        self.steps = end
        self.n_train = len(pairs)
        self.train_sha256 = run.pairs_sha256
        self.train_length_auroc = length_auroc(pairs)
        return self

    def _prepare(self, pairs: Sequence[Pair]) -> TrainingRun:
        """Seeds, the network (frozen layers), AdamW, the warm-up/decay schedule, the plan."""
        cfg = self.config
        _seed_everything(cfg.seed)
        torch.set_num_threads(cfg.threads)
        self.encoder = PairEncoder.from_file(cfg.base_model_dir / TOKENIZER_FILE, cfg.max_length)
        bert = BertModel.from_pretrained(str(cfg.base_model_dir), add_pooling_layer=False)
        model = CrossEncoder(lowest_layers(bert, cfg.layers))
        if cfg.init_from is not None and cfg.init_from.suffix == ".onnx":
            model.load_state_dict(state_for(state_from_onnx(cfg.init_from), model))
            log.info("network from the exported file %s", cfg.init_from)
        elif cfg.init_from is not None:
            start = Checkpoints(cfg.init_from.parent).load(cfg.init_from)
            model.load_state_dict(state_for(start["model"], model))
            log.info("network from %s (step %s)", cfg.init_from, start.get("step"))
        model.to(_device(cfg.device))
        for module in [bert.embeddings, *bert.encoder.layer[: cfg.freeze_layers]]:
            for param in module.parameters():
                param.requires_grad = False
        body = [p for n, p in model.named_parameters() if p.requires_grad and "head" not in n]
        optim = torch.optim.AdamW(
            [
                {"params": body, "lr": cfg.learning_rate},
                {"params": list(model.head.parameters()), "lr": cfg.head_learning_rate},
            ],
            weight_decay=0.01,
        )
        rng = random.Random(cfg.seed)  # noqa: S311 - batch order, not cryptography
        sha = pairs_sha256(pairs)
        if cfg.question_in_input:
            pairs = _drop_questions(pairs, cfg.question_dropout, cfg.seed)
        self._soft = {}
        if cfg.distill_weight > 0 and cfg.teacher is not None:
            logits = teacher_logits(cfg.teacher, pairs, cache_dir=cfg.work_dir, threads=cfg.threads)
            soft = 1.0 / (1.0 + np.exp(-logits))
            self._soft = {id(p): float(s) for p, s in zip(pairs, soft, strict=True)}
        batches = _group_batches if cfg.pairwise_weight > 0 else _batches
        plan = [b for _ in range(cfg.epochs) for b in batches(pairs, cfg.batch_size, rng)]
        if cfg.max_steps is not None:
            plan = plan[: cfg.max_steps]
        total = len(plan)
        warmup = max(1, int(total * cfg.warmup_fraction))

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total - step) / max(1, total - warmup))

        sched = torch.optim.lr_scheduler.LambdaLR(optim, schedule)
        where = "cpu"
        if cfg.device == "cuda":
            where = f"cuda ({torch.cuda.get_device_name()})"
        return TrainingRun(model, optim, sched, plan, sha, fingerprint(cfg, total), where)

    def _loop(self, run: TrainingRun, start: int, checkpoints: Checkpoints | None) -> int:
        """Steps ``start..`` of the plan (checkpoints, progress bar); the step reached."""
        cfg = self.config
        assert self.encoder is not None  # noqa: S101 - set by _prepare
        total = len(run.plan)
        loss_fn = nn.BCEWithLogitsLoss()
        run.model.train()
        started = time.monotonic() - (self.history[-1]["seconds"] if self.history else 0.0)
        running = self.history[-1]["loss"] if self.history else 0.0
        per_epoch = max(1, total // cfg.epochs)
        bar = tqdm(
            total=total, initial=start, unit="step", mininterval=30.0, smoothing=0.05,
            disable=checkpoints is None, ascii=True,
        )  # fmt: skip
        done = start
        for step in range(start, total):
            batch = run.plan[step]
            feed = _tensors(
                self.encoder, batch, question_in_input=cfg.question_in_input, device=cfg.device
            )
            logits = run.model(**feed)
            labels = torch.tensor([float(p.label) for p in batch], device=cfg.device)
            if self._soft:  # the labels mixed with the teacher's probabilities
                soft = torch.tensor([self._soft[id(p)] for p in batch], device=cfg.device)
                labels = (1.0 - cfg.distill_weight) * labels + cfg.distill_weight * soft
            loss = loss_fn(logits, labels)
            if cfg.pairwise_weight > 0:
                loss = loss + cfg.pairwise_weight * pairwise_loss(logits, batch)
            run.optim.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
            run.optim.step()
            run.sched.step()
            value = float(loss.detach())
            running = 0.98 * running + 0.02 * value if step else value
            done = step + 1
            bar.update(1)
            bar.set_postfix(loss=f"{running:.4f}", epoch=f"{done / per_epoch:.2f}", refresh=False)
            if done % 20 == 0 or done == total:
                elapsed = time.monotonic() - started
                log.info("step %d/%d loss %.4f (%.0f s)", done, total, running, elapsed)
                self.history.append({"step": done, "loss": running, "seconds": elapsed})
            stopping = cfg.stop_after is not None and done >= cfg.stop_after
            due = done % cfg.checkpoint_every == 0 or done == total
            if checkpoints is not None and (due or stopping):
                if due:
                    self._monitor(run.model, done)
                    run.model.train()
                checkpoints.save(
                    run, done, history=self.history, validation=self.validation,
                    keep=cfg.keep_checkpoints,
                )  # fmt: skip
            if stopping:
                break
        bar.close()
        return done

    def _monitor(self, model: CrossEncoder, step: int) -> None:
        """AUROC on a fixed slice of validation pairs, for the log (never used to pick)."""
        if not self.monitor or self.encoder is None:
            return
        model.eval()
        pairs = list(self.monitor)
        qin = self.config.question_in_input
        scores: list[float] = []
        with torch.no_grad():
            for k in range(0, len(pairs), 32):
                feed = _tensors(
                    self.encoder,
                    pairs[k : k + 32],
                    question_in_input=qin,
                    device=self.config.device,
                )
                scores.extend(model(**feed).tolist())
        value = auroc_or_nan(scores, [p.label for p in pairs])
        log.info("step %d: validation AUROC %.4f on %d pairs", step, value, len(pairs))
        self.validation.append({"step": float(step), "auroc": value})

    def logits(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> np.ndarray[Any, np.dtype[np.float64]]:
        """The torch model's logits (after ``fit``); ``questions`` as in serving."""
        self._require("logits()", self.model is not None and self.encoder is not None, "fit()")
        assert self.model is not None and self.encoder is not None  # noqa: S101 - checked above
        if questions is not None and self.config.question_in_input:
            pairs = [
                (first_segment(c, q, question_in_input=True), e)
                for (c, e), q in zip(pairs, questions, strict=True)
            ]
        out: list[np.ndarray[Any, np.dtype[np.float64]]] = []
        with torch.no_grad():
            for k in range(0, len(pairs), 64):
                arrays = self.encoder.encode(pairs[k : k + 64])
                feed = {n: torch.from_numpy(a) for n, a in arrays.items()}
                out.append(self.model(**feed).double().numpy())
        return np.concatenate(out) if out else np.zeros(0)

    # ------------------------------------------------------------------ export

    def export(self, out_dir: Path) -> Path:
        """Write ``model.onnx`` (fp32) and ``model.int8.onnx`` + the tokenizer into ``out_dir``.

        Also a provisional ``verifier.json`` (identity calibration) naming the
        fp32 file, so the ONNX adapter can load both twins for calibration.
        """
        self._require("export()", self.model is not None, "fit()")
        assert self.model is not None  # noqa: S101 - checked above
        fp32 = write_onnx(self.model, self.config.base_model_dir, out_dir)
        self.out_dir = out_dir
        save_artifact(out_dir, self._artifact(fp32, Platt(), Band(0.5, 0.5), {}))
        return fp32

    # ------------------------------------------------------------------ calibrate

    def calibrate(self, pairs: Sequence[Pair]) -> VerifierTrainer:
        """Fit calibration and band on validation pairs for each exported ONNX file."""
        self._require("calibrate()", self.out_dir is not None, "export()")
        assert self.out_dir is not None  # noqa: S101 - checked above
        texts = [(p.claim, p.evidence) for p in pairs]
        questions = [p.question for p in pairs]
        labels = [p.label for p in pairs]
        asked = questions if self.config.coverage_excludes_question else [""] * len(pairs)
        covered = [coverage(c, e, q) for (c, e), q in zip(texts, asked, strict=True)]
        for name in (FP32_FILE, INT8_FILE):
            z = OnnxVerifier.load(self.out_dir, onnx_file=name).logits(texts, questions)
            platt = fit_platt(z.tolist(), covered, labels)
            probs = platt.probability(z, covered).tolist()
            target = self.config.target_precision
            table = band_table(probs, labels, (*BAND_TARGETS, target))
            band = next(b.band for b in table if b.target_precision == target)  # its own
            self.calibrations[name] = (platt, band)
            self.band_tables[name] = table
            log.info("%s: %s, %s", name, platt, band)
        self.n_val = len(pairs)
        return self

    def artifact(
        self, onnx_path: Path, metrics: dict[str, dict[str, float | int | str]]
    ) -> VerifierArtifact:
        """The metadata of ``onnx_path`` with its own calibration (after ``calibrate``)."""
        self._require("artifact()", onnx_path.name in self.calibrations, "calibrate()")
        platt, band = self.calibrations[onnx_path.name]
        bands = self.band_tables.get(onnx_path.name, [])
        return self._artifact(onnx_path, platt, band, metrics, bands)

    def _artifact(
        self,
        onnx_path: Path,
        platt: Platt,
        band: Band,
        metrics: dict[str, dict[str, float | int | str]],
        bands: Sequence[PrecisionBand] = (),
    ) -> VerifierArtifact:
        sha = sha256_file(onnx_path)
        cfg = self.config
        sources = self.data_sources or (
            ["halueval/qa_data.json"]
            + (["nq-open/nq-open-oracle.dev.jsonl.gz"] if cfg.nq_path else [])
            + [str(p) for p in (*cfg.outcomes, *cfg.lookback)]
        )
        artifact = VerifierArtifact(
            version=f"minilm-ce-{sha[:12]}",
            base_model=BASE_MODEL,
            onnx_file=onnx_path.name,
            onnx_sha256=sha,
            quantization=QUANTIZATION if onnx_path.name == INT8_FILE else "none",
            tokenizer_file=TOKENIZER_FILE,
            max_length=cfg.max_length,
            inputs=INPUTS,
            question_in_input=cfg.question_in_input,
            coverage_excludes_question=cfg.coverage_excludes_question,
            evidence_max_windows=cfg.max_windows,
            evidence_max_chars=450 if cfg.window_chars is None else cfg.window_chars,
            evidence_max_sentences=3 if cfg.window_chars is None else 12,
            logit_scale=platt.logit_scale,
            coverage_weight=platt.coverage_weight,
            bias=platt.bias,
            unsupported_below=band.unsupported_below,
            supported_from=band.supported_from,
            target_precision=cfg.target_precision if bands else None,
            bands=list(bands),
            data=VerifierData(
                sources=sources,
                split_rule=self.split_rule
                or "sha256(lower(question)) -> test 10% / val 10% / train 80%",
                n_train=self.n_train,
                n_val=self.n_val,
                pairs_sha256=self.train_sha256,
                length_auroc_train=round(self.train_length_auroc or math.nan, 4),
                seed=cfg.seed,
            ),
            metrics=metrics,
            created_at=datetime.now(UTC),
        )
        # The file's logits on the golden inputs, recomputed by every load (sidecar.golden).
        written = OnnxVerifier.from_files(artifact, onnx_path, onnx_path.parent / TOKENIZER_FILE)
        return artifact.model_copy(update={"golden": record_verifier_golden(written)})
