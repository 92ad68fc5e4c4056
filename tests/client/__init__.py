"""The guardrail client: unit tests and real-broker tests against a sidecar process."""
