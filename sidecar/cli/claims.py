"""``guardrail train verifier`` and ``guardrail eval claims`` (docs/methods.md §Claim verification).

train: build the length-balanced pairs from HaluEval QA and NQ-open, fine-tune
the MiniLM cross-encoder, calibrate its uncertain band, export ONNX (fp32 and
int8) and write ``verifier.json`` + ``MODEL_CARD.md`` into ``--out``.
``--outcomes DIR`` / ``--lookback DIR`` add in-domain pairs from report rows and
lookback shards (fit part only); ``--holdout DIR`` keeps the questions of those
rows (the eval part) out of every pair.

eval: run the sidecar's claim check (segmentation, evidence selection, rule
tier, verifier) over a HaluEval file and print detection metrics for the
hallucinated candidates (n, accuracy, AUROC, F1, plus the AUROC of candidate
length alone). For ``halueval-qa`` the default ``--split test`` keeps only
questions of the verifier's held-out split (never trained on).

Heavy imports (torch, onnxruntime) happen inside the run functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.cli.groups import add_progress_arg, get_group, progress_enabled
from sidecar.exceptions import ConfigError

if TYPE_CHECKING:  # the verifier imports onnxruntime: loaded when a command needs it
    from sidecar.claims.verifier import OnnxVerifier
    from sidecar.config import Settings

__all__ = ["register", "run_calibrate", "run_eval", "run_train"]

log = logging.getLogger(__name__)

DATA_DIR = Path("../shared/data")
DEFAULT_HALUEVAL = DATA_DIR / "halueval" / "qa_data.json"
DEFAULT_NQ = DATA_DIR / "nq-open" / "nq-open-oracle.dev.jsonl.gz"
DEFAULT_MODEL = Path("models/verifier")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``train verifier`` and ``eval claims``."""
    train = get_group(sub, "train", "Train a guardrail model from local data.")
    p = train.add_parser(
        "verifier",
        help="Train the claim verifier (MiniLM cross-encoder) and export it to ONNX.",
        description=(
            "Fine-tune the MiniLM-L6 cross-encoder on length-balanced HaluEval QA + NQ-open "
            "pairs, calibrate the uncertain band, export ONNX fp32 + int8 and write the model card."
        ),
    )
    p.add_argument(
        "--out", type=Path, default=None, help=f"artifact directory (default {DEFAULT_MODEL})"
    )
    p.add_argument("--halueval", type=Path, default=DEFAULT_HALUEVAL, help="HaluEval qa_data.json")
    p.add_argument(
        "--nq", type=Path, default=DEFAULT_NQ, help="NQ-open oracle dev file ('none' to skip)"
    )
    p.add_argument(
        "--limit",
        type=int,
        default=1000,
        help="HaluEval training records (default 1000; 0: the whole train split)",
    )
    p.add_argument("--val-limit", type=int, default=300, help="validation records (default 300)")
    p.add_argument("--test-limit", type=int, default=600, help="test records for the card")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--epochs", type=int, default=1, help="passes over the training pairs")
    p.add_argument(
        "--freeze-layers",
        type=int,
        default=2,
        help="lowest encoder layers kept frozen, with the embeddings (default 2)",
    )
    p.add_argument(
        "--question-in-input",
        action="store_true",
        help="the network reads 'question [SEP] claim' (recorded in verifier.json)",
    )
    p.add_argument(
        "--outcomes",
        type=Path,
        nargs="*",
        default=[],
        help="report rows (dir with rows.jsonl) of the FIT part: in-domain pairs",
    )
    p.add_argument(
        "--lookback",
        type=Path,
        nargs="*",
        default=[],
        help="lookback shard dirs of the FIT part (chunk texts from --nq's corpus)",
    )
    p.add_argument(
        "--outcomes-repeat",
        type=int,
        default=1,
        help="repeat the in-domain training pairs this many times (default 1)",
    )
    p.add_argument(
        "--holdout",
        type=Path,
        nargs="*",
        default=[],
        help="report rows whose questions are kept out of every training/validation pair",
    )
    _add_mixture_arguments(p)
    p.set_defaults(func=run_train)

    evaluate = get_group(sub, "eval", "Evaluate a guardrail signal on held-out data.")
    e = evaluate.add_parser(
        "claims",
        help="Measure the claim check (segment + rules + verifier) on labelled pairs or HaluEval.",
        description=(
            "Score labelled (claim, evidence) pairs with the sidecar's claim check: --format "
            "pairs reads your own JSON lines; the halueval-* formats score the right and the "
            "hallucinated candidate of every HaluEval item. Reports n, accuracy at the served "
            "threshold (the artifact's band, not one tuned on the file), balanced accuracy, "
            "precision, recall, F1, AUROC, ECE and length-only AUROC."
        ),
    )
    e.add_argument(
        "--data", type=Path, required=True, help="HaluEval or pairs file, one JSON per line"
    )
    e.add_argument(
        "--format",
        required=True,
        choices=["pairs", "halueval-qa", "halueval-summarization", "halueval-dialogue"],
        help="pairs: {evidence, claim, label 1|0 (1 = supported), question?, id?} per line",
    )
    e.add_argument(
        "--model",
        type=Path,
        default=None,
        help="verifier directory (default: the served one, GUARDRAIL_MODELS__DIR and "
        "GUARDRAIL_SIGNALS__VERIFIER)",
    )
    e.add_argument(
        "--target-precision",
        type=float,
        default=None,
        help="the band of this target precision (default: the served one, "
        "GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION)",
    )
    e.add_argument("--limit", type=int, default=None, help="items (lines) to read at most")
    e.add_argument(
        "--split",
        choices=["test", "all"],
        default=None,
        help="halueval-qa: only held-out questions (default test); other formats: all",
    )
    e.add_argument(
        "--best-chunk",
        action="store_true",
        help="also score each claim against its best chunk (two verifier pairs per claim)",
    )
    e.add_argument("--json", action="store_true", help="print one JSON object")
    add_progress_arg(e, "a progress bar for --format pairs")
    e.set_defaults(func=run_eval)

    calibrate = get_group(sub, "calibrate", "Calibrate a guardrail signal on labelled data.")
    c = calibrate.add_parser(
        "verifier",
        help="Re-fit the claim verifier's calibration and band on your own labelled pairs.",
        description=(
            "Score your labelled (claim, evidence) pairs with the verifier (the same JSON lines "
            "as eval claims --format pairs: {evidence, claim, label 1|0, question?, id?}), fit "
            "its Platt scaling and uncertain band again on them, and write a complete verifier "
            "directory with its own version (<network>+cal-<hash>). The network is unchanged. "
            "--holdout of the documents (by evidence text) are kept out of the fit and report "
            "the old and the new calibration. Serve the result with "
            "GUARDRAIL_SIGNALS__VERIFIER=<--out path>."
        ),
    )
    c.add_argument("--data", type=Path, required=True, help="labelled pairs, one JSON per line")
    c.add_argument("--out", type=Path, required=True, help="new verifier directory (not existing)")
    c.add_argument(
        "--model",
        type=Path,
        default=None,
        help="verifier to re-calibrate (default: the served one, GUARDRAIL_MODELS__DIR and "
        "GUARDRAIL_SIGNALS__VERIFIER)",
    )
    c.add_argument(
        "--target-precision",
        type=float,
        default=None,
        help="precision of 'supported' and 'unsupported' the served band holds on the fit "
        "pairs, in [0.5, 1) (default: the served one, "
        "GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION, else the verifier's own target)",
    )
    c.add_argument(
        "--holdout",
        type=float,
        default=0.2,
        help="share of the documents kept out of the fit to report on, in [0, 1) (default 0.2)",
    )
    c.add_argument("--limit", type=int, default=None, help="pairs (lines) to read at most")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    add_progress_arg(c, "a progress bar")
    c.set_defaults(func=run_calibrate)


