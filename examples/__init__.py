"""Runnable examples of services that feed the guardrail sidecar (not part of the sidecar)."""
