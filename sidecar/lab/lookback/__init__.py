"""Fit side of :mod:`sidecar.lookback`: the on-disk dataset, training, ONNX export, evaluation."""
