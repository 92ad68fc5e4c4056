"""Re-calibrate a trained claim verifier on your own labelled pairs (`calibrate verifier`).

The network stays as exported (same ONNX file, same golden logits); what is fitted
again is what turns its logit into a decision: the Platt scaling of (logit,
coverage) (:func:`~sidecar.lab.verifier.calibration.fit_platt`) and the uncertain
band for each target precision (:func:`~sidecar.lab.verifier.calibration.band_table`).
A team whose claims and documents differ from the training mixture (the shipped
card's SummEdits row: AUROC 0.58) moves its threshold to where *its* precision
holds, without training.

Each pair is scored as the sidecar scores a claim: against up to
``evidence_max_windows`` windows of its evidence, the window with the highest logit
giving the claim its logit and its coverage (:meth:`OnnxVerifier.window_features
<sidecar.claims.verifier.OnnxVerifier.window_features>`). That choice does not
depend on the calibration, so one pass fits it.

Pairs are split by evidence (sha256 of the normalised text, as the training split
groups by document): ``holdout`` of the documents are kept out of the fit and
report the old and the new calibration on the same pairs. The written directory is a
complete verifier (ONNX file and tokenizer copied) with its own version,
``<network version>+cal-<8 hex>``, so verdicts name the calibration they used.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from sidecar.claims.artifact import PrecisionBand
from sidecar.claims.calibration import Band, Platt
from sidecar.claims.verifier import METADATA_FILE, save_artifact
from sidecar.exceptions import ConfigError
from sidecar.hashing import sha256_file
from sidecar.lab.verifier.calibration import BAND_TARGETS, band_table, fit_platt
from sidecar.lab.verifier.evaluate import PairItem, finite_or_none, pair_report, pair_windows

if TYPE_CHECKING:
    from sidecar.claims.verifier import OnnxVerifier

__all__ = [
    "CARD_FILE",
    "PairFeatures",
    "Recalibration",
    "check_fit_items",
    "check_out",
    "evidence_group",
    "pair_features",
    "recalibrate",
    "split_by_evidence",
    "write_recalibrated",
]

CARD_FILE = "MODEL_CARD.md"
VERSION_MAX = 64  # VerifierArtifact.version's limit
SMALL_FIT = 200  # fewer fit pairs than this: the summary warns that the band is noisy


def evidence_group(evidence: str) -> float:
    """A pair's place in [0, 1) from its normalised evidence: pairs of one document stay
    together (a held-out document is never also fitted on)."""
    text = " ".join(evidence.lower().split())
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:13], 16) / 16**13


def split_by_evidence(
    items: Sequence[PairItem], holdout: float
) -> tuple[list[PairItem], list[PairItem]]:
    """(fit, held-out): ``holdout`` of the distinct evidence texts, in expectation."""
    if not 0.0 <= holdout < 1.0:
        raise ConfigError(f"--holdout must be in [0, 1), got {holdout:g}")
    fit: list[PairItem] = []
    held: list[PairItem] = []
    for item in items:
        (held if evidence_group(item.evidence) < holdout else fit).append(item)
    return fit, held


def check_fit_items(fit: Sequence[PairItem], n_items: int) -> None:
    """``ConfigError`` before any scoring when the fit part cannot be fitted: fewer than 10
    pairs with evidence, or one label only (audit: 300 pairs of one label were scored for
    minutes before the fit refused them; empty evidence was answered "lower --holdout")."""
    usable = [item.label for item in fit if item.evidence.strip()]
    if len(usable) >= 10 and len(set(usable)) == 2:
        return
    blank = len(fit) - len(usable)
    raise ConfigError(
        f"calibration needs >= 10 fitted pairs of both labels with evidence; of {n_items} "
        f"pairs the fit part has {len(usable)} with evidence ({sum(usable)} supported)"
        + (f" and {blank} with empty evidence (served p = 0, not fitted)" if blank else "")
        + ": add pairs of both labels with their evidence"
        + (", or lower --holdout" if len(fit) < n_items else "")
    )


@dataclass(frozen=True)
class PairFeatures:
    """Per pair: the best window's logit and coverage, whether it had a window, its label."""

    logits: npt.NDArray[np.float64]
    coverages: npt.NDArray[np.float64]
    scored: npt.NDArray[np.bool_]
    labels: npt.NDArray[np.int64]

    def probabilities(self, platt: Platt) -> list[float]:
        """p(supported) as served with ``platt``: 0 without a window."""
        p = platt.probability(self.logits, self.coverages)
        return [float(x) if ok else 0.0 for x, ok in zip(p, self.scored, strict=True)]