def _add_mixture_arguments(p: argparse.ArgumentParser) -> None:
    """``train verifier``'s options for the whole mixture (resumable, with --work-dir)."""
    mixture = p.add_argument_group(
        "the whole mixture, resumable (with --work-dir)",
        "All sources of --data-dir (HaluEval QA, summarization, dialogue, NQ-open, SummEdits, "
        "Factcheck-GPT, BEGIN) split by document / claim, length matched, evidence cut to "
        "windows; checkpoints every --checkpoint-every steps in --work-dir (outside the repo).",
    )
    mixture.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="corpus cache + checkpoints, e.g. ~/.cache/guardrail/verifier-train",
    )
    mixture.add_argument("--data-dir", type=Path, default=DATA_DIR, help="the shared data folder")
    mixture.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint"
    )
    mixture.add_argument("--max-length", type=int, default=128, help="tokens per pair")
    mixture.add_argument("--batch-size", type=int, default=16)
    mixture.add_argument("--window-chars", type=int, default=900, help="evidence window size")
    mixture.add_argument("--checkpoint-every", type=int, default=200, help="steps")
    mixture.add_argument(
        "--stop-after", type=int, default=None, help="leave after this global step (resumable)"
    )
    mixture.add_argument(
        "--export",
        action="store_true",
        help="export the newest checkpoint of --work-dir (ONNX, calibration, held-out sets, "
        "card) into --out instead of training",
    )
    mixture.add_argument("--checkpoint", type=Path, default=None, help="export this checkpoint")
    mixture.add_argument(
        "--calibration-pairs", type=int, default=2000, help="validation pairs for calibration"
    )
    mixture.add_argument(
        "--target-precision",
        type=float,
        default=0.8,
        help="the uncertain band: validation precision each decision must reach (default 0.8; "
        "higher leaves more claims uncertain, for the LLM judge)",
    )
    mixture.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="score this verifier directory (e.g. models/verifier) on the same held-out pairs",
    )
    mixture.add_argument(
        "--max-windows", type=int, default=3, help="evidence windows per claim when served"
    )
    mixture.add_argument(
        "--learning-rate", type=float, default=2e-5, help="encoder learning rate (head: 100x)"
    )
    mixture.add_argument(
        "--pairwise-weight",
        type=float,
        default=0.0,
        help="weight of the ranking term between a group's right and wrong pairs (0: off)",
    )
    mixture.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start from this checkpoint's network (e.g. a finished run's last step-*.pt) or "
        "an exported verifier's ONNX file (e.g. models/verifier/model.int8.onnx)",
    )
    mixture.add_argument(
        "--teacher",
        type=Path,
        default=None,
        help="distil from this exported verifier directory (e.g. models/verifier): its "
        "logits on the training pairs are soft targets (with --distill-weight)",
    )
    mixture.add_argument(
        "--distill-weight",
        type=float,
        default=0.0,
        help="weight of the teacher's probabilities against the labels, in [0, 1] (0: off)",
    )
    mixture.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the training steps run (cuda: a GPU, when torch sees one)",
    )
    mixture.add_argument(
        "--layers",
        type=int,
        default=None,
        help="keep only the lowest N of MiniLM's 6 encoder layers (default: all 6)",
    )
    mixture.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="SOURCE=N",
        help="at most N training pairs from SOURCE (repeatable), e.g. halueval-qa=12000",
    )


