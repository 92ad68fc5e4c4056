"""Fit side of :mod:`sidecar.conformal`: ROUGE ground truth (eq. 1), the calibrate/eval recipe."""
