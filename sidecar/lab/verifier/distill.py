"""A teacher verifier's logits on the training pairs, for a smaller network to learn from.

``guardrail train verifier … --teacher models/verifier --distill-weight W`` trains on
``(1 - W) * BCE(z, label) + W * BCE(z, sigmoid(t))``: the label, and the probability
the teacher (an exported verifier, served exactly as in production: its ONNX file,
tokenizer and input framing) gives the same pair. A pair the teacher finds
borderline then teaches a soft target instead of a hard 0 or 1 — the usual
knowledge distillation, in its binary form.

The teacher scores every training pair once, before the first step (one pair at a
time at its own length, as it serves), with a progress bar; the logits are kept in
the work directory, keyed by the teacher's file and the pairs, saved as they come, so
a stopped run resumes the scoring where it stopped and a resumed training run does not
score again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from sidecar.claims.verifier import OnnxVerifier
from sidecar.exceptions import ArtifactError
from sidecar.hashing import sha256_file
from sidecar.lab.verifier.checkpoints import pairs_sha256
from sidecar.lab.verifier.sources import Pair

__all__ = ["teacher_logits"]

log = logging.getLogger(__name__)

_BLOCK = 256  # pairs scored between two saves of the logits file


def teacher_logits(
    teacher_dir: Path, pairs: Sequence[Pair], *, cache_dir: Path | None, threads: int
) -> npt.NDArray[np.float64]:
    """The teacher's logit for each pair (its question read when the teacher reads one)."""
    teacher = OnnxVerifier.load(teacher_dir, threads=threads)
    key = hashlib.sha256(
        f"{sha256_file(teacher_dir / teacher.artifact.onnx_file)}:{pairs_sha256(pairs)}:"
        f"{_sha256_questions(pairs)}".encode()
    ).hexdigest()[:16]
    path = None if cache_dir is None else cache_dir / f"teacher-{teacher.version}-{key}.npy"
    out = np.full(len(pairs), np.nan)
    if path is not None and path.is_file():
        saved = np.load(path)
        if saved.shape == out.shape:
            out = saved
    todo = np.flatnonzero(np.isnan(out))
    if len(todo):
        log.info("teacher %s: scoring %d of %d pairs", teacher.version, len(todo), len(pairs))
    with tqdm(total=len(pairs), initial=len(pairs) - len(todo), unit="pair", mininterval=30.0,
              ascii=True, desc="teacher") as bar:  # fmt: skip
        for start in range(0, len(todo), _BLOCK):
            idx = todo[start : start + _BLOCK]
            block = [pairs[i] for i in idx]
            out[idx] = teacher.logits(
                [(p.claim, p.evidence) for p in block], [p.question for p in block]
            )
            bar.update(len(idx))
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(".partial.npy")
                np.save(partial, out)
                partial.replace(path)
    if not np.isfinite(out).all():
        raise ArtifactError(f"teacher {teacher.version} gave a non-finite logit on a training pair")
    return out


def _sha256_questions(pairs: Sequence[Pair]) -> str:
    """sha256 over the pairs' questions, in order (``pairs_sha256`` leaves them out, and
    the training pairs differ from the corpus in the questions dropped)."""
    h = hashlib.sha256()
    for p in pairs:
        h.update(p.question.encode("utf-8", "surrogatepass") + b"\x00")
    return h.hexdigest()
