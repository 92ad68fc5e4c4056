"""Serving the claim verifier: onnxruntime + the Rust ``tokenizers`` package, no torch.

The cross-encoder (MiniLM-L6 + a linear head, trained by
:mod:`sidecar.lab.verifier.training`) reads ``[CLS] claim [SEP] evidence [SEP]`` (or,
when the artifact says ``question_in_input``, ``[CLS] question [SEP] claim
[SEP] evidence [SEP]``, see :func:`first_segment`) and returns one logit for
"the evidence supports the claim" (the labels: docs/methods.md §Claim
verification). The artifact directory holds::

    verifier.json      metadata (sha256 of the ONNX file, calibration, band, metrics)
    model.int8.onnx    (or model.onnx) the exported network
    tokenizer.json     the WordPiece tokenizer, read by ``tokenizers``
    MODEL_CARD.md      data, split, metrics, how to reproduce

:class:`OnnxVerifier` checks the file against the metadata (``ArtifactError``
on a mismatch), runs the artifact's golden inputs and refuses to serve
(``ConfigError``) when their logits drift past the artifact's tolerance on
this CPU (:mod:`sidecar.golden`), and turns logits into calibrated probabilities
``sigmoid(a * logit + b * coverage + c)`` (:mod:`sidecar.claims.calibration`).
Runtime dependencies: ``onnxruntime`` and ``tokenizers``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from sidecar.claims.artifact import GOLDEN_INPUTS, GoldenPair, VerifierArtifact
from sidecar.claims.calibration import Band, Platt, coverage
from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.golden import GoldenOutputs, record_golden
from sidecar.hashing import sha256_file
from sidecar.onnxrt import onnxruntime

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from sidecar.claims.checker import VerifierClaimChecker
    from sidecar.claims.judge import JudgeConfig

__all__ = [
    "GOLDEN_LOGIT_TOLERANCE",
    "METADATA_FILE",
    "OnnxVerifier",
    "PairEncoder",
    "first_segment",
    "load_artifact",
    "load_claim_checker",
    "record_verifier_golden",
    "save_artifact",
]

log = logging.getLogger(__name__)

METADATA_FILE = "verifier.json"
# Max |logit - golden logit| a verifier may show at load (one pair at a time and as one batch).
# Chosen from measured drift across instruction sets, threads and batching with headroom: the
# numbers are in models/verifier/MODEL_CARD.md ("Same outputs on every x86 CPU").
GOLDEN_LOGIT_TOLERANCE = 1e-3
QUESTION_SEPARATOR = " [SEP] "


def first_segment(claim: str, question: str, *, question_in_input: bool) -> str:
    """The network's first segment: ``question [SEP] claim``, or the claim alone.

    The claim alone when the model was not trained with the question or the
    question is empty (training drops the question from some pairs, so the
    claim-only input is one the network has seen). ``[SEP]`` is a special
    token of the tokenizer, so the question and the claim are split by the
    same token that splits the claim from the evidence; both keep segment id 0.
    """
    q = " ".join(question.split())
    if not question_in_input or not q:
        return claim
    return f"{q}{QUESTION_SEPARATOR}{claim}"


def _import_tokenizers() -> Any:
    try:
        import tokenizers  # noqa: PLC0415 - optional runtime dependency, imported on use
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "the claim verifier needs the 'tokenizers' package: pip install 'tokenizers>=0.20'"
        ) from exc
    return tokenizers


class PairEncoder:
    """(claim, evidence) pairs to BERT inputs, exactly as in training."""

    def __init__(self, tokenizer: Tokenizer, max_length: int) -> None:
        self.max_length = max_length
        self._tok = tokenizer
        self._tok.no_padding()
        self._tok.enable_truncation(max_length=max_length, strategy="longest_first")
        self._tok.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106 - a token, not a secret

    @classmethod
    def from_file(cls, path: Path, max_length: int) -> PairEncoder:
        tokenizers = _import_tokenizers()
        if not path.is_file():
            raise ArtifactError(f"tokenizer file {path} is missing")
        return cls(tokenizers.Tokenizer.from_file(str(path)), max_length)

    def encode_each(
        self, pairs: Sequence[tuple[str, str]]
    ) -> Iterator[dict[str, npt.NDArray[np.int64]]]:
        """One ``(1, n)`` input per pair, ``n`` its own length: no padding at all."""
        for claim, evidence in pairs:
            e = self._tok.encode(claim, evidence or " ")
            yield {
                "input_ids": np.asarray([e.ids], dtype=np.int64),
                "attention_mask": np.asarray([e.attention_mask], dtype=np.int64),
                "token_type_ids": np.asarray([e.type_ids], dtype=np.int64),
            }

    def encode(self, pairs: Sequence[tuple[str, str]]) -> dict[str, npt.NDArray[np.int64]]:
        encodings = self._tok.encode_batch([(c, e or " ") for c, e in pairs])
        return {
            "input_ids": np.asarray([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.asarray([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.asarray([e.type_ids for e in encodings], dtype=np.int64),
        }


def load_artifact(model_dir: Path) -> VerifierArtifact:
    path = model_dir / METADATA_FILE
    if not path.is_file():
        raise ArtifactError(
            f"no verifier metadata at {path}; train one with: guardrail train verifier --out DIR"
        )
    try:
        return VerifierArtifact.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise ArtifactError(f"{path} is not a valid verifier artifact: {exc}") from None


def save_artifact(model_dir: Path, artifact: VerifierArtifact) -> Path:
    """Write ``model_dir/verifier.json`` (the ONNX file is written by the export)."""
    path = model_dir / METADATA_FILE
    path.write_text(artifact.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return path


class OnnxVerifier:
    """Calibrated p(supported) for (claim, evidence) pairs from the ONNX cross-encoder."""

    def __init__(
        self,
        artifact: VerifierArtifact,
        session: Any,
        encoder: PairEncoder,
        *,
        calibration: Platt | None = None,
        band: Band | None = None,
        target_precision: float | None = None,
    ) -> None:
        self.artifact = artifact
        self._session = session
        self._encoder = encoder
        self.calibration = calibration or artifact.platt
        self._band = band or artifact.band_for(target_precision)
        self._version = artifact.served_version(None if band else target_precision)
        self._inputs = {i.name for i in session.get_inputs()}
        missing = set(artifact.inputs) - self._inputs
        if missing:
            raise ArtifactError(f"the ONNX model lacks inputs {sorted(missing)}")

    @property
    def version(self) -> str:
        return self._version

    @property
    def band(self) -> Band:
        return self._band

    @property
    def question_in_input(self) -> bool:
        return self.artifact.question_in_input

    def inputs(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> list[tuple[str, str]]:
        """The (first segment, evidence) texts the network reads, as in training."""
        if questions is None or not self.question_in_input:
            return list(pairs)
        if len(questions) != len(pairs):
            raise ValueError(f"{len(questions)} questions for {len(pairs)} pairs")
        return [
            (first_segment(c, q, question_in_input=True), e)
            for (c, e), q in zip(pairs, questions, strict=True)
        ]

    @classmethod
    def load(
        cls,
        model_dir: Path,
        *,
        threads: int = 0,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        onnx_file: str | None = None,
        calibration: Platt | None = None,
        band: Band | None = None,
        target_precision: float | None = None,
        check_golden: bool = True,
    ) -> OnnxVerifier:
        """Load ``model_dir``; ``ConfigError`` when its golden logits drift on this CPU.

        ``onnx_file``, ``calibration`` and ``band`` override the metadata (training
        uses them to evaluate the fp32 and int8 twins with their own calibration;
        the golden outputs are those of the artifact's own file, so another file
        is not checked). ``check_golden=False``: do not run them (to record new ones).
        ``target_precision``: serve the artifact's band fitted for that precision
        (``ConfigError`` naming the ones it has when there is none).
        """
        ort = onnxruntime()

        artifact = load_artifact(model_dir)
        name = onnx_file or artifact.onnx_file
        path = model_dir / name
        if not path.is_file():
            raise ArtifactError(f"ONNX file {path} named by {METADATA_FILE} is missing")
        if onnx_file is None and sha256_file(path) != artifact.onnx_sha256:
            raise ArtifactError(
                f"{path} does not match the sha256 in {METADATA_FILE}: the files are out of step"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
        encoder = PairEncoder.from_file(model_dir / artifact.tokenizer_file, artifact.max_length)
        verifier = cls(
            artifact,
            session,
            encoder,
            calibration=calibration,
            band=band,
            target_precision=target_precision,
        )
        if check_golden and onnx_file in (None, artifact.onnx_file):
            verifier.check_golden(str(path))
        return verifier

    @classmethod
    def from_files(
        cls, artifact: VerifierArtifact, onnx_path: Path, tokenizer_path: Path
    ) -> OnnxVerifier:
        """One CPU thread over explicit files (the export's own check of what it wrote)."""
        ort = onnxruntime()

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(
            str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        return cls(artifact, session, PairEncoder.from_file(tokenizer_path, artifact.max_length))

    def golden_logits(self, cases: Sequence[GoldenPair]) -> list[float]:
        """Logits of ``cases`` one pair at a time, then of all of them in one call."""
        pairs = [(c.claim, c.evidence) for c in cases]
        questions = [c.question for c in cases]
        single = [float(self.logits([p], [q])[0]) for p, q in zip(pairs, questions, strict=True)]
        return single + [float(z) for z in self.logits(pairs, questions)]

    def check_golden(self, where: str) -> float | None:
        """The max drift of the artifact's golden logits; ``ConfigError`` past its tolerance."""
        golden = self.artifact.golden
        if golden is None:
            log.warning(
                "claim verifier %s (%s) has no golden outputs: its outputs on this CPU are not "
                "checked; add them with: guardrail golden record <model dir>",
                self.version,
                where,
            )
            return None
        drift = golden.check(
            self.golden_logits(golden.inputs), model=f"claim verifier {self.version} ({where})"
        )
        log.info("claim verifier %s: golden logits within %.2g of export", self.version, drift)
        return drift

    def logits(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> npt.NDArray[np.float64]:
        """Raw logits; ``questions`` (one per pair) are read when the artifact says so.

        The pairs run one at a time, each at its own length: on one CPU thread a
        batch buys nothing and pads every pair to the longest of its batch
        (held-out QA pairs: 21.4 ms per pair one at a time, 47.9 ms in batches
        of 32; the logits differ by < 2e-6).
        """
        texts = self.inputs(pairs, questions)
        out = np.zeros(len(texts), dtype=np.float64)
        for k, feed in enumerate(self._encoder.encode_each(texts)):
            (logit,) = self._session.run(
                ["logits"], {name: arr for name, arr in feed.items() if name in self._inputs}
            )
            out[k] = float(np.asarray(logit).reshape(-1)[0])
        return out

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> list[float]:
        """Calibrated p(supported) per pair (logit and lexical coverage, Platt scaling).

        ``questions``: the user question of each pair ("" when unknown); the
        network reads it only when the artifact's ``question_in_input`` is set.
        Coverage is always of the claim alone.
        """
        if not pairs:
            return []
        covered = self.coverages(pairs, questions)
        z = self.logits(pairs, questions)
        return [float(p) for p in self.calibration.probability(z, covered)]

    def coverages(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> list[float]:
        """Lexical coverage per pair; without the question's terms when the artifact says so."""
        if questions is None or not self.artifact.coverage_excludes_question:
            return [coverage(claim, evidence) for claim, evidence in pairs]
        return [
            coverage(claim, evidence, question)
            for (claim, evidence), question in zip(pairs, questions, strict=True)
        ]

    def window_probabilities(
        self,
        claims: Sequence[str],
        windows: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> list[float]:
        """p(supported) per claim scored against its evidence windows: the best window wins.

        ``windows[k]`` are claim k's windows (:meth:`EvidenceIndex.windows
        <sidecar.claims.evidence.EvidenceIndex.windows>`, at most
        ``artifact.evidence_max_windows``); all pairs go through the network in
        one call; the window with the highest logit gives the claim its
        logit and its coverage. A claim without windows gets 0.
        """
        z, covered, scored = self.window_features(claims, windows, questions)
        out = [0.0] * len(claims)
        if scored.any():
            probs = self.calibration.probability(z[scored], covered[scored])
            for k, p in zip(np.flatnonzero(scored).tolist(), probs, strict=True):
                out[k] = float(p)
        return out

    def window_features(
        self,
        claims: Sequence[str],
        windows: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """What calibration reads of each claim: the logit and the coverage of its best window
        (highest logit, as :meth:`window_probabilities` serves it), and whether it had a window
        at all (without one, both are 0 and the claim is served p = 0 whatever the calibration).
        """
        if len(windows) != len(claims):
            raise ValueError(f"{len(windows)} window lists for {len(claims)} claims")
        asked = list(questions) if questions is not None else [""] * len(claims)
        pairs = [(c, w) for c, ws in zip(claims, windows, strict=True) for w in ws]
        owners = [k for k, ws in enumerate(windows) for _ in ws]
        flat_q = [asked[k] for k in owners]
        z = self.logits(pairs, flat_q if questions is not None else None)
        best: dict[int, int] = {}
        for i, k in enumerate(owners):
            if k not in best or z[i] > z[best[k]]:
                best[k] = i
        logits = np.zeros(len(claims), dtype=np.float64)
        covered = np.zeros(len(claims), dtype=np.float64)
        scored = np.zeros(len(claims), dtype=np.bool_)
        if best:
            owned = sorted(best)
            chosen = [best[k] for k in owned]
            logits[owned] = z[chosen]
            covered[owned] = self.coverages(
                [pairs[i] for i in chosen],
                [flat_q[i] for i in chosen] if questions is not None else None,
            )
            scored[owned] = True
        return logits, covered, scored


def record_verifier_golden(
    verifier: OnnxVerifier,
    cases: Sequence[GoldenPair] = GOLDEN_INPUTS,
    tolerance: float = GOLDEN_LOGIT_TOLERANCE,
) -> GoldenOutputs[GoldenPair]:
    """Golden logits of ``cases`` computed by ``verifier`` now (one pair at a time)."""
    logits = verifier.golden_logits(cases)[: len(cases)]
    return record_golden(list(cases), logits, output="logit", tolerance=tolerance)


def load_claim_checker(
    model_dir: Path,
    *,
    judge: JudgeConfig | None = None,
    threads: int = 1,
    rules: bool = True,
    best_chunk: bool = False,
    target_precision: float | None = None,
    answer_pairs: int | None = None,
    answer_budget_s: float | None = None,
) -> VerifierClaimChecker:
    """The processor's ``ClaimChecker`` from a verifier directory (+ an optional LLM judge).

    ``answer_pairs`` / ``answer_budget_s``: the verifier work (pairs; None: the
    default) and the optional wall-clock time one answer may use
    (:class:`~sidecar.claims.checker.VerifierClaimSession`).

    ``best_chunk``: also score each claim against its best chunk (two verifier
    pairs per claim instead of one; see :class:`~sidecar.claims.scorer.ClaimScorer`).
    ``target_precision``: the band fitted for it (see :meth:`OnnxVerifier.load`).
    """
    from sidecar.claims.checker import (  # noqa: PLC0415
        DEFAULT_ANSWER_PAIRS,
        VerifierClaimChecker,
    )
    from sidecar.claims.judge import JudgeRunner  # noqa: PLC0415
    from sidecar.claims.scorer import ClaimScorer  # noqa: PLC0415

    verifier = OnnxVerifier.load(model_dir, threads=threads, target_precision=target_precision)
    scorer = ClaimScorer.served(verifier, rules=rules, best_chunk=best_chunk)
    runner = JudgeRunner(judge) if judge is not None else None
    return VerifierClaimChecker(
        scorer,
        judge=runner,
        answer_pairs=DEFAULT_ANSWER_PAIRS if answer_pairs is None else answer_pairs,
        answer_budget_s=answer_budget_s,
    )