def pair_features(
    verifier: OnnxVerifier, items: Sequence[PairItem], *, progress: bool = False, step: int = 16
) -> PairFeatures:
    """Score every pair's windows once (the network's work; a progress bar per pair)."""
    from tqdm import tqdm  # noqa: PLC0415 - the CLI's progress bar

    artifact = verifier.artifact
    logits = np.zeros(len(items), dtype=np.float64)
    covered = np.zeros(len(items), dtype=np.float64)
    scored = np.zeros(len(items), dtype=np.bool_)
    with tqdm(total=len(items), desc="pairs", unit="pair", disable=not progress) as bar:
        for start in range(0, len(items), step):
            part = items[start : start + step]
            windows = pair_windows(
                part,
                max_windows=artifact.evidence_max_windows,
                window_chars=artifact.evidence_max_chars,
            )
            z, c, ok = verifier.window_features(
                [item.claim for item in part], windows, [item.question for item in part]
            )
            logits[start : start + len(part)] = z
            covered[start : start + len(part)] = c
            scored[start : start + len(part)] = ok
            bar.update(len(part))
    labels = np.asarray([item.label for item in items], dtype=np.int64)
    return PairFeatures(logits, covered, scored, labels)


class Calibrated(Protocol):
    """What :func:`recalibrate` reads of the verifier: its calibration and band as served."""

    @property
    def calibration(self) -> Platt: ...

    @property
    def band(self) -> Band: ...


@dataclass(frozen=True)
class Recalibration:
    """The fitted calibration and what it was fitted on."""

    platt: Platt
    band: Band
    target_precision: float
    bands: list[PrecisionBand]
    n_fit: int
    n_fit_scored: int
    n_holdout: int
    report: dict[str, Any]


def recalibrate(
    verifier: Calibrated,
    fit: PairFeatures,
    held: PairFeatures,
    held_items: Sequence[PairItem],
    *,
    target_precision: float,
    before_band: Band | None = None,
) -> Recalibration:
    """Fit Platt scaling and the band table on ``fit``; report both calibrations on ``held``.

    Pairs without a window (empty evidence) are served p = 0 whatever the calibration, so
    they are left out of the fit; they stay in the held-out report. ``before_band``: the old
    calibration's band for ``target_precision`` (default: the verifier's served band), so
    both sides of the report hold the same target (audit: at --target-precision 0.9 the old
    side was reported at its own 0.8 band, threshold 0.54 instead of its 0.9 band's 0.75).
    """
    ok = fit.scored
    labels = fit.labels[ok].tolist()
    if len(labels) < 10 or len(set(labels)) < 2:
        raise ConfigError(
            f"calibration needs >= 10 fitted pairs of both labels (with evidence); the fit part "
            f"has {len(labels)} ({sum(labels)} supported): add pairs, or lower --holdout"
        )
    platt = fit_platt(fit.logits[ok].tolist(), fit.coverages[ok].tolist(), labels)
    probs = platt.probability(fit.logits[ok], fit.coverages[ok]).tolist()
    table = band_table(probs, labels, (*BAND_TARGETS, target_precision))
    band = next(b.band for b in table if b.target_precision == target_precision)
    report: dict[str, Any] = {}
    if len(held.labels):
        old = verifier.calibration
        report = {
            "before": finite_or_none(
                pair_report(
                    held.probabilities(old),
                    held_items,
                    verifier.band if before_band is None else before_band,
                )
            ),
            "after": finite_or_none(pair_report(held.probabilities(platt), held_items, band)),
        }
    return Recalibration(
        platt=platt,
        band=band,
        target_precision=target_precision,
        bands=table,
        n_fit=len(fit.labels),
        n_fit_scored=len(labels),
        n_holdout=len(held.labels),
        report=report,
    )


