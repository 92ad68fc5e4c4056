"""Serving the lookback classifier: ``OnnxLookbackScorer`` implements ``LookbackScorer``.

Per ``GenerationFinal`` event (docs/methods.md §Lookback-ratio factuality):

1. **check** -- the event's ``generator_model`` must equal the model's, and its
   ``AttentionSummary`` must have the model's layers, heads and variant, and at
   most K chunk columns (``fc``: exactly 1). A mismatch raises
   ``InputError("generator-mismatch" | "attention-shape", ...)`` -- the event is
   dead-lettered -- or, with ``on_mismatch="unavailable"``, ``score`` reports
   status ``unavailable`` instead. An event without a summary is never an
   error: it scores ``unavailable``.
2. **select** the trusted chunks (``cw`` only). Column ``i`` of the summary is the
   ``i``-th chunk of the generator's prompt, which is the ``i``-th hit of the
   retrieval event (retrieval order, best first). When the certification's
   status is ``ok``:

   * with ``chunk_ids`` (the ids of the summary's columns, i.e. the retrieval
     event's hit ids in order), the columns whose id is in
     ``certification.trusted_chunk_ids`` are kept, in retrieval order;
   * without them, the first ``len(trusted_chunk_ids)`` columns are kept. This
     is exact for the project's certifier: it trusts every hit whose
     normalised score clears one threshold, and hits are best-first, so the
     trusted set is always a prefix of the retrieval order.

   No trusted chunk keeps no column (the all-zero vector is scored). Without an
   ``ok`` certification (not configured, unavailable) every column is kept.
3. **pad** with zero columns to K, **flatten** in C order and **scale** per
   sample to [0, 1] (:mod:`sidecar.lookback.features`), exactly as the trainer.
4. **score** with onnxruntime -> ``LookbackSignal(p_factual, model_version)``.

``score_many`` does steps 1-2 per request, then pads and scales the batch's rows
in one matrix and makes one ONNX call for them (the processor scores every
request completed in a consumed batch through it).

At load the scorer recomputes the metadata's golden outputs (fixed feature
vectors, one at a time and as one batch) with its own session and refuses to
serve (``ConfigError`` naming this CPU's features and the drift) when they
moved past the metadata's tolerance (:mod:`sidecar.golden`).

onnxruntime uses ``CPUExecutionProvider`` unless ``providers`` says otherwise;
``providers="auto"`` adds ``CUDAExecutionProvider`` when the installed
onnxruntime has it. Never imports torch or scikit-learn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from sidecar.contracts.assembled import assembled, unit_float
from sidecar.contracts.events import (
    AttentionSummary,
    GenerationFinal,
    LookbackSignal,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.exceptions import ArtifactError, ConfigError, InputError
from sidecar.golden import GoldenOutputs, record_golden
from sidecar.lookback.artifact import (
    GOLDEN_TOLERANCE,
    LookbackModelMetadata,
    golden_features,
    load_metadata,
)
from sidecar.lookback.features import feature_rows, summary_rows
from sidecar.onnxrt import onnxruntime

__all__ = ["LookbackRequest", "OnnxLookbackScorer", "record_lookback_golden", "resolve_providers"]

log = logging.getLogger(__name__)

MISMATCH_LOG_INTERVAL_S = 60.0

OnMismatch = Literal["dead-letter", "unavailable"]


def resolve_providers(providers: Sequence[str] | Literal["auto"] | None) -> list[str]:
    """Execution providers for onnxruntime: ``None`` -> CPU; ``"auto"`` -> CUDA if present."""
    ort = onnxruntime()

    available = set(ort.get_available_providers())
    if providers is None:
        return ["CPUExecutionProvider"]
    if providers == "auto":
        chosen = ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" in available:
            chosen.insert(0, "CUDAExecutionProvider")
        return chosen
    wanted = list(providers)
    missing = [p for p in wanted if p not in available]
    if missing or not wanted:
        raise ConfigError(
            f"onnxruntime providers {missing or wanted} are not available; "
            f"installed: {sorted(available)}"
        )
    return wanted


@dataclass(frozen=True, slots=True)
class LookbackRequest:
    """One request for :meth:`OnnxLookbackScorer.score_many`."""

    final: GenerationFinal
    certification: RetrievalSignal
    chunk_ids: tuple[str, ...] | None = None
    # the retrieval's chunk ids in hit order: column i of the summary is hit i (the
    # prompt's order); the summary may have fewer columns than hits
    hit_ids: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class _Prepared:
    ratios: npt.NDArray[np.float16] | None  # the summary (L, H, K_s); None: ``signal`` says why
    keep: list[int] | None  # the trusted columns (None: all)
    signal: LookbackSignal | None


class OnnxLookbackScorer:
    """The lookback classifier of one model directory, behind ``LookbackScorer``."""

    def __init__(
        self,
        metadata: LookbackModelMetadata,
        onnx_bytes: bytes,
        *,
        providers: Sequence[str] | Literal["auto"] | None = None,
        on_mismatch: OnMismatch = "dead-letter",
        intra_op_threads: int = 1,
        check_golden: bool = True,
    ) -> None:
        """``ConfigError`` when the metadata's golden outputs drift on this CPU.

        ``check_golden=False`` skips them (the export computing new ones).
        """
        ort = onnxruntime()

        if on_mismatch not in ("dead-letter", "unavailable"):
            raise ConfigError(
                f"on_mismatch must be 'dead-letter' or 'unavailable', got {on_mismatch!r}"
            )
        if intra_op_threads < 0:
            raise ConfigError(f"intra_op_threads must be >= 0, got {intra_op_threads}")
        if metadata.variant == "fc" and metadata.chunks != 1:
            raise ArtifactError(f"an fc model must have chunks=1, metadata says {metadata.chunks}")
        self.metadata = metadata
        self._version = metadata.version  # read per scored answer
        self.on_mismatch: OnMismatch = on_mismatch
        self.mismatches = 0  # summaries scored unavailable for a mismatch
        self._mismatches_logged = 0
        self._mismatch_logged_at = -MISMATCH_LOG_INTERVAL_S
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        try:
            self._session: Any = ort.InferenceSession(
                onnx_bytes, opts, providers=resolve_providers(providers)
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ArtifactError(f"onnxruntime cannot load the lookback model: {exc}") from exc
        inputs = {i.name: i for i in self._session.get_inputs()}
        outputs = {o.name for o in self._session.get_outputs()}
        if metadata.onnx_input not in inputs or metadata.onnx_output not in outputs:
            raise ArtifactError(
                f"the ONNX graph has inputs {sorted(inputs)} and outputs {sorted(outputs)}; "
                f"metadata names {metadata.onnx_input!r} -> {metadata.onnx_output!r}"
            )
        width = inputs[metadata.onnx_input].shape[-1]
        if isinstance(width, int) and width != metadata.n_features:
            raise ArtifactError(
                f"the ONNX model takes {width} features, metadata says "
                f"{metadata.layers}x{metadata.heads}x{metadata.chunks} = {metadata.n_features}"
            )
        if check_golden:
            self.check_golden()

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        *,
        providers: Sequence[str] | Literal["auto"] | None = None,
        on_mismatch: OnMismatch = "dead-letter",
        intra_op_threads: int = 1,
        check_golden: bool = True,
    ) -> OnnxLookbackScorer:
        """Load ``model_dir/metadata.json`` and its hash-checked ``model.onnx``.

        ``ConfigError`` when its golden outputs drift on this CPU (see ``__init__``).
        """
        metadata, onnx_bytes = load_metadata(model_dir)
        return cls(
            metadata,
            onnx_bytes,
            providers=providers,
            on_mismatch=on_mismatch,
            intra_op_threads=intra_op_threads,
            check_golden=check_golden,
        )

    def golden_outputs(self, cases: Sequence[Sequence[float]]) -> list[float]:
        """p(factual) of ``cases`` one vector at a time, then of all of them as one batch."""
        rows = np.asarray(cases, dtype=np.float32).reshape(len(cases), -1)
        single = [float(self._run(row[None, :])[0]) for row in rows]
        return single + [float(p) for p in self._run(rows)]

    def check_golden(self) -> float | None:
        """The max drift of the golden outputs; ``ConfigError`` past the metadata's tolerance."""
        golden = self.metadata.golden
        if golden is None:
            log.warning(
                "lookback model %s has no golden outputs: its outputs on this CPU are not "
                "checked; add them with: guardrail golden record <model dir>",
                self.version,
            )
            return None
        drift = golden.check(
            self.golden_outputs(golden.inputs), model=f"lookback model {self.version}"
        )
        log.info("lookback model %s: golden outputs within %.2g of export", self.version, drift)
        return drift

    @property
    def version(self) -> str:
        """``name@<onnx sha256 prefix>``."""
        return self.metadata.version

    @property
    def providers(self) -> list[str]:
        """The execution providers onnxruntime actually uses."""
        return list(self._session.get_providers())

    # ------------------------------------------------------------------ checks

    def mismatch(self, final: GenerationFinal) -> InputError | None:
        """Why this model cannot score ``final`` (``None``: it can, or there is no summary)."""
        meta = self.metadata
        if final.attention is None:
            return None
        if final.generator_model != meta.generator_model:
            return InputError(
                "generator-mismatch",
                f"attention summary from generator {final.generator_model!r}; the lookback "
                f"model {self.version} was trained on {meta.generator_model!r}",
            )
        att = final.attention
        if att.variant != meta.variant:
            return InputError(
                "attention-shape",
                f"attention summary variant {att.variant!r}; the lookback model {self.version} "
                f"scores {meta.variant!r}",
            )
        if att.layers != meta.layers or att.heads != meta.heads:
            return InputError(
                "attention-shape",
                f"attention summary of {att.layers} layers x {att.heads} heads; the lookback "
                f"model {self.version} needs {meta.layers} x {meta.heads}",
            )
        if att.chunks > meta.chunks or (meta.variant == "fc" and att.chunks != 1):
            allowed = "exactly 1" if meta.variant == "fc" else f"at most {meta.chunks}"
            return InputError(
                "attention-shape",
                f"attention summary has {att.chunks} chunk columns; the lookback model "
                f"{self.version} ({meta.variant}) takes {allowed}",
            )
        return None

    def _note_mismatch(self, error: InputError) -> None:
        """Count a summary scored ``unavailable`` for a mismatch; say why, once a minute (a
        rollout of another model or generator makes every answer one)."""
        self.mismatches += 1
        now = time.monotonic()
        if now - self._mismatch_logged_at >= MISMATCH_LOG_INTERVAL_S:
            log.warning(
                "lookback signal unavailable for %d answer(s) since the last warning: %s: %s "
                "(GUARDRAIL_SIGNALS__LOOKBACK_MISMATCH=unavailable; guardrail.lookback.mismatches)",
                self.mismatches - self._mismatches_logged, error.reason, error,
            )  # fmt: skip
            self._mismatch_logged_at, self._mismatches_logged = now, self.mismatches

    def check(self, final: GenerationFinal) -> None:
        """Raise ``InputError`` for a summary this model cannot score, in dead-letter mode."""
        error = self.mismatch(final)
        if error is not None and self.on_mismatch == "dead-letter":
            raise error

    # ------------------------------------------------------------------ scoring

    def _unavailable(self) -> LookbackSignal:
        return LookbackSignal(status=SignalStatus.UNAVAILABLE, model_version=self.version)

    def _kept_columns(
        self,
        n_columns: int,
        certification: RetrievalSignal,
        chunk_ids: Sequence[str] | None,
        hit_ids: Sequence[str] | None = None,
    ) -> list[int] | None:
        """Positions of the trusted columns; ``None`` keeps all; raises ``ValueError``.

        Without ``chunk_ids`` or ``hit_ids`` the trusted chunks are taken to be the first
        hits (true when the hits are sorted by score, as Qdrant returns them).
        """
        if self.metadata.variant == "fc" or certification.status != SignalStatus.OK:
            return None
        trusted = certification.trusted_chunk_ids
        if hit_ids is not None:  # a reranked list: the trusted hits need not be a prefix
            wanted = set(trusted)
            keep = [i for i, cid in enumerate(hit_ids) if cid in wanted]
            if keep and keep[-1] >= n_columns:
                raise ValueError(
                    f"trusted hit {keep[-1]} has no column in a summary of {n_columns}"
                )
            return keep
        if chunk_ids is not None:
            if len(chunk_ids) != n_columns:
                raise ValueError(f"{len(chunk_ids)} chunk ids for {n_columns} summary columns")
            wanted = set(trusted)
            return [i for i, cid in enumerate(chunk_ids) if cid in wanted]
        if len(trusted) > n_columns:
            raise ValueError(
                f"{len(trusted)} trusted chunks but the summary has {n_columns} columns"
            )
        return list(range(len(trusted)))

    def _prepare(
        self,
        final: GenerationFinal,
        certification: RetrievalSignal,
        chunk_ids: Sequence[str] | None,
        hit_ids: Sequence[str] | None = None,
    ) -> _Prepared:
        found = self._scorable(final, certification, chunk_ids, hit_ids)
        if found is None:
            return _Prepared(None, None, self._unavailable())
        summary, keep = found
        return _Prepared(summary.to_float16(), keep, None)  # float32 exactly, in feature_rows

    def _scorable(
        self,
        final: GenerationFinal,
        certification: RetrievalSignal,
        chunk_ids: Sequence[str] | None,
        hit_ids: Sequence[str] | None,
    ) -> tuple[AttentionSummary, list[int] | None] | None:
        """``final``'s summary and the columns to keep, or ``None`` when it cannot be scored
        (no summary, a mismatch noted, no columns to keep); a mismatch in dead-letter mode
        raises its ``InputError``."""
        summary = final.attention
        if summary is None:
            return None
        error = self.mismatch(final)
        if error is not None:
            if self.on_mismatch == "dead-letter":
                raise error
            self._note_mismatch(error)
            return None
        try:
            return summary, self._kept_columns(summary.chunks, certification, chunk_ids, hit_ids)
        except ValueError:
            return None

    def _run(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        """p(factual) per row: one ONNX call, a lone row run twice over.

        onnxruntime takes another kernel for a one-row matrix than for taller ones, whose
        rows agree with each other wherever they sit: a row scored alone came out up to
        6e-8 away from the same row in a batch, so an answer's score hung on how its
        consumed batch was cut (``tests/lookback/test_batch_cuts.py``).
        """
        rows = np.ascontiguousarray(features, dtype=np.float32)
        lone = rows.shape[0] == 1
        if lone:
            rows = np.concatenate((rows, rows))
        (probs,) = self._session.run([self.metadata.onnx_output], {self.metadata.onnx_input: rows})
        p = np.clip(np.asarray(probs, dtype=np.float64)[:, 1], 0.0, 1.0)
        return p[:1] if lone else p

    def score(
        self,
        final: GenerationFinal,
        certification: RetrievalSignal,
        *,
        chunk_ids: Sequence[str] | None = None,
        hit_ids: Sequence[str] | None = None,
    ) -> LookbackSignal:
        """p(factual) of one answer; ``chunk_ids`` = the summary's column ids, if known;
        ``hit_ids`` = the retrieval's chunk ids in hit order (column i is hit i)."""
        ids = None if chunk_ids is None else tuple(chunk_ids)
        hits = None if hit_ids is None else tuple(hit_ids)
        return self.score_many([LookbackRequest(final, certification, ids, hits)])[0]

    def score_many(self, requests: Sequence[LookbackRequest]) -> list[LookbackSignal]:
        """Score a batch with one scaling pass and one ONNX call; results in request order.

        A request that cannot be scored gets ``unavailable`` (or, in dead-letter
        mode, raises its ``InputError`` -- call :meth:`check` on each event first).
        """
        return self._score_all(
            [(r.final, r.certification, r.chunk_ids, r.hit_ids) for r in requests]
        )

    def _score_all(
        self,
        items: Sequence[
            tuple[GenerationFinal, RetrievalSignal, Sequence[str] | None, Sequence[str] | None]
        ],
    ) -> list[LookbackSignal]:
        """:meth:`score_many` of ``(final, certification, chunk_ids, hit_ids)`` tuples.

        Each request is checked and its columns chosen in one loop; the scorable
        summaries' bytes become the batch's feature matrix in a few numpy passes
        (:func:`summary_rows`), scored by one ONNX call.
        """
        out: list[LookbackSignal] = []
        unavailable = self._unavailable()  # frozen: one for every request not scored
        scorable: list[int] = []  # positions in ``out`` scored below
        summaries: list[bytes] = []
        widths: list[int] = []
        keeps: list[list[int] | None] = []
        for final, certification, chunk_ids, hit_ids in items:
            found = self._scorable(final, certification, chunk_ids, hit_ids)
            if found is None:
                out.append(unavailable)
                continue
            summary, keep = found
            scorable.append(len(out))
            out.append(unavailable)  # replaced by its score
            summaries.append(summary.decoded())
            widths.append(summary.chunks)
            keeps.append(keep)
        if scorable:
            meta = self.metadata
            rows = summary_rows(
                summaries, widths, keeps, layers=meta.layers, heads=meta.heads, k=meta.chunks
            )
            version = self._version
            for slot, p in zip(scorable, self._run(rows).tolist(), strict=True):
                out[slot] = lookback_ok(p, version)
        return out

    def score_batch(
        self,
        items: Sequence[tuple[GenerationFinal, RetrievalSignal]],
        *,
        hit_ids: Sequence[Sequence[str]] | None = None,
    ) -> list[LookbackSignal]:
        """The processor's micro-batch entry point (``LookbackScorer.score_batch``)."""
        if hit_ids is None:
            return self._score_all([(final, cert, None, None) for final, cert in items])
        return self._score_all(
            [(final, cert, None, ids) for (final, cert), ids in zip(items, hit_ids, strict=True)]
        )

    def features(
        self,
        final: GenerationFinal,
        certification: RetrievalSignal,
        *,
        chunk_ids: Sequence[str] | None = None,
        hit_ids: Sequence[str] | None = None,
    ) -> npt.NDArray[np.float32] | None:
        """The scaled feature vector this scorer would feed to ONNX (``None``: unscorable)."""
        prepared = self._prepare(final, certification, chunk_ids, hit_ids)
        if prepared.ratios is None:
            return None
        vector: npt.NDArray[np.float32] = feature_rows(
            [prepared.ratios], self.metadata.chunks, [prepared.keep]
        )[0]
        return vector


def lookback_ok(p_factual: float, model_version: str) -> LookbackSignal:
    """``LookbackSignal(status=ok, ...)``, built without validation when ``p_factual`` is a
    float in [0, 1] (a batch's probabilities are: ``_run`` clips them); anything else (a
    NaN from a broken model) is validated, which raises as before."""
    if unit_float(p_factual) and type(model_version) is str:
        return assembled(
            LookbackSignal,
            {"status": SignalStatus.OK, "p_factual": p_factual, "model_version": model_version},
        )
    return LookbackSignal(status=SignalStatus.OK, p_factual=p_factual, model_version=model_version)


def record_lookback_golden(
    scorer: OnnxLookbackScorer, tolerance: float = GOLDEN_TOLERANCE
) -> GoldenOutputs[list[float]]:
    """Golden p(factual) of :func:`~sidecar.lookback.artifact.golden_features` computed now."""
    meta = scorer.metadata
    cases = golden_features(meta.layers, meta.heads, meta.chunks)
    outputs = scorer.golden_outputs(cases)[: len(cases)]
    return record_golden(cases, outputs, output="p_factual", tolerance=tolerance)
