"""Evaluating verifiers and claim checkers on held-out data (offline tooling, no torch).

Two levels:

* :func:`evaluate_pairs` - the verifier alone on (claim, evidence, label) pairs
  from :mod:`sidecar.lab.verifier.datasets`: AUROC / accuracy / F1 of the supported
  probability, the share of ``uncertain`` labels from the calibrated band, and
  the AUROC of claim length alone (the HaluEval artefact; must be ~0.5 on the
  length-matched sets);
* :func:`evaluate_items` - whole answers (``guardrail eval claims``): each
  HaluEval item (right and hallucinated answer / summary / response) is cut
  into claims and checked with the same :class:`~sidecar.claims.scorer.ClaimScorer`
  the sidecar runs (evidence selection, rule tier, verifier). Its hallucination
  score is ``1 - min p(supported)`` over its claims; the item counts as
  detected-hallucinated when any claim is unsupported (docs/methods.md §Claim
  verification: one unverified claim already raises the hallucination rate
  above 0).

Generic labelled pairs (``--format pairs``, :func:`read_pair_items`): one JSON
object a line ``{"evidence", "claim", "label": 1|0, "question"?, "id"?}``
(label 1 = the evidence supports the claim); each claim is checked as served
(:func:`check_pair_items`: evidence windows, the verifier, the rule tier; the
verifier alone is :func:`score_pair_items`) and
:func:`pair_report` gives accuracy / precision / recall / F1 at the served
threshold (the artifact's ``supported_from``: a claim counts as supported
only when the sidecar would label it so), balanced accuracy, AUROC, ECE and
the AUROC of claim length alone.

Readers of the three HaluEval formats live here too (one JSON object a line):
QA ``knowledge, question, right_answer, hallucinated_answer``; summarization
``document, right_summary, hallucinated_summary``; dialogue ``knowledge,
dialogue_history, right_response, hallucinated_response``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from sidecar.claims.atomic import Claim
from sidecar.claims.calibration import Band
from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex
from sidecar.claims.scorer import ClaimCheck, ClaimScorer
from sidecar.claims.segment import segment_claims
from sidecar.contracts.events import ClaimLabel
from sidecar.exceptions import InputError
from sidecar.lab.verifier.jsonl import iter_json_objects
from sidecar.lab.verifier.metrics import (
    auroc_or_nan,
    balanced_accuracy,
    binary_report,
    ece_or_nan,
)
from sidecar.lab.verifier.sources import Pair, split_of

__all__ = [
    "FORMATS",
    "EvalItem",
    "Format",
    "PairItem",
    "check_pair_checks",
    "check_pair_items",
    "evaluate_items",
    "evaluate_pairs",
    "held_out",
    "pair_report",
    "pair_windows",
    "read_items",
    "read_pair_items",
    "score_item",
    "score_pair_items",
    "served_and_network",
]

Format = Literal["halueval-qa", "halueval-summarization", "halueval-dialogue"]
FORMATS: Final[tuple[Format, ...]] = (
    "halueval-qa",
    "halueval-summarization",
    "halueval-dialogue",
)
_FIELDS: Final[dict[Format, tuple[str, str, str, str | None]]] = {
    # context, right candidate, hallucinated candidate, extra (question / dialogue history)
    "halueval-qa": ("knowledge", "right_answer", "hallucinated_answer", "question"),
    "halueval-summarization": ("document", "right_summary", "hallucinated_summary", None),
    "halueval-dialogue": (
        "knowledge",
        "right_response",
        "hallucinated_response",
        "dialogue_history",
    ),
}


def _rounded(x: float) -> float:
    return round(x, 4)


def evaluate_pairs(
    probabilities: Callable[[Sequence[tuple[str, str]], Sequence[str]], list[float]],
    pairs: Sequence[Pair],
    band: Band,
) -> dict[str, float | int | str]:
    """The verifier's numbers on one pair set (label 1 = supported).

    ``probabilities`` gets the (claim, evidence) texts and each pair's question.
    """
    probs = probabilities([(p.claim, p.evidence) for p in pairs], [p.question for p in pairs])
    labels = [p.label for p in pairs]
    support = binary_report(probs, labels, threshold=0.5)
    halluc = binary_report([1 - q for q in probs], [1 - y for y in labels], threshold=0.5)
    three = [band.label(q) for q in probs]
    decided = [(lab, y) for lab, y in zip(three, labels, strict=True)]
    decided = [(lab, y) for lab, y in decided if lab is not ClaimLabel.UNCERTAIN]
    correct = sum(1 for lab, y in decided if (lab is ClaimLabel.SUPPORTED) == (y == 1))
    return {
        "n": len(pairs),
        "supported": sum(labels),
        "auroc": _rounded(support.auroc),
        "accuracy": _rounded(support.accuracy),
        "f1_hallucinated": _rounded(halluc.f1),
        "length_auroc": _rounded(
            auroc_or_nan([float(len(p.claim)) for p in pairs], [1 - y for y in labels])
        ),
        "uncertain_share": _rounded(1 - len(decided) / len(pairs)) if pairs else 0.0,
        "accuracy_decided": _rounded(correct / len(decided)) if decided else 0.0,
    }


@dataclass(frozen=True, slots=True)
class EvalItem:
    """One benchmark item: its context, and a candidate that is or is not hallucinated."""

    context: str
    prefix: str | None  # the question (QA) the answer replies to
    candidate: str
    hallucinated: int  # 1 = the hallucinated candidate


def read_items(path: Path, fmt: Format, limit: int | None = None) -> Iterator[tuple[str, EvalItem]]:
    """``(group, item)`` per candidate: two items per line (right, hallucinated)."""
    context_f, right_f, hall_f, extra_f = _FIELDS[fmt]
    count = 0
    for lineno, obj in iter_json_objects(path):
        need = [f for f in (context_f, right_f, hall_f, extra_f) if f is not None]
        missing = [f for f in need if not isinstance(obj.get(f), str)]
        if missing:
            raise InputError(
                "schema-violation",
                f"{path}:{lineno}: format {fmt} needs string fields {', '.join(need)}; "
                f"missing or not a string: {', '.join(missing)}",
            )
        context = str(obj[context_f])
        prefix: str | None = None
        if fmt == "halueval-qa":
            prefix = str(obj["question"])
        elif fmt == "halueval-dialogue":
            context = f"{context}\n{obj['dialogue_history']}"
        group = prefix or context[:200]
        yield group, EvalItem(context, prefix, str(obj[right_f]), 0)
        yield group, EvalItem(context, prefix, str(obj[hall_f]), 1)
        count += 1
        if limit is not None and count >= limit:
            return


def evaluate_items(
    items: Sequence[EvalItem], score_claims: Callable[[EvalItem], list[tuple[ClaimLabel, float]]]
) -> dict[str, float | int]:
    """Detection of the hallucinated candidate: n, accuracy, AUROC, F1 (+ length-only AUROC)."""
    scores: list[float] = []
    flagged: list[int] = []
    labels: list[int] = []
    lengths: list[float] = []
    for item in items:
        results = score_claims(item)
        min_p = min((p for _, p in results), default=1.0)
        scores.append(1.0 - min_p)
        flagged.append(int(any(lab is ClaimLabel.UNSUPPORTED for lab, _ in results)))
        labels.append(item.hallucinated)
        lengths.append(float(len(item.candidate)))
    report = binary_report([float(f) for f in flagged], labels, threshold=0.5)
    return {
        "n": len(items),
        "hallucinated": sum(labels),
        "accuracy": _rounded(report.accuracy),
        "precision": _rounded(report.precision),
        "recall": _rounded(report.recall),
        "f1": _rounded(report.f1),
        "auroc": _rounded(auroc_or_nan(scores, labels)),
        "length_auroc": _rounded(auroc_or_nan(lengths, labels)),
    }


def score_item(scorer: ClaimScorer, item: EvalItem) -> list[tuple[ClaimLabel, float]]:
    """Labels and scores of one benchmark candidate, checked like a streamed answer.

    A QA answer is one claim, the answer itself, and its question goes to the
    scorer (evidence selection, and the network reads ``question [SEP]
    answer`` when the artifact says so), as in training; summaries and
    responses are cut into claims by the segmenter (the whole candidate is
    one claim when the segmenter finds none).
    """
    whole = (0, len(item.candidate))
    if item.prefix is not None:
        claims = [Claim(0, " ".join(item.candidate.split()), whole, whole)]
    else:
        claims = segment_claims(item.candidate) or [Claim(0, item.candidate.strip(), whole, whole)]
    index = scorer.index([EvidenceChunk("context", item.context)])
    checks = scorer.check(claims, index, item.prefix or "")
    return [(c.label, c.score) for c in checks]


def held_out(group: str) -> bool:
    """Whether an item's question is in the verifier's test split (never trained on)."""
    return split_of(group) == "test"


# --------------------------------------------------------------------------- generic pairs


@dataclass(frozen=True, slots=True)
class PairItem:
    """One labelled pair of a ``--format pairs`` file (label 1 = supported)."""

    claim: str
    evidence: str
    label: int
    question: str = ""
    item_id: str = ""


def read_pair_items(path: Path, limit: int | None = None) -> list[PairItem]:
    """``{"evidence": str, "claim": str, "label": 1|0, "question"?: str, "id"?: str|int}`` lines."""
    out: list[PairItem] = []
    for lineno, obj in iter_json_objects(path):
        bad = [f for f in ("evidence", "claim") if not isinstance(obj.get(f), str)]
        if not bad and not str(obj["claim"]).strip():
            bad.append("claim (not blank: an empty claim asserts nothing to check)")
        label: Any = obj.get("label")
        if isinstance(label, bool):  # true / false, as calibrate scores takes them (audit)
            label = int(label)
        if type(label) is not int or label not in (0, 1):
            bad.append("label (1 or 0, or true / false)")
        question = obj.get("question", "")
        if question is None:
            question = ""
        if not isinstance(question, str):
            bad.append("question (a string when present)")
        item_id = obj.get("id", "")
        if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
            bad.append("id (a string or integer when present)")
        if bad:
            raise InputError(
                "schema-violation",
                f"{path}:{lineno}: format pairs needs evidence (string), claim (string), "
                f"label (1 or 0, or true / false), optional question and id; wrong or missing: "
                f"{', '.join(bad)}",
            )
        out.append(
            PairItem(str(obj["claim"]), str(obj["evidence"]), int(label), question, str(item_id))
        )
        if limit is not None and len(out) >= limit:
            break
    return out


def finite_or_none(report: dict[str, float | int]) -> dict[str, float | int | None]:
    """NaN (AUROC of one class, ...) as ``None``: strict JSON has no NaN."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in report.items()}