def check_out(out: Path, model_dir: Path) -> None:
    """``ConfigError`` unless ``out`` is a new (or empty) directory outside ``model_dir`` that
    can be written (its parents are made here, before the scoring, which takes minutes)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"--out {out} exists and is not an empty directory; give a new directory "
            "(the verifier it writes is served with GUARDRAIL_SIGNALS__VERIFIER=<that path>)"
        )
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        # "." has no name: the staging directory would be made inside it and renamed onto
        # it (EBUSY after the scoring); renaming onto the shell's own directory is no better
        raise ConfigError(f"--out {out} is the current directory or above it; give a new directory")
    if out.resolve().is_relative_to(model_dir.resolve()):
        raise ConfigError(
            f"--out {out} is the verifier being calibrated or inside it; give a new directory "
            "beside it"
        )
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"--out {out}: {above} is a file, not a directory; give a new directory")
    try:  # audit: an unwritable --out failed after the scoring, with a traceback
        out.parent.mkdir(parents=True, exist_ok=True)
        _staging(out).rmdir()
    except OSError as exc:
        raise ConfigError(
            f"--out {out}: cannot write a directory there ({exc.strerror or exc}); give a new "
            "directory in a writable place"
        ) from None


def _staging(out: Path) -> Path:
    """A new directory beside ``out`` (the umask's mode, as ``out`` itself would have)."""
    staging = out.parent / f".{out.name}.partial-{secrets.token_hex(4)}"
    staging.mkdir()
    return staging


def _versioned(network: str, cal_id: str) -> str:
    """``<network>+cal-<id>``, the network's name cut so the version fits its 64 characters."""
    suffix = f"+cal-{cal_id}"
    return network[: VERSION_MAX - len(suffix)] + suffix


def _calibration_id(network: str, cal: Recalibration, data_sha256: str) -> str:
    blob = json.dumps(
        {
            "network": network,
            "platt": [cal.platt.logit_scale, cal.platt.coverage_weight, cal.platt.bias],
            "band": [cal.band.unsupported_below, cal.band.supported_from],
            "target": cal.target_precision,
            "data": data_sha256,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def write_recalibrated(
    verifier: OnnxVerifier,
    model_dir: Path,
    out: Path,
    cal: Recalibration,
    *,
    data: Path,
    holdout: float,
) -> dict[str, Any]:
    """Write ``out`` (a complete verifier directory) and return the summary."""
    artifact = verifier.artifact
    check_out(out, model_dir)
    data_sha = sha256_file(data)
    network = artifact.version.split("+", 1)[0]
    version = _versioned(network, _calibration_id(network, cal, data_sha))
    provenance: dict[str, float | int | str] = {
        "from_version": artifact.version,
        "data": data.name,
        "data_sha256": data_sha,
        "holdout": holdout,
        "split_rule": "sha256(normalised evidence) < holdout -> held out",
        "n_fit": cal.n_fit,
        "n_fit_scored": cal.n_fit_scored,
        "n_holdout": cal.n_holdout,
    }
    # a re-calibrated verifier's own recalibration numbers are not this one's (audit: with
    # --holdout 0 the previous run's held-out before/after stayed under the new version)
    metrics = {k: v for k, v in artifact.metrics.items() if not k.startswith("recalibration")}
    metrics["recalibration"] = provenance
    for side, numbers in cal.report.items():
        metrics[f"recalibration/held-out/{side}"] = {
            k: v for k, v in numbers.items() if v is not None
        }
    new = artifact.model_copy(
        update={
            "version": version,
            "logit_scale": cal.platt.logit_scale,
            "coverage_weight": cal.platt.coverage_weight,
            "bias": cal.platt.bias,
            "unsupported_below": cal.band.unsupported_below,
            "supported_from": cal.band.supported_from,
            "target_precision": cal.target_precision,
            "bands": cal.bands,
            "metrics": metrics,
            "created_at": datetime.now(UTC),
        }
    )
    type(artifact).model_validate_json(new.model_dump_json())  # what the sidecar will load
    card = model_dir / CARD_FILE
    previous = card.read_text(encoding="utf-8") if card.is_file() else ""
    # Written beside --out, then renamed onto it: a failure or Ctrl-C midway leaves no
    # half-written verifier (audit: the ONNX file without verifier.json, refused on rerun).
    staging = _staging(out)  # check_out made out's parents
    try:
        for name in (artifact.onnx_file, artifact.tokenizer_file):
            shutil.copyfile(model_dir / name, staging / name)
        save_artifact(staging, new)
        (staging / CARD_FILE).write_text(
            _card_section(artifact.version, version, cal, provenance) + "\n" + previous,
            encoding="utf-8",
        )
        staging.rename(out)  # onto a new path, or onto the empty directory --out may be
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "verifier_in": artifact.version,
        "verifier_out": version,
        "out": str(out),
        "metadata": str(out / METADATA_FILE),
        "n_fit": cal.n_fit,
        "n_fit_scored": cal.n_fit_scored,
        "n_holdout": cal.n_holdout,
        "target_precision": cal.target_precision,
        "platt": {
            "logit_scale": round(cal.platt.logit_scale, 6),
            "coverage_weight": round(cal.platt.coverage_weight, 6),
            "bias": round(cal.platt.bias, 6),
        },
        "band": [cal.band.unsupported_below, cal.band.supported_from],
        "held_out": cal.report,
        "warnings": (
            [
                f"{cal.n_fit_scored} fitted pairs: the band's ends rest on few pairs each; "
                f"{SMALL_FIT}+ pairs of both labels give a steadier threshold"
            ]
            if cal.n_fit_scored < SMALL_FIT
            else []
        ),
    }


def _card_section(
    before: str, after: str, cal: Recalibration, provenance: dict[str, float | int | str]
) -> str:
    lines = [
        f"# Re-calibrated claim verifier `{after}`",
        "",
        f"The network of `{before}` (same ONNX file, same golden logits) with its calibration",
        f"fitted again by `guardrail calibrate verifier` on `{provenance['data']}` "
        f"(sha256 `{provenance['data_sha256']}`): {cal.n_fit_scored} fitted pairs, "
        f"{cal.n_holdout} held out by document ({provenance['split_rule']}, "
        f"holdout {provenance['holdout']}).",
        "",
        f"- p = sigmoid({cal.platt.logit_scale:.4f} * logit + {cal.platt.coverage_weight:.4f} "
        f"* coverage + {cal.platt.bias:.4f}); band [{cal.band.unsupported_below:g}, "
        f"{cal.band.supported_from:g}) for target precision {cal.target_precision:g}.",
        "- Bands for other targets: "
        + "; ".join(
            f"{b.target_precision:g}: [{b.unsupported_below:g}, {b.supported_from:g}), "
            f"{b.uncertain_share:.0%} uncertain"
            for b in cal.bands
        )
        + ".",
    ]
    if cal.report:
        keys = ("n", "accuracy", "balanced_accuracy", "precision", "recall", "auroc", "ece")
        lines += [
            "",
            "Held-out pairs (the verifier alone, as served: best window, its band's threshold):",
            "",
            "| calibration | " + " | ".join(keys) + " |",
            "|---|" + "---|" * len(keys),
        ]
        for side, name in (("before", before), ("after", after)):
            row = cal.report[side]
            lines.append(
                f"| {side} (`{name}`) | " + " | ".join(str(row.get(k)) for k in keys) + " |"
            )
    lines += [
        "",
        "The sections below are the original card: their numbers are those of the original",
        "calibration on the project's own held-out splits.",
        "",
    ]
    return "\n".join(lines)