def _existing(path: Path, flag: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"{flag} {path} does not exist (pass {flag} PATH)")
    return path


def _caps(values: list[str]) -> tuple[tuple[str, int], ...]:
    out = []
    for value in values:
        name, _, count = value.partition("=")
        if not count.isdigit():
            raise ConfigError(f"--cap takes SOURCE=N with N a whole number, got {value!r}")
        out.append((name, int(count)))
    return tuple(out)


def run_train(args: argparse.Namespace) -> int:
    from sidecar.lab.verifier.settings import TrainConfig, minilm_dir  # noqa: PLC0415
    from sidecar.lab.verifier.training import train_verifier  # noqa: PLC0415

    if args.work_dir is not None:
        return _run_fit_on_corpus(args)
    nq = None if str(args.nq).lower() == "none" else _existing(args.nq, "--nq")
    config = TrainConfig(
        halueval_path=_existing(args.halueval, "--halueval"),
        nq_path=nq,
        base_model_dir=minilm_dir(),
        limit=None if args.limit == 0 else args.limit,
        val_limit=args.val_limit,
        test_limit=args.test_limit,
        max_steps=args.max_steps,
        seed=args.seed,
        threads=args.threads,
        epochs=args.epochs,
        freeze_layers=args.freeze_layers,
        question_in_input=args.question_in_input,
        outcomes=tuple(args.outcomes),
        lookback=tuple(args.lookback),
        holdout=tuple(args.holdout),
        outcomes_repeat=args.outcomes_repeat,
    )
    artifact = train_verifier(config, args.out or DEFAULT_MODEL)
    summary = {
        "version": artifact.version,
        "onnx_file": artifact.onnx_file,
        "metrics": {k: v for k, v in artifact.metrics.items() if k != "training"},
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


def _run_fit_on_corpus(args: argparse.Namespace) -> int:
    from sidecar.lab.verifier.datasets import CorpusConfig  # noqa: PLC0415
    from sidecar.lab.verifier.settings import TrainConfig, minilm_dir  # noqa: PLC0415
    from sidecar.lab.verifier.training import export_from_checkpoint, fit_on_corpus  # noqa: PLC0415

    work_dir = args.work_dir.expanduser().resolve()
    corpus = CorpusConfig(
        data_dir=args.data_dir,
        seed=args.seed,
        window_chars=args.window_chars,
        train_caps=_caps(args.cap),
    )
    config = TrainConfig(
        halueval_path=args.data_dir / "halueval" / "qa_data.json",
        nq_path=args.data_dir / "nq-open" / "nq-open-oracle.dev.jsonl.gz",
        base_model_dir=minilm_dir(),
        limit=None,
        max_length=args.max_length,
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        seed=args.seed,
        threads=args.threads,
        epochs=args.epochs,
        freeze_layers=args.freeze_layers,
        question_in_input=True,
        work_dir=work_dir,
        checkpoint_every=args.checkpoint_every,
        stop_after=args.stop_after,
        max_windows=args.max_windows,
        coverage_excludes_question=True,
        learning_rate=args.learning_rate,
        # the head learns 100x faster; rounded, so 7e-5 gives 0.007, not 0.006999999999999999
        head_learning_rate=round(args.learning_rate * 100, 10),
        pairwise_weight=args.pairwise_weight,
        init_from=None if args.init_from is None else args.init_from.expanduser().resolve(),
        teacher=None if args.teacher is None else args.teacher.expanduser().resolve(),
        distill_weight=args.distill_weight,
        device=args.device,
        layers=args.layers,
        target_precision=args.target_precision,
    )
    if args.export:
        if args.out is None:
            raise ConfigError(
                "--export needs --out DIR (the shipped models/verifier is never a default)"
            )
        artifact = export_from_checkpoint(
            config,
            args.out,
            checkpoint=args.checkpoint,
            calibration_pairs=args.calibration_pairs,
            test_limit=args.test_limit,
            compare=args.compare,
        )
        rows = {k: v for k, v in artifact.metrics.items() if k != "training"}
        sys.stdout.write(json.dumps({"version": artifact.version, "metrics": rows}) + "\n")
        return 0
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "command.txt").write_text(" ".join(["guardrail", *sys.argv[1:]]) + "\n")
    trainer = fit_on_corpus(config, corpus, resume=args.resume)
    last = trainer.history[-1] if trainer.history else {}
    summary = {"work_dir": str(work_dir), "steps": trainer.steps, **last}
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1 (or left out for all lines), got {limit}")


