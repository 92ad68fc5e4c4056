"""The guardrail client and its lookback recorder: unit and real-broker tests."""
