"""The verifier's corpus: every source in one pair format, split, length matched, windowed, cached.

:func:`build_corpus` reads every source (:mod:`sidecar.lab.verifier.sources`),
builds the QA and NQ pairs (:mod:`sidecar.lab.verifier.pairs`), splits by
group (question, document, knowledge snippet or claim), matches lengths per
source and split (:func:`length_matched`) and cuts the evidence to the
window the verifier reads (:func:`windowed`); :func:`write_corpus` and
:func:`read_corpus` keep it with a manifest of hashes and baselines.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Final

from sidecar.claims.calibration import coverage
from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex
from sidecar.exceptions import ConfigError, InputError
from sidecar.hashing import sha256_tree
from sidecar.lab.verifier.metrics import auroc_or_nan
from sidecar.lab.verifier.pairs import (
    PairBuilder,
    build_eval_sets,
    build_training_pairs,
    entities,
)
from sidecar.lab.verifier.sources import (
    Pair,
    Split,
    json_object,
    read_begin,
    read_factcheckgpt,
    read_halueval_dialogue,
    read_halueval_qa,
    read_halueval_summarization,
    read_nq_open,
    read_summedits,
    split_of,
    text_lines,
)

__all__ = [
    "ALL_SOURCES",
    "Corpus",
    "CorpusConfig",
    "altered_copies",
    "baselines",
    "build_corpus",
    "by_split",
    "form_sets",
    "length_auroc",
    "length_matched",
    "overlap_auroc",
    "pairs_digest",
    "read_corpus",
    "read_pairs",
    "source_splits",
    "windowed",
    "write_corpus",
    "write_pairs",
]

# The task forms of the held-out sets (a corpus's ``test`` keys).
FORMS: Final = (
    "qa",
    "qa-decl",
    "sentences",
    "summaries",
    "dialogue",
    "factcheck",
    "summedits",
    "begin",
)
SOURCE_FORM: Final = {
    "halueval-summarization": "summaries",
    "halueval-dialogue": "dialogue",
    "factcheckgpt": "factcheck",
    "summedits": "summedits",
    "begin": "begin",
}


def length_auroc(pairs: Sequence[Pair]) -> float:
    """AUROC of claim length (characters) alone for telling unsupported (0) from supported."""
    return auroc_or_nan([float(len(p.claim)) for p in pairs], [1 - p.label for p in pairs])


# --------------------------------------------------------------------------- builders

# --------------------------------------------------------------------------- set shaping


def windowed(
    pairs: Sequence[Pair], window_chars: int, *, question_aware: bool = True
) -> list[Pair]:
    """Each pair with its evidence cut to the best window for its claim (and question)."""
    indexes: dict[str, EvidenceIndex] = {}
    out: list[Pair] = []
    for p in pairs:
        index = indexes.get(p.evidence)
        if index is None:
            index = indexes[p.evidence] = EvidenceIndex([EvidenceChunk("doc", p.evidence)])
        asked = p.question if question_aware else ""
        found = index.windows(p.claim, asked, max_windows=1, max_chars=window_chars)
        out.append(replace(p, evidence=found[0] if found else ""))
    return out


def length_matched(pairs: Sequence[Pair], seed: int, growth: float = 1.15) -> list[Pair]:
    """Equal numbers of supported and unsupported pairs in every claim-length bin.

    Bins are geometric in characters (each ``growth`` times wider than the
    last); a bin keeps as many pairs of each label as its smaller label has
    (seeded choice), so claim length alone says nothing about the label
    (length-only AUROC ~0.5) and the classes are balanced.
    """
    rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
    bins: dict[int, tuple[list[Pair], list[Pair]]] = defaultdict(lambda: ([], []))
    for p in pairs:
        bins[int(math.log(max(1, len(p.claim))) / math.log(growth))][p.label].append(p)
    out: list[Pair] = []
    for key in sorted(bins):
        neg, pos = bins[key]
        n = min(len(neg), len(pos))
        out.extend(rng.sample(neg, n) + rng.sample(pos, n))
    rng.shuffle(out)
    return out


def overlap_auroc(pairs: Sequence[Pair]) -> float:
    """AUROC of lexical coverage alone (claim terms found in the evidence) for supported."""
    return auroc_or_nan([coverage(p.claim, p.evidence) for p in pairs], [p.label for p in pairs])


def by_split(pairs: Iterable[Pair]) -> dict[Split, list[Pair]]:
    """Pairs per split of their group (document or claim): a group is never in two splits."""
    out: dict[Split, list[Pair]] = {"train": [], "val": [], "test": []}
    for p in pairs:
        out[split_of(p.group)].append(p)
    return out


def baselines(pairs: Sequence[Pair]) -> dict[str, float | int]:
    """n, supported share, length-only and overlap-only AUROC of one pair set."""
    return {
        "n": len(pairs),
        "supported": sum(p.label for p in pairs),
        "length_auroc": round(length_auroc(pairs), 4),
        "overlap_auroc": round(overlap_auroc(pairs), 4),
    }


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True, slots=True)
class CorpusConfig:
    """What determines the verifier's corpus (recorded in its manifest).

    ``data_dir`` is the shared data folder (data README layout);
    ``window_chars`` the evidence window the network reads (a 256-token input
    holds a ~900-character window beside a summary-length claim);
    ``train_caps`` the most training pairs per source after length matching
    (seeded subsample; sources not named are not capped), so one epoch fits a
    CPU budget and no source dominates; ``qa_limit`` the HaluEval QA training
    records (NQ-open: a quarter of that).
    """

    data_dir: Path
    seed: int = 0
    window_chars: int = 900
    qa_limit: int | None = None
    train_caps: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.window_chars < 100:
            raise ConfigError(f"window_chars must be >= 100, got {self.window_chars}")
        bad = [name for name, cap in self.train_caps if cap < 1 or name not in ALL_SOURCES]
        if bad:
            raise ConfigError(
                f"train_caps must name sources of {', '.join(ALL_SOURCES)} with caps >= 1; "
                f"wrong: {', '.join(bad)}"
            )

    def files(self) -> dict[str, Path]:
        d = self.data_dir
        return {
            "halueval-qa": d / "halueval" / "qa_data.json",
            "nq-open": d / "nq-open" / "nq-open-oracle.dev.jsonl.gz",
            "halueval-summarization": d / "halueval" / "summarization_train.jsonl",
            "halueval-dialogue": d / "halueval" / "dialogue_train.jsonl",
            "summedits": d / "grounding" / "summedits",
            "factcheckgpt": d
            / "grounding"
            / "factcheckgpt"
            / "subtasks"
            / "subtask3_claim_evidence_stance.jsonl",
            "begin": d / "grounding" / "begin",
        }


ALL_SOURCES: Final = (
    "halueval-qa",
    "nq-open",
    "halueval-summarization",
    "halueval-dialogue",
    "summedits",
    "factcheckgpt",
    "begin",
)


@dataclass(frozen=True, slots=True)
class Corpus:
    """Training, validation and held-out pairs (evidence already windowed) + their manifest."""

    train: list[Pair]
    val: list[Pair]
    test: dict[str, list[Pair]]
    manifest: dict[str, object]


def altered_copies(pairs: Sequence[Pair], seed: int) -> list[Pair]:
    """Copied-but-altered negatives for supported pairs (BEGIN's near-copy artefact).

    Each supported claim gets one shared word (a name, a number, else the
    longest content word also in the evidence) replaced by one from another
    pair's evidence: the copy keeps its overlap but is no longer supported.
    """
    rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
    pool = sorted({w for p in pairs for w in re.findall(r"[A-Za-z]{5,}", p.evidence)})
    builder = PairBuilder(seed, [], [e for p in pairs[:2000] for e in entities(p.evidence)[:3]])
    out: list[Pair] = []
    for p in pairs:
        if p.label != 1:
            continue
        altered = builder.swap(p.claim, p.evidence)
        if altered is None or altered == p.claim:
            have = {w.lower() for w in re.findall(r"[A-Za-z]{5,}", p.evidence)}
            shared = [w for w in re.findall(r"[A-Za-z]{5,}", p.claim) if w.lower() in have]
            shared = [w for w in shared if w.lower() not in _STOPLIKE]
            if not shared or not pool:
                continue
            target = max(shared, key=len)
            other = rng.choice(pool)
            if other.lower() in have:
                continue
            altered = re.sub(rf"\b{re.escape(target)}\b", other, p.claim, count=1)
        out.append(replace(p, claim=altered, label=0, kind=f"{p.source}-altered"))
    return out


_STOPLIKE: Final = frozenset(
    {"there", "their", "about", "which", "would", "could", "these", "those"}
)


def _read_source(name: str, path: Path) -> list[Pair]:
    if name == "halueval-summarization":
        return read_halueval_summarization(path)
    if name == "halueval-dialogue":
        return read_halueval_dialogue(path)
    if name == "summedits":
        return read_summedits(path)
    if name == "factcheckgpt":
        return read_factcheckgpt(path)
    pairs = read_begin(path)
    return [*pairs, *altered_copies(pairs, seed=0)]


def source_splits(name: str, path: Path, seed: int) -> dict[Split, list[Pair]]:
    """One grounding source's pairs per split, evidence whole, each split length matched
    (seed ``seed + k`` for the k-th split of train, val, test), as :func:`build_corpus` reads
    them before it cuts the evidence to a window."""
    parts = by_split(_read_source(name, path))
    return {part: length_matched(pairs, seed + k) for k, (part, pairs) in enumerate(parts.items())}


def form_sets(
    config: CorpusConfig, split: Split, forms: Sequence[str] = FORMS
) -> dict[str, list[Pair]]:
    """The pairs of each task form in ``forms`` for ``split``, with their evidence whole.

    The same claims, labels and questions as :func:`build_corpus`'s sets of that form (for
    ``split="test"`` its held-out sets), before :func:`windowed` cuts the evidence: for
    scoring the serving path's own evidence windows (``bench/evidence_settings.py``).
    """
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        raise ConfigError(f"forms must be among {', '.join(FORMS)}; unknown: {', '.join(unknown)}")
    files = config.files()
    out: dict[str, list[Pair]] = {}
    qa_forms = {
        "qa": "length-matched-qa",
        "qa-decl": "length-matched-decl",
        "sentences": "sentences",
    }
    if any(f in qa_forms for f in forms):
        qa = read_halueval_qa(files["halueval-qa"])
        nq = read_nq_open(files["nq-open"])
        sets = build_eval_sets(qa, nq, split=split, seed=config.seed + 2, whole_evidence=True)
        out.update({f: sets[qa_forms[f]] for f in forms if f in qa_forms})
    for name, form in SOURCE_FORM.items():
        if form in forms:
            out[form] = source_splits(name, files[name], config.seed)[split]
    return {f: out[f] for f in forms}


def build_corpus(config: CorpusConfig) -> Corpus:
    """Every source -> one pair format, split by document / claim, length matched, windowed.

    * HaluEval QA + NQ-open: :func:`build_training_pairs` / :func:`build_eval_sets`
      (split by question; QA claims are the answers, the question rides along);
    * the grounding sources: split by document (SummEdits, HaluEval
      summarization), knowledge snippet (dialogue, BEGIN) or claim
      (Factcheck-GPT); each split length matched per source
      (:func:`length_matched`); BEGIN gets copied-but-altered negatives;
    * held-out sets per task form: the test split of each.
    """
    files = config.files()
    missing = [f"{name}: {path}" for name, path in files.items() if not path.exists()]
    if missing:
        raise ConfigError(f"corpus sources missing under {config.data_dir}: {'; '.join(missing)}")
    seed, window = config.seed, config.window_chars
    caps = dict(config.train_caps)
    qa = read_halueval_qa(files["halueval-qa"])
    nq = read_nq_open(files["nq-open"])
    limit_nq = None if config.qa_limit is None else max(1, config.qa_limit // 4)
    train = build_training_pairs(
        qa,
        nq,
        "train",
        seed=seed,
        limit_qa=config.qa_limit,
        limit_nq=limit_nq,
        window_chars=window,
    )
    rng = random.Random(seed)  # noqa: S311 - data sampling, not cryptography
    for source in ("halueval-qa", "nq-open"):
        if source in caps:
            mine = [p for p in train if p.source == source]
            keep = set(map(id, rng.sample(mine, min(caps[source], len(mine)))))
            train = [p for p in train if p.source != source or id(p) in keep]
    val = build_training_pairs(qa, nq, "val", seed=seed + 1, window_chars=window)
    sets = build_eval_sets(qa, nq, split="test", seed=seed + 2, window_chars=window)
    test: dict[str, list[Pair]] = {
        "qa": sets["length-matched-qa"],
        "qa-decl": sets["length-matched-decl"],
        "sentences": sets["sentences"],
        "qa-natural": sets["natural"],
    }
    counts: dict[str, dict[str, int]] = {}
    for name in ALL_SOURCES[2:]:
        matched = source_splits(name, files[name], seed)
        if name in caps and len(matched["train"]) > caps[name]:
            matched["train"] = rng.sample(matched["train"], caps[name])
        counts[name] = {part: len(pairs) for part, pairs in matched.items()}
        train.extend(windowed(matched["train"], window))
        val.extend(windowed(matched["val"], window))
        test[SOURCE_FORM[name]] = windowed(matched["test"], window)
    rng.shuffle(train)
    manifest: dict[str, object] = {
        "seed": seed,
        "window_chars": window,
        "qa_limit": config.qa_limit,
        "train_caps": caps,
        "split_rule": "sha256(lower(group)) -> test 10% / val 10% / train 80%; group = question "
        "(QA, NQ), document (summaries, SummEdits), knowledge (dialogue, BEGIN), claim "
        "(Factcheck-GPT)",
        "files_sha256": {name: sha256_tree(path) for name, path in files.items()},
        "pairs_per_split": counts,
        "train": {**baselines(train), "sha256": pairs_digest(train)},
        "train_by_source": {s: baselines([p for p in train if p.source == s]) for s in ALL_SOURCES},
        "val": {**baselines(val), "sha256": pairs_digest(val)},
        "test": {
            name: {**baselines(pairs), "sha256": pairs_digest(pairs)}
            for name, pairs in test.items()
        },
    }
    return Corpus(train, val, test, manifest)


def pairs_digest(pairs: Sequence[Pair]) -> str:
    """sha256 over the pairs' claims, evidence, questions and labels, in order."""
    digest = hashlib.sha256()
    for p in pairs:
        digest.update(json.dumps([p.claim, p.evidence, p.question, p.label]).encode("utf-8"))
    return digest.hexdigest()


