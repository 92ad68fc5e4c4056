"""Does the served evidence setting buy accuracy for its cost? (not a timed test): writes JSON.

Scores the shipped claim verifier on the task forms of one split (``val`` to choose a
setting; ``test`` once, for the chosen one) under evidence settings ``(window_chars,
max_windows, max_length)``: each claim against up to ``max_windows`` windows of at most
``window_chars`` characters of its *whole* evidence (``EvidenceIndex.windows``, as the
sidecar cuts them), the network reading at most ``max_length`` tokens, the window with
the highest logit giving the claim its logit and coverage, the artifact's own calibration
and band (as served: ``OnnxVerifier.window_features``). The pairs are the corpus's pairs of
that split and form with their evidence uncut (:func:`~sidecar.lab.verifier.datasets.form_sets`),
a seeded sample of ``--n`` per form.

Per setting and form: AUROC, accuracy at the served threshold (p >= ``supported_from``)
and at thresholds from 0.30 to 0.70 (``accuracy_by_threshold``: does one threshold suit
every form?), mean windows per claim, mean tokens per (claim, window) pair, and the
measured ms per claim (window cutting + the network on each window, one onnxruntime
thread; the settings run claim by claim in turn, so load drift on a shared machine hits
them alike; a window that two settings share with one max_length is run once and counted
in both). Against the reference setting (the first): the paired bootstrap 95% interval
of the AUROC and accuracy differences on the same pairs.

Usage::

    taskset -c 1 python bench/evidence_settings.py --split val --n 300 \\
        --out bench/results/evidence_settings/val-300-11-settings.json

(the runs behind docs/methods.md, "Fewer or smaller evidence windows", are in
``bench/results/evidence_settings/``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from sidecar.claims.calibration import Band
from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex
from sidecar.claims.verifier import OnnxVerifier, PairEncoder, first_segment
from sidecar.lab.verifier.datasets import CorpusConfig, form_sets
from sidecar.lab.verifier.evaluate import PairItem, pair_report
from sidecar.lab.verifier.sources import Pair, Split
from sidecar.onnxrt import onnxruntime

DEFAULT_SETTINGS = (
    "640x3x192",  # served (models/verifier/verifier.json)
    "640x2x192",
    "640x1x192",
    "640x3x160",
    "640x2x160",
    "640x1x160",
    "640x3x128",
    "480x3x192",
    "480x3x160",
    "480x2x160",
    "320x3x128",
)
DEFAULT_FORMS = ("qa", "sentences", "summaries", "dialogue", "factcheck", "begin")


@dataclass(frozen=True, slots=True)
class Setting:
    """How the served path cuts and reads a claim's evidence."""

    window_chars: int
    max_windows: int
    max_length: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        """``"640x3x192"``: window characters x windows x tokens."""
        try:
            chars, windows, length = (int(x) for x in text.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"a setting is CHARSxWINDOWSxTOKENS such as 640x3x192, got {text!r}"
            ) from None
        if chars < 50 or windows < 1 or not 16 <= length <= 512:
            raise argparse.ArgumentTypeError(
                f"window chars must be >= 50, windows >= 1, tokens in [16, 512]; got {text!r}"
            )
        return cls(chars, windows, length)

    @property
    def name(self) -> str:
        return f"{self.window_chars}x{self.max_windows}x{self.max_length}"


@dataclass(frozen=True, slots=True)
class Scored:
    """One claim under one setting."""

    p: float
    windows: int
    tokens: int  # summed over its (claim, window) pairs
    ms: float


