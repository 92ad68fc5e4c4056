"""Binary logistic regression by Newton's method (IRLS), in numpy.

Shared by Platt scaling (:mod:`sidecar.confidence.calibration`, one feature and
smoothed targets) and the forecaster (:mod:`sidecar.lab.confidence.training`). With
design matrix ``X`` (the intercept is a column of ones), soft targets ``t`` in
[0, 1] and a per-coefficient ridge ``lambda_j >= 0`` the objective is::

    f(beta) = sum_i [ log(1 + exp(x_i . beta)) - t_i * x_i . beta ] + 1/2 sum_j lambda_j beta_j^2

with gradient ``X^T (p - t) + lambda * beta`` and Hessian
``X^T diag(p (1 - p)) X + diag(lambda)``, ``p = sigmoid(X beta)``. Each Newton
step is damped by backtracking (Armijo) so the objective never increases, and the
loop stops after ``max_iter`` steps, so separable data without a ridge still ends.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["FloatArray", "fit_logistic", "log_sigmoid", "sigmoid"]

FloatArray = npt.NDArray[np.float64]

_ARMIJO = 1e-4
_MIN_STEP = 1e-10


def sigmoid(z: FloatArray) -> FloatArray:
    """``1 / (1 + exp(-z))`` without overflow: ``e = exp(-|z|)``, ``1/(1+e)`` or ``e/(1+e)``."""
    e = np.exp(-np.abs(z))
    out: FloatArray = np.where(z >= 0.0, 1.0 / (1.0 + e), e / (1.0 + e))
    return out


def log_sigmoid(z: FloatArray) -> FloatArray:
    """``log sigmoid(z) = -log(1 + exp(-z))``, computed as ``-logaddexp(0, -z)``."""
    out: FloatArray = -np.logaddexp(0.0, -z)
    return out


def _objective(
    design: FloatArray, targets: FloatArray, penalty: FloatArray, beta: FloatArray
) -> float:
    """``f(beta)`` of the module docstring."""
    z = design @ beta
    return float(np.sum(np.logaddexp(0.0, z) - targets * z) + 0.5 * np.sum(penalty * beta * beta))


def _newton_direction(
    design: FloatArray, targets: FloatArray, penalty: FloatArray, beta: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Gradient ``g`` and Newton direction ``H^-1 g`` (least squares when ``H`` is singular)."""
    p = sigmoid(design @ beta)
    grad: FloatArray = design.T @ (p - targets) + penalty * beta
    hessian = design.T @ (design * (p * (1.0 - p))[:, None]) + np.diag(penalty)
    try:
        step = np.asarray(np.linalg.solve(hessian, grad), dtype=np.float64)
    except np.linalg.LinAlgError:
        step = np.asarray(np.linalg.lstsq(hessian, grad, rcond=None)[0], dtype=np.float64)
    return grad, step


def fit_logistic(
    design: FloatArray,
    targets: FloatArray,
    penalty: FloatArray,
    *,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> FloatArray:
    """Minimise ``f(beta)`` (module docstring) from ``beta = 0``; returns ``beta``.

    ``design`` is ``(n, d)``, ``targets`` ``(n,)`` in [0, 1], ``penalty`` ``(d,)``
    (0 for the intercept). Stops when a step moves no coefficient by more than
    ``tol * (1 + max|beta|)`` or after ``max_iter`` Newton steps.
    """
    beta = np.zeros(design.shape[1], dtype=np.float64)
    value = _objective(design, targets, penalty, beta)
    for _ in range(max_iter):
        grad, step = _newton_direction(design, targets, penalty, beta)
        slope = float(grad @ step)
        if not np.all(np.isfinite(step)) or slope <= 0.0:
            break
        size = 1.0
        while size > _MIN_STEP:
            candidate = beta - size * step
            cand_value = _objective(design, targets, penalty, candidate)
            if cand_value <= value - _ARMIJO * size * slope:
                break
            size *= 0.5
        else:
            break
        beta, value = candidate, cand_value
        if size * float(np.max(np.abs(step))) <= tol * (1.0 + float(np.max(np.abs(beta)))):
            break
    return beta
