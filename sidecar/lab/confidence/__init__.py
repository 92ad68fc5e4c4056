"""Fit side of :mod:`sidecar.confidence`: the model fit and the `train confidence` recipe."""
