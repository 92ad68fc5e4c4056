"""The sidecar's retrieval-certification signal, pure (docs/methods.md §Retrieval certification).

Implements ``sidecar.pipeline.ports.RetrievalCertifier``: resolves the event's
calibration key (tenant, collection, retriever) in the registry, certifies the
hits' raw scores (eqs. 4-6, depth = the event's K), feeds the exchangeability
monitor and reports all of it as a ``RetrievalSignal``.
"""

from __future__ import annotations

from sidecar.conformal.certify import certify
from sidecar.conformal.monitor import ExchangeabilityMonitor, MonitorStatus
from sidecar.conformal.registry import CalibrationRegistry
from sidecar.contracts.events import RetrievalEvent, RetrievalSignal, SignalStatus
from sidecar.pipeline.ports import MonitorReading


class ConformalCertifier:
    """Certify each retrieval event against its (Mondrian) calibration."""

    def __init__(self, registry: CalibrationRegistry, monitor: ExchangeabilityMonitor) -> None:
        self.registry = registry
        self.monitor = monitor

    @property
    def version(self) -> str:
        return self.registry.calibration_id

    def certify(self, event: RetrievalEvent) -> RetrievalSignal:
        resolved = self.registry.resolve(event.tenant, event.collection, event.retriever)
        cert = certify([h.score for h in event.hits], resolved, depth=event.k)
        if not cert.certifiable:
            # no threshold at this alpha (k > n): the conformal set is every chunk, which
            # certifies none. Claims, coverage, confidence and the monitor read "trusted"
            # as certified, so nothing is trusted (and the monitor is not fed); the policy
            # reads ``certifiable``.
            trusted: list[str] = []
            m1, m2, status = False, 0.0, None
        else:
            trusted = [event.hits[i].chunk_id for i in cert.trusted_indices]
            m1, m2, status = cert.m1, cert.m2, self.monitor.observe(cert)
        return RetrievalSignal(
            status=SignalStatus.OK,
            trusted_chunk_ids=trusted,
            m1=m1,
            m2=m2,
            q_hat=cert.q_hat,
            alpha=cert.alpha,
            certifiable=cert.certifiable,
            calibration_version=cert.calibration_id,
            calibration_key=cert.calibration_key,
            fallback=cert.fallback,
            fallback_reason=cert.fallback_reason,
            clipped_scores=cert.n_clipped,
            monitor=None if status is None else status.state.value,
            m1_mean=None if status is None else status.m1_mean,
        )

    def monitor_readings(self) -> dict[str, MonitorReading]:
        return {key: _reading(st) for key, st in self.monitor.statuses().items()}


def _reading(status: MonitorStatus) -> MonitorReading:
    interval = status.interval
    return MonitorReading(status.m1_mean, interval.low, interval.high, status.broken)
