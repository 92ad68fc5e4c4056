"""Fit the calibrated-confidence forecaster (:class:`~sidecar.confidence.model.ConfidenceModel`).

``fit -> calibrate``, on disjoint parts of the labelled rows::

    split   stratified by label, seeded: a fraction ``fit_fraction`` of each class -> fit part
    impute  m_j = mean of feature j over the fit part's non-missing values (0 if none)
    scale   mean_j, scale_j = mean and std of the imputed fit part (scale 1 when std = 0)
    fit     argmin_{w,b} sum_i [log(1 + e^{s_i}) - y_i s_i] + l2/2 |w|^2,  s_i = w . z_i + b
            (Newton/IRLS; the intercept is not penalised; no class weights: we want
            probabilities of the real base rate)
    calibrate  choose_calibrator(s, y) on the calibration part (K-fold CV NLL, Platt
            vs isotonic), refit the chosen one on the whole calibration part

The metrics in the metadata are measured on the calibration part, which the
logistic model never saw, with out-of-fold calibrated probabilities (each row is
scored by a calibrator fit without its fold); the ``raw_*`` metrics are those of
``sigmoid(s)`` before calibration. The choice of method used the same folds, so the
calibrated figures are slightly optimistic. numpy only; no scikit-learn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sidecar.confidence.calibration import choose_calibrator, cross_validated_probabilities
from sidecar.confidence.errors import ConfidenceDataError
from sidecar.confidence.logistic import FloatArray, fit_logistic, sigmoid
from sidecar.confidence.model import (
    ANSWER_SPEC,
    ConfidenceModel,
    ConfidenceTraining,
    FeatureSpec,
    FeatureValues,
)
from sidecar.exceptions import ConfigError
from sidecar.stats.metrics import as_labels, auroc, brier, ece, nll

__all__ = [
    "fit_confidence_model",
    "group_split",
    "imputation_means",
    "standardisation",
    "stratified_split",
]

IntArray = npt.NDArray[np.int64]


def stratified_split(
    labels: FloatArray, fit_fraction: float, seed: int
) -> tuple[IntArray, IntArray]:
    """Sorted ``(fit, calibration)`` indices: ``round(fit_fraction * n_c)`` of each class ``c`` fit.

    Each class is permuted by ``numpy.random.default_rng(seed)`` (negatives first).
    """
    if not 0.0 < fit_fraction < 1.0:
        raise ConfigError(f"fit_fraction must be in (0, 1), got {fit_fraction!r}")
    rng = np.random.default_rng(seed)
    fit_parts: list[IntArray] = []
    cal_parts: list[IntArray] = []
    for cls in (0.0, 1.0):
        members = rng.permutation(np.flatnonzero(labels == cls))
        cut = round(fit_fraction * members.size)
        fit_parts.append(members[:cut])
        cal_parts.append(members[cut:])
    return np.sort(np.concatenate(fit_parts)), np.sort(np.concatenate(cal_parts))


def group_split(
    labels: FloatArray, groups: npt.ArrayLike, fit_fraction: float, seed: int
) -> tuple[IntArray, IntArray]:
    """Like :func:`stratified_split`, but whole groups go to one side.

    Rows that share a group (the copies of one question, the chunks of one
    request) never straddle the fit and calibration parts; a group is stratified
    by its highest label.
    """
    g = np.asarray(groups)
    if g.shape != labels.shape:
        raise ConfigError(f"groups has shape {g.shape}, labels {labels.shape}")
    unique, inverse = np.unique(g, return_inverse=True)
    group_label = np.zeros(unique.size, dtype=np.float64)
    np.maximum.at(group_label, inverse, labels)
    fit_groups, _ = stratified_split(group_label, fit_fraction, seed)
    in_fit = np.isin(inverse, fit_groups)
    return np.flatnonzero(in_fit), np.flatnonzero(~in_fit)


def imputation_means(raw: FloatArray) -> FloatArray:
    """Per column, the mean of the non-NaN values (0.0 for a column with none)."""
    present = ~np.isnan(raw)
    counts = present.sum(axis=0)
    sums = np.where(present, raw, 0.0).sum(axis=0)
    means: FloatArray = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    return means


def standardisation(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Column mean and standard deviation (ddof 0); a constant column gets scale 1."""
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    scale: FloatArray = np.where(std > 1e-12, std, 1.0)
    return mean, scale