def write_pairs(path: Path, pairs: Iterable[Pair]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for p in pairs:
            handle.write(json.dumps(asdict(p)) + "\n")


def read_pairs(path: Path) -> list[Pair]:
    """Pairs written by :func:`write_pairs`."""
    out: list[Pair] = []
    for lineno, line in text_lines(path):
        obj = json_object(path, lineno, line)
        try:
            out.append(Pair(**obj))  # type: ignore[arg-type]
        except TypeError as exc:
            raise InputError("schema-violation", f"{path}:{lineno}: not a pair ({exc})") from None
    return out


def write_corpus(corpus: Corpus, out_dir: Path) -> None:
    """``train.jsonl``, ``val.jsonl``, ``test-<form>.jsonl`` and ``manifest.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(out_dir / "train.jsonl", corpus.train)
    write_pairs(out_dir / "val.jsonl", corpus.val)
    for name, pairs in corpus.test.items():
        write_pairs(out_dir / f"test-{name}.jsonl", pairs)
    (out_dir / "manifest.json").write_text(json.dumps(corpus.manifest, indent=2), encoding="utf-8")


def read_corpus(out_dir: Path) -> Corpus:
    """A corpus written by :func:`write_corpus`; its hashes are checked against the manifest."""
    path = out_dir / "manifest.json"
    if not path.is_file():
        raise ConfigError(f"no corpus manifest at {path}")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    train = read_pairs(out_dir / "train.jsonl")
    val = read_pairs(out_dir / "val.jsonl")
    test = {name: read_pairs(out_dir / f"test-{name}.jsonl") for name in manifest["test"]}
    if pairs_digest(train) != manifest["train"]["sha256"]:
        raise ConfigError(f"{out_dir}/train.jsonl does not match its manifest: rebuild the corpus")
    return Corpus(train, val, test, manifest)
