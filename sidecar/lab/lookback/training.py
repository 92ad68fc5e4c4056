"""Training the lookback-ratio factuality classifier and exporting it to ONNX.

The method: docs/methods.md §Lookback-ratio factuality.

"A small classifier is trained to predict hallucinations from those lookback
ratios ... the classifier architecture consists of a single logistic regression
unit": scikit-learn ``LogisticRegression(max_iter=1000, class_weight="balanced")``
on the padded, per-sample scaled vectors of :mod:`sidecar.lookback.features`,
evaluated by train and test AUROC on a 3:2 split *by question* (no question on
both sides). The fitted model is exported with skl2onnx (probabilities as a
plain ``(n, 2)`` tensor, ZipMap disabled) and checked against scikit-learn on
the held-out rows (max abs difference <= 1e-5) before anything is written; the
metadata then gets the golden outputs the serving scorer recomputes at load
(:func:`~sidecar.lookback.serving.record_lookback_golden`).

This module is the only one of :mod:`sidecar.lookback` that imports scikit-learn
(the ``train`` extra); the serving path reads the ONNX file with onnxruntime.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Self

import numpy as np
import numpy.typing as npt

from sidecar.exceptions import ArtifactError, ConfigError, LifecycleError
from sidecar.lab.lookback.dataset import LookbackDataset, load_dataset
from sidecar.lookback.artifact import (
    ONNX_FILE,
    LookbackMetrics,
    LookbackModelMetadata,
    LookbackTraining,
    save_metadata,
)
from sidecar.lookback.features import feature_matrix
from sidecar.onnxrt import onnxruntime
from sidecar.stats.metrics import auroc

try:
    import sklearn
    from sklearn.linear_model import LogisticRegression
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "training the lookback classifier needs scikit-learn and skl2onnx: "
        "pip install 'rag-guardrail-sidecar[train]'"
    ) from exc

__all__ = [
    "ESTIMATOR",
    "ONNX_INPUT",
    "ONNX_OPSET",
    "ONNX_OUTPUT",
    "PARITY_TOLERANCE",
    "LookbackClassifier",
    "onnx_probabilities",
    "split_by_question",
    "train_and_export",
]

log = logging.getLogger(__name__)

ESTIMATOR = "LogisticRegression(max_iter=1000, class_weight='balanced')"
ONNX_INPUT = "features"
ONNX_OUTPUT = "probabilities"
ONNX_OPSET = 17
PARITY_TOLERANCE = 1e-5


def split_by_question(
    qids: npt.ArrayLike, train_fraction: float = 0.6, seed: int = 0
) -> npt.NDArray[np.bool_]:
    """Train mask: questions ranked by ``sha256("<seed>:<qid>")``, first ``round(n * f)`` train.

    Every row of a question lands on the same side; the split depends only on
    the question ids, the seed and the fraction.
    """
    if not 0.0 < train_fraction < 1.0:
        raise ConfigError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
    ids = np.asarray(qids, dtype=np.int64).ravel()
    unique = sorted({int(q) for q in ids})
    ranked = sorted(unique, key=lambda q: hashlib.sha256(f"{seed}:{q}".encode()).hexdigest())
    n_train = round(len(unique) * train_fraction)
    train = set(ranked[:n_train])
    return np.array([int(q) in train for q in ids], dtype=bool)


class LookbackClassifier:
    """Logistic regression on lookback features: ``fit`` then ``predict_proba`` / ``to_onnx``."""

    def __init__(self, *, chunks: int, seed: int = 0, max_iter: int = 1000) -> None:
        if chunks < 1:
            raise ConfigError(f"chunks must be >= 1, got {chunks}")
        self.chunks = chunks
        self.seed = seed
        self._model: Any = LogisticRegression(
            max_iter=max_iter, class_weight="balanced", random_state=seed
        )
        self._n_features: int | None = None

    def _require_fit(self, method: str) -> int:
        if self._n_features is None:
            raise LifecycleError(f"LookbackClassifier.{method} called before fit")
        return self._n_features

    def features(self, ratios: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """``(n, L, H, K_s)`` ratios -> padded, scaled ``(n, L * H * K)`` features."""
        return feature_matrix(ratios, self.chunks)

    def fit(self, ratios: npt.ArrayLike, labels: npt.ArrayLike) -> Self:
        """Fit on ``(n, L, H, K_s)`` ratios and 0/1 labels (1 = correct answer)."""
        x = self.features(ratios)
        y = np.asarray(labels).astype(np.int64).ravel()
        if x.shape[0] != y.shape[0]:
            raise ConfigError(f"{x.shape[0]} rows for {y.shape[0]} labels")
        if set(np.unique(y).tolist()) != {0, 1}:
            raise ConfigError("training needs both correct (1) and incorrect (0) answers")
        self._model.fit(x, y)
        self._n_features = int(x.shape[1])
        return self

    def predict_proba(self, ratios: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """p(factual) for each row of ``(n, L, H, K_s)`` ratios."""
        n_features = self._require_fit("predict_proba")
        x = self.features(ratios)
        if x.shape[1] != n_features:
            raise ConfigError(f"{x.shape[1]} features, the model was fitted on {n_features}")
        return np.asarray(self._model.predict_proba(x)[:, 1], dtype=np.float64)

    def to_onnx(self) -> bytes:
        """ONNX bytes: input ``features`` float32 ``(n, D)``, output ``probabilities`` (n, 2)."""
        n_features = self._require_fit("to_onnx")
        from skl2onnx import convert_sklearn  # noqa: PLC0415
        from skl2onnx.common.data_types import FloatTensorType  # noqa: PLC0415

        onx = convert_sklearn(
            self._model,
            initial_types=[(ONNX_INPUT, FloatTensorType([None, n_features]))],
            options={id(self._model): {"zipmap": False}},
            target_opset={"": ONNX_OPSET, "ai.onnx.ml": 3},
            final_types=None,
            # skl2onnx names the graph with a random uuid: two exports of the same model
            # differed, and so did the served version (its hash), which the confidence
            # model and the certificates are bound to (audit)
            name="lookback",
        )
        names = [o.name for o in onx.graph.output]
        if ONNX_OUTPUT not in names:
            raise ArtifactError(f"the ONNX export has outputs {names}, expected {ONNX_OUTPUT!r}")
        onx.doc_string = (
            "lookback-ratio factuality classifier (docs/methods.md §Lookback-ratio factuality)"
        )
        return bytes(onx.SerializeToString())


def onnx_probabilities(
    onnx_bytes: bytes, features: npt.NDArray[np.float32]
) -> npt.NDArray[np.float64]:
    """p(factual) of ``features`` computed by onnxruntime (CPU) from ``onnx_bytes``."""
    ort = onnxruntime()

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(onnx_bytes, opts, providers=["CPUExecutionProvider"])
    (probs,) = session.run([ONNX_OUTPUT], {ONNX_INPUT: np.ascontiguousarray(features)})
    return np.asarray(probs, dtype=np.float64)[:, 1]


def _safe_auroc(scores: npt.ArrayLike, labels: npt.ArrayLike) -> float | None:
    try:
        return auroc(scores, labels)
    except ConfigError:
        return None


def train_and_export(
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    variant: Literal["cw", "fc"],
    name: str,
    train_fraction: float = 0.6,
    seed: int = 0,
    dataset: LookbackDataset | None = None,
) -> LookbackModelMetadata:
    """Train on ``data_dir``, check ONNX parity, write ``model.onnx`` + ``metadata.json``."""
    data = dataset if dataset is not None else load_dataset(data_dir)
    ratios = data.ratios(variant).astype(np.float32)
    labels = data.rows.label.astype(np.int64)
    train = split_by_question(data.rows.qid, train_fraction, seed)
    test = ~train
    if len(set(labels[train].tolist())) < 2 or len(set(labels[test].tolist())) < 2:
        raise ConfigError(
            f"both splits need both classes ({int(labels.sum())} correct of {len(labels)}); "
            "build a larger dataset"
        )
    chunks = int(ratios.shape[3])
    clf = LookbackClassifier(chunks=chunks, seed=seed).fit(ratios[train], labels[train])
    p_train = clf.predict_proba(ratios[train])
    p_test = clf.predict_proba(ratios[test])
    onnx_bytes = clf.to_onnx()
    p_onnx = onnx_probabilities(onnx_bytes, clf.features(ratios[test]))
    gap = float(np.max(np.abs(p_onnx - p_test))) if p_test.size else 0.0
    if gap > PARITY_TOLERANCE:
        raise ArtifactError(
            f"ONNX and scikit-learn disagree by {gap:.2e} on held-out rows "
            f"(tolerance {PARITY_TOLERANCE:.0e})"
        )
    metrics = LookbackMetrics(
        n=len(labels),
        n_train=int(train.sum()),
        n_test=int(test.sum()),
        positive_rate=float(labels.mean()),
        train_positive_rate=float(labels[train].mean()),
        test_positive_rate=float(labels[test].mean()),
        train_auroc=auroc(p_train, labels[train]),
        test_auroc=auroc(p_test, labels[test]),
        test_auroc_mean_logprob=_safe_auroc(data.rows.logprob[test], labels[test]),
        test_auroc_answer_tokens=_safe_auroc(-data.rows.steps[test], labels[test]),
    )
    meta = data.meta
    train_qids = ",".join(str(int(q)) for q in np.sort(data.rows.qid[train]))
    metadata = LookbackModelMetadata(
        name=name,
        generator_model=meta.generator_model,
        layers=meta.layers,
        heads=meta.heads,
        chunks=chunks,
        variant=variant,
        prompt_template=meta.prompt_template,
        step_convention=meta.step_convention,
        onnx_sha256=hashlib.sha256(onnx_bytes).hexdigest(),
        onnx_input=ONNX_INPUT,
        onnx_output=ONNX_OUTPUT,
        onnx_opset=ONNX_OPSET,
        training=LookbackTraining(
            estimator=ESTIMATOR,
            sklearn_version=str(sklearn.__version__),
            data_dir=str(data_dir),
            data_sha256=data.sha256(),
            questions_sha256=meta.questions_sha256,
            question_part=meta.part,
            question_split_seed=meta.split_seed,
            question_eval_fraction=meta.eval_fraction,
            corpus_fingerprint=meta.corpus_fingerprint,
            embedder=meta.embedder,
            chunk_words=meta.chunk_words,
            max_new_tokens=meta.max_new_tokens,
            split="by question: sha256('<seed>:<qid>') rank, first round(n * train_fraction)",
            train_fraction=train_fraction,
            seed=seed,
            train_qids_sha256=hashlib.sha256(train_qids.encode()).hexdigest(),
        ),
        metrics=metrics,
        created_at=datetime.now(UTC).replace(microsecond=0),
    )
    from sidecar.lookback.serving import (  # noqa: PLC0415 - onnxruntime, as above
        OnnxLookbackScorer,
        record_lookback_golden,
    )

    scorer = OnnxLookbackScorer(metadata, onnx_bytes, check_golden=False)
    metadata = metadata.model_copy(update={"golden": record_lookback_golden(scorer)})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / ONNX_FILE).write_bytes(onnx_bytes)
    save_metadata(out, metadata)
    log.info(
        "lookback %s: train AUROC %.3f, test AUROC %.3f (n=%d, parity %.1e)",
        variant,
        metrics.train_auroc,
        metrics.test_auroc,
        metrics.n,
        gap,
    )
    return metadata
