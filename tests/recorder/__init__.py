"""Tests of guardrail_client.hf (the lookback recorder)."""