def _check_part(name: str, y: FloatArray, minimum: int) -> None:
    positives = int(y.sum())
    if positives < minimum or y.size - positives < minimum:
        raise ConfidenceDataError(
            f"the {name} part needs >= {minimum} rows of each class, got {positives} correct "
            f"and {y.size - positives} wrong: give more labelled rows or change fit_fraction"
        )


def _metrics(scores: FloatArray, calibrated: FloatArray, y: FloatArray) -> dict[str, float]:
    """Calibration-part metrics of the out-of-fold calibrated and the raw probabilities."""
    raw = sigmoid(scores)
    return {
        "ece": ece(calibrated, y),
        "brier": brier(calibrated, y),
        "nll": nll(calibrated, y),
        "auroc": auroc(calibrated, y),
        "raw_ece": ece(raw, y),
        "raw_brier": brier(raw, y),
        "raw_nll": nll(raw, y),
        "raw_auroc": auroc(scores, y),
        "positive_rate": float(y.mean()),
    }


def _data_sha256(raw: FloatArray, y: FloatArray) -> str:
    """sha256 of the pre-imputation feature matrix (NaN = missing) and the labels, as float64."""
    digest = hashlib.sha256(np.ascontiguousarray(raw, dtype=np.float64).tobytes())
    digest.update(np.ascontiguousarray(y, dtype=np.float64).tobytes())
    return digest.hexdigest()


def fit_confidence_model(
    rows: Sequence[FeatureValues],
    labels: npt.ArrayLike,
    *,
    seed: int = 0,
    fit_fraction: float = 0.6,
    l2: float = 1.0,
    folds: int = 5,
    spec: FeatureSpec = ANSWER_SPEC,
    groups: npt.ArrayLike | None = None,
) -> ConfidenceModel:
    """Fit, calibrate and describe a :class:`ConfidenceModel` (module docstring for the steps).

    ``labels[i]`` is 1 when the answer of ``rows[i]`` was correct (for the default
    answer-level ``spec``; another spec, e.g. per chunk, has its own outcome). Raises
    :class:`ConfigError` for bad settings and :class:`ConfidenceDataError` when a
    part lacks a class or the calibration part has fewer rows per class than folds.
    ``groups`` keeps rows of one group on one side of the split (:func:`group_split`).
    """
    if not l2 > 0.0:
        raise ConfigError(f"l2 must be > 0, got {l2!r}")
    raw = spec.matrix(rows)
    y = as_labels(labels, raw.shape[0])
    if groups is None:
        fit_idx, cal_idx = stratified_split(y, fit_fraction, seed)
    else:
        fit_idx, cal_idx = group_split(y, groups, fit_fraction, seed)
    _check_part("fit", y[fit_idx], 1)
    _check_part("calibration", y[cal_idx], folds)
    means = imputation_means(raw[fit_idx])
    x = np.where(np.isnan(raw), means, raw)
    centre, scale = standardisation(x[fit_idx])
    z = (x - centre) / scale
    design = np.column_stack([z[fit_idx], np.ones(fit_idx.size)])
    penalty = np.append(np.full(z.shape[1], l2), 0.0)
    beta = fit_logistic(design, y[fit_idx], penalty)
    weights, intercept = beta[:-1], float(beta[-1])
    scores = z[cal_idx] @ weights + intercept
    y_cal = y[cal_idx]
    calibrator, choice = choose_calibrator(scores, y_cal, folds=folds, seed=seed)
    out_of_fold = cross_validated_probabilities(
        calibrator.method, scores, y_cal, folds=folds, seed=seed
    )
    metrics = _metrics(scores, out_of_fold, y_cal)
    metrics["fit_auroc"] = auroc(z[fit_idx] @ weights, y[fit_idx])
    training = ConfidenceTraining(
        n=int(y.size),
        positives=int(y.sum()),
        seed=seed,
        fit_fraction=fit_fraction,
        l2=l2,
        folds=folds,
        n_fit=int(fit_idx.size),
        n_calibration=int(cal_idx.size),
        calibration_choice=choice.to_dict(),
        data_sha256=_data_sha256(raw, y),
        metrics=metrics,
    )
    return ConfidenceModel.create(
        imputation_means=means.tolist(),
        standardisation_mean=centre.tolist(),
        standardisation_scale=scale.tolist(),
        coefficients=weights.tolist(),
        intercept=intercept,
        calibrator=calibrator,
        training=training,
        spec=spec,
    )