class SettingScorer:
    """The shipped network and calibration, one encoder per max_length (one ONNX session)."""

    def __init__(self, verifier: OnnxVerifier, model_dir: Path, threads: int = 1) -> None:
        ort = onnxruntime()

        self.verifier = verifier
        self._tokenizer = model_dir / verifier.artifact.tokenizer_file
        options = ort.SessionOptions()  # as OnnxVerifier.load sets it up
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(model_dir / verifier.artifact.onnx_file),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self._by_length: dict[int, tuple[OnnxVerifier, PairEncoder]] = {}
        self._cache: dict[tuple[int, str, str], tuple[float, int, float]] = {}

    def _at(self, max_length: int) -> tuple[OnnxVerifier, PairEncoder]:
        if max_length not in self._by_length:
            base = self.verifier
            artifact = base.artifact.model_copy(update={"max_length": max_length})
            encoder = PairEncoder.from_file(self._tokenizer, max_length)
            counter = PairEncoder.from_file(self._tokenizer, max_length)
            served = OnnxVerifier(
                artifact, self._session, encoder, calibration=base.calibration, band=base.band
            )
            self._by_length[max_length] = (served, counter)
        return self._by_length[max_length]

    def _pair(
        self, max_length: int, claim: str, window: str, question: str
    ) -> tuple[float, int, float]:
        """(logit, tokens, ms) of one (claim, window) pair at ``max_length``; run once."""
        key = (max_length, first_segment(claim, question, question_in_input=True), window)
        if key not in self._cache:
            served, counter = self._at(max_length)
            started = time.perf_counter()
            (logit,) = served.logits([(claim, window)], [question]).tolist()
            ms = (time.perf_counter() - started) * 1000.0
            (feed,) = counter.encode_each(served.inputs([(claim, window)], [question]))
            self._cache[key] = (float(logit), int(feed["input_ids"].shape[1]), ms)
        return self._cache[key]

    def score(self, index: EvidenceIndex, item: PairItem, setting: Setting) -> Scored:
        """p(supported) of one claim as the sidecar serves it under ``setting``."""
        started = time.perf_counter()
        windows = index.windows(
            item.claim,
            item.question,
            max_windows=setting.max_windows,
            max_chars=setting.window_chars,
        )
        cut_ms = (time.perf_counter() - started) * 1000.0
        if not windows:
            return Scored(0.0, 0, 0, cut_ms)
        runs = [self._pair(setting.max_length, item.claim, w, item.question) for w in windows]
        best = max(range(len(runs)), key=lambda k: (runs[k][0], -k))  # first of the highest
        covered = self.verifier.coverages([(item.claim, windows[best])], [item.question])
        (p,) = self.verifier.calibration.probability(
            np.array([runs[best][0]]), np.array(covered)
        ).tolist()
        return Scored(
            float(p), len(windows), sum(r[1] for r in runs), cut_ms + sum(r[2] for r in runs)
        )


def sample_items(pairs: Sequence[Pair], n: int, seed: int) -> list[PairItem]:
    """A seeded sample of ``n`` pairs (all when fewer), as labelled pair items."""
    rng = random.Random(seed)
    chosen = rng.sample(list(pairs), min(n, len(pairs)))
    return [PairItem(p.claim, p.evidence, p.label, p.question, p.kind) for p in chosen]


def resampled_auroc(
    scores: npt.NDArray[np.float64], labels: npt.NDArray[np.int64], draws: npt.NDArray[np.intp]
) -> npt.NDArray[np.float64]:
    """AUROC (ties count 1/2) of each resample: ``draws`` holds one row of pair indices per
    resample. With ``c`` the times each pair is drawn, AUROC = sum of c_i c_j over (positive
    i, negative j) of [s_i > s_j] + [s_i = s_j] / 2, over (drawn positives x drawn negatives)."""
    pos = np.flatnonzero(labels == 1)
    neg = np.flatnonzero(labels != 1)
    wins = (scores[pos, None] > scores[None, neg]) + 0.5 * (scores[pos, None] == scores[None, neg])
    counts = np.stack([np.bincount(row, minlength=labels.size) for row in draws]).astype(float)
    c_pos, c_neg = counts[:, pos], counts[:, neg]
    won = np.einsum("dp,pq,dq->d", c_pos, wins, c_neg)
    return np.asarray(won / (c_pos.sum(axis=1) * c_neg.sum(axis=1)), dtype=np.float64)


def paired_bootstrap(
    reference: npt.NDArray[np.float64],
    other: npt.NDArray[np.float64],
    labels: npt.NDArray[np.int64],
    threshold: float,
    *,
    draws: int = 2000,
    seed: int = 0,
) -> dict[str, list[float]]:
    """95% intervals of ``other - reference`` AUROC and accuracy, resampling the same pairs
    (a resample holding one label only is drawn again)."""
    rng = np.random.default_rng(seed)
    n = labels.size
    rows = rng.integers(0, n, (draws, n))
    mixed = labels[rows].min(axis=1) != labels[rows].max(axis=1)
    while not mixed.all():
        rows[~mixed] = rng.integers(0, n, (int((~mixed).sum()), n))
        mixed = labels[rows].min(axis=1) != labels[rows].max(axis=1)
    d_auroc = resampled_auroc(other, labels, rows) - resampled_auroc(reference, labels, rows)
    right_ref = (reference >= threshold) == (labels == 1)
    right_other = (other >= threshold) == (labels == 1)
    d_acc = right_other[rows].mean(axis=1) - right_ref[rows].mean(axis=1)
    return {
        "auroc_diff_ci95": [round(float(x), 4) for x in np.quantile(d_auroc, [0.025, 0.975])],
        "accuracy_diff_ci95": [round(float(x), 4) for x in np.quantile(d_acc, [0.025, 0.975])],
    }


def evaluate_form(
    scorer: SettingScorer,
    items: Sequence[PairItem],
    settings: Sequence[Setting],
    *,
    progress: bool,
    desc: str,
) -> dict[str, list[Scored]]:
    """Every item under every setting, claim by claim, the settings in turn."""
    out: dict[str, list[Scored]] = {s.name: [] for s in settings}
    for item in tqdm(items, desc=desc, unit="claim", disable=not progress):
        index = EvidenceIndex([EvidenceChunk("evidence", item.evidence)])
        for setting in settings:
            out[setting.name].append(scorer.score(index, item, setting))
    return out


