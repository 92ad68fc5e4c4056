"""Training data mixing: in-domain outcome pairs split and mixed in, and the cached corpus.

In-domain pairs come from the sidecar's own outcome rows (SmolLM2 answers to
NQ-open, :mod:`sidecar.lab.verifier.outcomes`; ``--outcomes``,
``--lookback``, ``--holdout``): 80 % are added to training, 20 % to
validation, split by question hash. The whole-mixture corpus
(:func:`~sidecar.lab.verifier.datasets.build_corpus`) is built once per work
dir and checked against its settings.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path

from sidecar.exceptions import ConfigError
from sidecar.lab.verifier.datasets import (
    Corpus,
    CorpusConfig,
    build_corpus,
    read_corpus,
    write_corpus,
)
from sidecar.lab.verifier.outcomes import (
    OutcomeRecord,
    outcome_pairs,
    read_lookback,
    read_outcome_rows,
    trust_cutoff,
)
from sidecar.lab.verifier.settings import TrainConfig
from sidecar.lab.verifier.sources import Pair, split_of

__all__ = ["load_or_build_corpus", "mix", "outcome_counts", "outcome_split"]

log = logging.getLogger(__name__)


def outcome_counts(pairs: Sequence[Pair]) -> dict[str, int]:
    """Pairs per kind."""
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p.kind] = counts.get(p.kind, 0) + 1
    return counts


def outcome_split(config: TrainConfig, held: set[str]) -> dict[str, list[Pair]]:
    """In-domain pairs of the fit rows / lookback shards, split by question hash."""
    records: list[OutcomeRecord] = []
    for path in config.outcomes:
        records.extend(r for r in read_outcome_rows(path) if r.question.strip().lower() not in held)
    if config.lookback:
        if not config.outcomes or config.nq_path is None:
            raise ConfigError("lookback shards need --outcomes rows (trust cut-off) and --nq")
        from sidecar.lab.retrieval.workflow import load_corpus  # noqa: PLC0415

        corpus = load_corpus([config.nq_path], config.chunk_words)
        texts = {c.chunk_id: c.text for c in corpus.chunks}
        cutoff = trust_cutoff(config.outcomes[0])
        for path in config.lookback:
            records.extend(read_lookback(path, texts, cutoff, exclude=held))
    seen: set[str] = set()
    unique = []
    for r in records:
        key = r.question.strip().lower()
        if key not in seen:
            seen.add(key)
            unique.append(r)
    frac = config.outcomes_val_fraction
    parts: dict[str, list[Pair]] = {"train": [], "val": []}
    for part, seed in (("train", config.seed), ("val", config.seed + 1)):
        chosen = [
            r for r in unique if (split_of(r.question, frac, 0.0) == "val") == (part == "val")
        ]
        pairs, counts = outcome_pairs(chosen, seed=seed)
        log.info("outcome pairs %s: %d %s", part, len(pairs), counts)
        parts[part] = pairs
    return parts


def mix(base: Sequence[Pair], extra: Sequence[Pair], seed: int) -> list[Pair]:
    """``base`` and ``extra`` in one seeded shuffle."""
    out = [*base, *extra]
    random.Random(seed).shuffle(out)  # noqa: S311 - data order, not cryptography
    return out


def load_or_build_corpus(corpus_config: CorpusConfig, work_dir: Path) -> Corpus:
    """The corpus cached in ``work_dir/corpus`` (built once; checked against its settings)."""
    folder = work_dir / "corpus"
    wanted = {
        "seed": corpus_config.seed,
        "window_chars": corpus_config.window_chars,
        "qa_limit": corpus_config.qa_limit,
        "train_caps": dict(corpus_config.train_caps),
    }
    if (folder / "manifest.json").is_file():
        corpus = read_corpus(folder)
        have = {k: corpus.manifest.get(k) for k in wanted}
        if have != wanted:
            raise ConfigError(
                f"the corpus in {folder} was built with {have}, this run asks for {wanted}: "
                "use the same settings or another --work-dir"
            )
        return corpus
    started = time.monotonic()
    corpus = build_corpus(corpus_config)
    write_corpus(corpus, folder)
    log.info("corpus built in %.0f s: %s", time.monotonic() - started, corpus.manifest["train"])
    return corpus
