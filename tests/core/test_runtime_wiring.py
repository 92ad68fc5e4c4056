"""The composition root: runtime.build_processor wires certified allow to the coverage monitor."""

from __future__ import annotations

from sidecar import runtime
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.policy.engine import PolicyEngine


def test_the_served_policy_re_tests_its_allow_certificates_on_the_monitors_feedback() -> None:
    processor = runtime.build_processor(Settings.load())
    policy, coverage = processor.policy, processor.signals.coverage
    assert isinstance(policy, PolicyEngine) and isinstance(coverage, CoverageMonitor)
    assert policy.certificates is coverage.certificates
    # the shipped policy's certificate is registered with the monitor's tracker
    assert coverage.certificates.keys() == [c.certificate.key for c in policy.certified.values()]