THRESHOLDS = tuple(round(0.3 + 0.02 * k, 2) for k in range(21))  # 0.30 .. 0.70


def accuracy_by_threshold(
    probs: npt.NDArray[np.float64], labels: npt.NDArray[np.int64]
) -> dict[str, float]:
    """Accuracy if "supported" began at each of ``THRESHOLDS`` instead of the served band:
    whether one threshold serves every task form (one band is served for all of them)."""
    return {f"{t:.2f}": round(float(((probs >= t) == (labels == 1)).mean()), 4) for t in THRESHOLDS}


def summarise(
    items: Sequence[PairItem], scored: dict[str, list[Scored]], band: Band, reference: str
) -> dict[str, dict[str, Any]]:
    """Per setting: AUROC and accuracy at the served band, windows, tokens and ms per claim;
    beside the reference, the paired bootstrap intervals of the differences."""
    labels = np.array([item.label for item in items], dtype=np.int64)
    ref = np.array([s.p for s in scored[reference]])
    rows: dict[str, dict[str, Any]] = {}
    for name, results in scored.items():
        probs = [s.p for s in results]
        report = pair_report(probs, items, band)
        pairs = sum(s.windows for s in results)
        row: dict[str, Any] = {
            "n": report["n"],
            "supported": report["supported"],
            "auroc": report["auroc"],
            "accuracy": report["accuracy"],
            "balanced_accuracy": report["balanced_accuracy"],
            "windows_per_claim": round(pairs / max(1, len(results)), 3),
            "tokens_per_pair": round(sum(s.tokens for s in results) / max(1, pairs), 1),
            "tokens_per_claim": round(sum(s.tokens for s in results) / max(1, len(results)), 1),
            "ms_per_claim": round(float(np.mean([s.ms for s in results])), 2),
            "accuracy_by_threshold": accuracy_by_threshold(np.array(probs), labels),
        }
        if name != reference:
            row.update(paired_bootstrap(ref, np.array(probs), labels, band.supported_from))
        rows[name] = row
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/verifier"))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--split", choices=["val", "test"], default="val")
    parser.add_argument("--forms", nargs="+", default=list(DEFAULT_FORMS))
    parser.add_argument(
        "--settings",
        nargs="+",
        type=Setting.parse,
        default=[Setting.parse(s) for s in DEFAULT_SETTINGS],
        help="CHARSxWINDOWSxTOKENS; the first is the reference of the bootstrap differences",
    )
    parser.add_argument("--n", type=int, default=300, help="pairs per form (seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=None, help="default bench/results/evidence_settings/SPLIT.json"
    )
    args = parser.parse_args()

    split: Split = args.split
    verifier = OnnxVerifier.load(args.model, threads=args.threads)
    artifact = verifier.artifact
    scorer = SettingScorer(verifier, args.model, args.threads)
    sets = form_sets(CorpusConfig(args.data_dir, seed=0), split, args.forms)
    settings: list[Setting] = args.settings
    reference = settings[0].name
    verifier.logits([("warm", "up")], [""])
    results: dict[str, Any] = {}
    for form in args.forms:
        items = sample_items(sets[form], args.n, args.seed)
        scored = evaluate_form(scorer, items, settings, progress=not args.no_progress, desc=form)
        results[form] = summarise(items, scored, verifier.band, reference)
    overall: dict[str, dict[str, float]] = {}
    for setting in settings:
        rows = [results[form][setting.name] for form in args.forms]
        ref_rows = [results[form][reference] for form in args.forms]
        ms = float(np.mean([r["ms_per_claim"] for r in rows]))
        tokens = float(np.mean([r["tokens_per_claim"] for r in rows]))
        overall[setting.name] = {
            "ms_per_claim_mean_of_forms": round(ms, 2),
            "cost_vs_reference_ms": round(ms / np.mean([r["ms_per_claim"] for r in ref_rows]), 3),
            "cost_vs_reference_tokens": round(
                tokens / np.mean([r["tokens_per_claim"] for r in ref_rows]), 3
            ),
        }
    out = {
        "model": verifier.version,
        "onnx_sha256": artifact.onnx_sha256,
        "split": split,
        "n_per_form": args.n,
        "seed": args.seed,
        "threads": args.threads,
        "band": [verifier.band.unsupported_below, verifier.band.supported_from],
        "served": Setting(
            artifact.evidence_max_chars, artifact.evidence_max_windows, artifact.max_length
        ).name,
        "reference": reference,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "note": "ms on a shared machine: compare settings of one run only",
        "forms": results,
        "overall": overall,
    }
    path: Path = args.out or Path(f"bench/results/evidence_settings/{split}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
