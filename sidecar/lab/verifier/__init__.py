"""Fit side of the claim verifier served by :mod:`sidecar.claims`: data, training, evaluation."""