def _served_verifier(args: argparse.Namespace) -> OnnxVerifier:
    """The verifier ``eval claims`` measures: the one the sidecar serves, with its band,
    unless --model / --target-precision say otherwise (audit: a relative default path and
    the artifact's default band, whatever the served settings were)."""
    from sidecar.claims.verifier import OnnxVerifier  # noqa: PLC0415
    from sidecar.config import Settings  # noqa: PLC0415

    settings = Settings.load()
    precision = args.target_precision
    if precision is None:
        precision = settings.signals.verifier_target_precision
    return OnnxVerifier.load(_model_dir(args, settings), target_precision=precision)


def _model_dir(args: argparse.Namespace, settings: Settings | None = None) -> Path:
    """``--model``, else the served verifier (GUARDRAIL_MODELS__DIR / __SIGNALS__VERIFIER)."""
    if args.model is not None:
        return Path(args.model)
    from sidecar.config import Settings  # noqa: PLC0415

    settings = settings or Settings.load()
    return Path(settings.models.dir) / settings.signals.verifier


def run_eval(args: argparse.Namespace) -> int:
    from sidecar.claims.scorer import ClaimScorer  # noqa: PLC0415
    from sidecar.lab.verifier.evaluate import (  # noqa: PLC0415
        evaluate_items,
        held_out,
        read_items,
        score_item,
    )

    _check_limit(args.limit)
    if args.format == "pairs":
        return _run_eval_pairs(args)
    split = args.split or ("test" if args.format == "halueval-qa" else "all")
    verifier = _served_verifier(args)
    scorer = ClaimScorer.served(verifier, best_chunk=args.best_chunk)
    items = [
        item
        for group, item in read_items(_existing(args.data, "--data"), args.format, args.limit)
        if split == "all" or held_out(group)
    ]
    if not items:
        raise ConfigError(f"no items in {args.data} for split {split!r}")
    report = evaluate_items(items, lambda item: score_item(scorer, item))
    out = {
        "format": args.format,
        "split": split,
        "verifier": verifier.version,
        "pairs_per_claim": 2 if args.best_chunk else 1,
        **report,
    }
    _print(out, as_json=args.json)
    return 0


