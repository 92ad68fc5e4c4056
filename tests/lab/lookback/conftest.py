"""The lookback fixtures (a synthetic dataset, tiny trained models), shared with tests/lookback."""

from __future__ import annotations

from tests.lookback.conftest import cw_model, dataset_dir, fc_model

__all__ = ["cw_model", "dataset_dir", "fc_model"]
