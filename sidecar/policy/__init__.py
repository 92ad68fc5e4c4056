"""Policies turn signals into allow / caveat / block with reasons. Pure logic."""

from sidecar.pipeline.ports import Policy, PolicyOutcome
from sidecar.policy.placeholder import PlaceholderPolicy

__all__ = ["PlaceholderPolicy", "Policy", "PolicyOutcome"]