def _run_eval_pairs(args: argparse.Namespace) -> int:
    from sidecar.claims.scorer import ClaimScorer  # noqa: PLC0415
    from sidecar.lab.verifier.evaluate import (  # noqa: PLC0415
        check_pair_items,
        finite_or_none,
        pair_report,
        read_pair_items,
    )

    items = read_pair_items(_existing(args.data, "--data"), args.limit)
    if not items:
        raise ConfigError(f"no pairs in {args.data}")
    verifier = _served_verifier(args)
    artifact = verifier.artifact
    scorer = ClaimScorer.served(verifier)  # one pair set per claim, rules on
    served, probs = check_pair_items(scorer, items, progress=progress_enabled(args))
    verifier_only = finite_or_none(pair_report(probs, items, verifier.band))
    out = {
        "format": "pairs",
        "verifier": verifier.version,
        "max_windows": artifact.evidence_max_windows,
        "window_chars": artifact.evidence_max_chars,
        **finite_or_none(pair_report(served, items, verifier.band)),
        # the network alone, before the rule tier (what --format pairs reported before)
        "verifier_only": {k: verifier_only[k] for k in ("accuracy", "auroc", "f1")},
        "rule_overrides": sum(s != p for s, p in zip(served, probs, strict=True)),
    }
    classes = {item.label for item in items}
    if len(classes) < 2:
        out["note"] = (
            f"every pair is labelled {classes.pop()}: AUROC, balanced accuracy and length AUROC "
            "need both labels (null)"
        )
    _print(out, as_json=args.json)
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    """``guardrail calibrate verifier``: the served network, calibrated on the user's pairs."""
    from sidecar.claims.verifier import OnnxVerifier  # noqa: PLC0415
    from sidecar.config import Settings  # noqa: PLC0415
    from sidecar.lab.verifier.evaluate import read_pair_items  # noqa: PLC0415
    from sidecar.lab.verifier.recalibrate import (  # noqa: PLC0415
        check_fit_items,
        check_out,
        pair_features,
        recalibrate,
        split_by_evidence,
        write_recalibrated,
    )

    _check_limit(args.limit)
    settings = Settings.load()
    model = _model_dir(args, settings)
    precision = args.target_precision
    if precision is None:  # the served band's, as `eval claims` measures it
        precision = settings.signals.verifier_target_precision
    if precision is not None and not 0.5 <= precision < 1.0:
        raise ConfigError(f"--target-precision must be in [0.5, 1), got {precision:g}")
    data = _existing(args.data, "--data")
    items = read_pair_items(data, args.limit)
    if not items:
        raise ConfigError(f"no pairs in {args.data}")
    repeated = len(items) - len({(i.claim, i.evidence, i.question) for i in items})
    if repeated:  # audit: 30 pairs written 5 times were reported as 135 fitted pairs
        sys.stderr.write(
            f"guardrail calibrate verifier: warning: {repeated} of {len(items)} pairs repeat "
            "an earlier line (same claim, evidence and question); each line is fitted, so "
            "repeats weigh more and the pair counts overstate the data\n"
        )
    fit_items, held_items = split_by_evidence(items, args.holdout)
    check_fit_items(fit_items, len(items))  # before the scoring, which takes minutes
    check_out(args.out, model)
    verifier = OnnxVerifier.load(model)
    if precision is None:
        precision = verifier.artifact.target_precision or 0.8
    progress = progress_enabled(args)
    fit = pair_features(verifier, fit_items, progress=progress)
    held = pair_features(verifier, held_items, progress=progress)
    try:  # the old calibration at the same target precision, when it has a band for it
        before_band = verifier.artifact.band_for(precision)
    except ConfigError:
        before_band = verifier.band
        if held_items:
            sys.stderr.write(
                f"guardrail calibrate verifier: warning: {verifier.version} has no band for "
                f"target precision {precision:g}: the held-out 'before' numbers use its own "
                "band\n"
            )
    cal = recalibrate(
        verifier, fit, held, held_items, target_precision=precision, before_band=before_band
    )
    summary = write_recalibrated(verifier, model, args.out, cal, data=data, holdout=args.holdout)
    for warning in summary["warnings"]:
        sys.stderr.write(f"guardrail calibrate verifier: warning: {warning}\n")
    _print(summary, as_json=args.json)
    return 0


def _print(out: Mapping[str, object], *, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(out, allow_nan=False) + "\n")
    else:
        for key, value in out.items():
            sys.stdout.write(f"{key:>17}: {value}\n")