class WindowScorer(Protocol):
    """What :func:`score_pair_items` needs of a verifier (``OnnxVerifier`` has it)."""

    def window_probabilities(
        self,
        claims: Sequence[str],
        windows: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> list[float]: ...


def pair_windows(
    items: Sequence[PairItem], *, max_windows: int, window_chars: int
) -> list[tuple[str, ...]]:
    """Each item's evidence windows for its claim, as the sidecar cuts them (best first)."""
    return [
        EvidenceIndex([EvidenceChunk("evidence", item.evidence)]).windows(
            item.claim, item.question, max_windows=max_windows, max_chars=window_chars
        )
        for item in items
    ]


def score_pair_items(
    verifier: WindowScorer,
    items: Sequence[PairItem],
    *,
    max_windows: int,
    window_chars: int,
) -> list[float]:
    """p(supported) per item: its claim against up to ``max_windows`` windows of its evidence."""
    windows = pair_windows(items, max_windows=max_windows, window_chars=window_chars)
    return verifier.window_probabilities(
        [item.claim for item in items], windows, [item.question for item in items]
    )


def check_pair_checks(
    scorer: ClaimScorer, items: Sequence[PairItem], *, progress: bool = False
) -> list[ClaimCheck]:
    """Each pair as the sidecar checks a claim: the claim, whole, against its evidence and
    question through :meth:`ClaimScorer.check` (evidence windows, the verifier, the rule
    tier); one check per pair, its ``tier`` saying what decided it.

    Audit: ``--format pairs`` scored the verifier alone; the served check also caps claims
    whose quantities the evidence contradicts, and 18 of 41 year-shifted claims differed.
    """
    from tqdm import tqdm  # noqa: PLC0415 - the CLI's progress bar

    checks: list[ClaimCheck] = []
    for item in tqdm(items, desc="pairs", unit="pair", disable=not progress):
        text = item.claim.strip()
        claim = Claim(0, text, (0, len(text)), (0, len(text)))
        index = scorer.index([EvidenceChunk("evidence", item.evidence)])
        checks.extend(scorer.check([claim], index, item.question))
    return checks


def check_pair_items(
    scorer: ClaimScorer, items: Sequence[PairItem], *, progress: bool = False
) -> tuple[list[float], list[float]]:
    """:func:`check_pair_checks`' served scores and the verifier's own probabilities."""
    return served_and_network(check_pair_checks(scorer, items, progress=progress))


def served_and_network(checks: Sequence[ClaimCheck]) -> tuple[list[float], list[float]]:
    """Each check's served score (the rule tier's cap included) and the verifier's own p."""
    return [c.score for c in checks], [c.verifier_p for c in checks]


def pair_report(
    probs: Sequence[float], items: Sequence[PairItem], band: Band
) -> dict[str, float | int]:
    """Detection numbers for labelled pairs at the served threshold (``band.supported_from``).

    Positive = supported. ``uncertain_share`` / ``accuracy_decided``: the
    share the band leaves uncertain and the accuracy on the rest.
    """
    labels = [item.label for item in items]
    threshold = band.supported_from
    report = binary_report(probs, labels, threshold=threshold)
    decided = [
        (p >= band.supported_from, y)
        for p, y in zip(probs, labels, strict=True)
        if p >= band.supported_from or p < band.unsupported_below
    ]
    return {
        "n": len(items),
        "supported": sum(labels),
        "threshold": _rounded(threshold),
        "accuracy": _rounded(report.accuracy),
        "balanced_accuracy": _rounded(balanced_accuracy(probs, labels, threshold)),
        "precision": _rounded(report.precision),
        "recall": _rounded(report.recall),
        "f1": _rounded(report.f1),
        "auroc": _rounded(report.auroc),
        "ece": _rounded(ece_or_nan(probs, labels)),
        "length_auroc": _rounded(
            auroc_or_nan([float(len(item.claim)) for item in items], [1 - y for y in labels])
        ),
        "uncertain_share": _rounded(1 - len(decided) / len(items)) if items else 0.0,
        "accuracy_decided": _rounded(sum(1 for d, y in decided if d == (y == 1)) / len(decided))
        if decided
        else 0.0,
    }
