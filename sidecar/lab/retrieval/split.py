"""A deterministic calibration / test split of a question file.

Each question is ranked by ``sha256("<seed>:<line>:<question>")`` and the first
``round(n * cal_fraction)`` in that order form the calibration part; the rest is
the test part. The split depends only on the file's content, the seed and the
fraction (not on numpy's generator streams), so the calibrate and eval commands
agree on it across versions and machines, and the two parts are disjoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal, TypeVar

from sidecar.exceptions import ConfigError
from sidecar.lab.retrieval.corpus import QARecord

__all__ = ["Split", "select_split", "split_indices"]

Split = Literal["cal", "test", "all"]
T = TypeVar("T", bound=QARecord)


def split_indices(
    records: Sequence[QARecord], *, seed: int, cal_fraction: float
) -> tuple[list[int], list[int]]:
    """Positions of the calibration and the test questions, each in file order."""
    if not 0.0 < cal_fraction < 1.0:
        raise ConfigError(f"cal_fraction must be in (0, 1), got {cal_fraction!r}")

    def rank(i: int) -> str:
        rec = records[i]
        return hashlib.sha256(f"{seed}:{rec.index}:{rec.question}".encode()).hexdigest()

    order = sorted(range(len(records)), key=rank)
    n_cal = round(len(records) * cal_fraction)
    return sorted(order[:n_cal]), sorted(order[n_cal:])


def select_split(
    records: Sequence[T],
    split: Split,
    *,
    seed: int,
    cal_fraction: float,
    max_questions: int | None = None,
) -> list[T]:
    """The records of one part (``all``: every record), optionally only its first ``max``."""
    if split == "all":
        chosen = list(records)
    else:
        cal, test = split_indices(records, seed=seed, cal_fraction=cal_fraction)
        chosen = [records[i] for i in (cal if split == "cal" else test)]
    if max_questions is not None:
        if max_questions < 1:
            raise ConfigError(f"max_questions must be >= 1, got {max_questions!r}")
        chosen = chosen[:max_questions]
    return chosen
