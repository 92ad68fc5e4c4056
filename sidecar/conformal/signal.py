"""The sidecar's retrieval-certification signal, pure (docs/methods.md §Retrieval certification).

Implements ``sidecar.pipeline.ports.RetrievalCertifier``: resolves the event's
calibration key (tenant, collection, retriever) in the registry, certifies the
hits' raw scores (eqs. 4-6, depth = the event's K), reads the exchangeability
monitor and reports all of it as a ``RetrievalSignal``; the monitor is fed when
the request is decided (:meth:`ConformalCertifier.observe_decided`), once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final, get_args

from sidecar.conformal.certify import trusted_set
from sidecar.conformal.monitor import (
    ExchangeabilityMonitor,
    MonitorState,
    MonitorStatus,
    monitor_key,
)
from sidecar.conformal.order import ScoreOrder
from sidecar.conformal.registry import CalibrationRegistry
from sidecar.contracts.assembled import assembled, unit_float
from sidecar.contracts.events import RetrievalEvent, RetrievalSignal, SignalStatus
from sidecar.contracts.verdicts import SCORES_RISING
from sidecar.pipeline.ports import MonitorReading, MonitorSeed


class ConformalCertifier:
    """Certify each retrieval event against its (Mondrian) calibration."""

    def __init__(self, registry: CalibrationRegistry, monitor: ExchangeabilityMonitor) -> None:
        self.registry = registry
        self.monitor = monitor
        self.order = ScoreOrder()  # per key: similarities, or distances read the wrong way

    @property
    def version(self) -> str:
        return self.registry.calibration_id

    def certify(self, event: RetrievalEvent) -> RetrievalSignal:
        resolved = self.registry.resolve(event.tenant, event.collection, event.retriever)
        scores = [h.score for h in event.hits]
        # eqs. 4-6 as ``certify`` computes them, without building its Certification
        cal = resolved.calibration
        trusted_at, _, n_clipped, depth = trusted_set(scores, cal, event.k)
        certifiable = cal.certifiable
        fallback = resolved.reason_text is not None
        rising = self.order.observe(resolved.requested_label, scores)
        if rising or not certifiable:
            # distances, read as similarities, would trust the worst chunks; and without a
            # threshold at this alpha (k > n) the conformal set is every chunk, which
            # certifies none. Claims, coverage, confidence and the monitor read "trusted"
            # as certified, so nothing is trusted (and the monitor is not fed); the policy
            # reads ``certifiable`` and the fallback reason.
            trusted: list[str] = []
            m1, m2, state, mean = False, 0.0, None, None
        else:
            trusted = [event.hits[i].chunk_id for i in trusted_at]
            m1, m2 = bool(trusted_at), len(trusted_at) / depth if depth else 0.0
            key = monitor_key(resolved.used_key, fallback=fallback, tenant=event.tenant)
            state, mean = self.monitor.reading(key, resolved.alpha, resolved.calibration_id)
        return retrieval_signal(
            {  # RetrievalSignal's fields, in its order
                "status": SignalStatus.OK,
                "trusted_chunk_ids": trusted,
                "m1": m1,
                "m2": m2,
                "q_hat": cal.q_hat if certifiable else None,
                "alpha": resolved.alpha,
                "certifiable": certifiable,
                "calibration_version": resolved.calibration_id,
                "calibration_key": resolved.used_key,
                "fallback": rising or fallback,
                "fallback_reason": SCORES_RISING if rising else resolved.reason_text,
                "clipped_scores": n_clipped,
                "monitor": None if state is None else state.value,
                "m1_mean": mean,
            }
        )

    def observe_decided(self, event: RetrievalEvent, signal: RetrievalSignal) -> None:
        """Count a decided request's retrieval in its monitor window (once per request)."""
        counted = _window_of(event.tenant, signal)
        if counted is not None:
            key, m1, alpha, calibration_id = counted
            self.monitor.record_m1(key, m1, alpha, calibration_id=calibration_id)

    def seed_decided(self, decided: Iterable[tuple[str | None, RetrievalSignal]]) -> MonitorSeed:
        """Refill the monitor's windows from requests decided before this process started:
        ``(tenant, retrieval signal)`` of the fleet's final verdicts, oldest first
        (:mod:`sidecar.kafka.warmstart`), counted as :meth:`observe_decided` counted them.

        Each window takes the decisions under its key's latest calibration and alpha (a
        fleet mid-rollout has both; the live path restarts a window on a new one), its last
        ``window`` of them, and is judged with the state its latest verdict read
        (:meth:`ExchangeabilityMonitor.resume`): with at least ``window`` of them, the
        window and its state are the ones the replica that decided them held.
        """
        by_key: dict[str, list[tuple[bool, float, str]]] = {}
        alarm: dict[str, bool] = {}  # the latest verdict's reading of the key: on?
        for tenant, signal in decided:
            counted = _window_of(tenant, signal)
            if counted is not None:
                key, m1, alpha, calibration_id = counted
                by_key.setdefault(key, []).append((m1, alpha, calibration_id))
                alarm[key] = signal.monitor == MonitorState.BROKEN.value
        fed = 0
        broken: list[str] = []
        for key, entries in by_key.items():
            _, alpha, calibration_id = entries[-1]
            same = [m1 for m1, a, c in entries if a == alpha and c == calibration_id]
            for m1 in same[-self.monitor.window :]:
                self.monitor.record_m1(key, m1, alpha, calibration_id=calibration_id)
            fed += min(len(same), self.monitor.window)
            if self.monitor.resume(key, was_broken=alarm[key]) is MonitorState.BROKEN:
                broken.append(key)
        return MonitorSeed(fed=fed, keys=len(by_key), broken=tuple(broken))

    def monitor_readings(self) -> dict[str, MonitorReading]:
        return {key: _reading(st) for key, st in self.monitor.statuses().items()}


def _window_of(tenant: str | None, signal: RetrievalSignal) -> tuple[str, bool, float, str] | None:
    """Where a decided request's retrieval counts: ``(window key, m1, alpha, calibration
    id)``; ``None`` when it is not counted (not certified, vacuous at its alpha, or scores
    read the wrong way)."""
    m1, alpha, calibration_id = signal.m1, signal.alpha, signal.calibration_version
    if not signal.certifiable or m1 is None or signal.calibration_key is None:
        return None  # not certified (vacuous at this alpha): not fed, as before
    if signal.fallback_reason == SCORES_RISING:
        return None  # not certified either: its m1 says nothing of the calibration
    if alpha is None or calibration_id is None:
        return None
    key = monitor_key(signal.calibration_key, fallback=signal.fallback, tenant=tenant)
    return key, m1, alpha, calibration_id


_MONITOR_STATES: Final = frozenset(
    get_args(get_args(RetrievalSignal.model_fields["monitor"].annotation)[0])
)


def retrieval_signal(values: dict[str, Any]) -> RetrievalSignal:
    """``RetrievalSignal(**values)``, built without validation when the values that need
    it already pass (the identifiers, flags and counts are typed by the code above).

    Validating the signal was ~7 us of the ~30 a retrieval cost;
    a value that fails the check here (a NaN, a numpy float, a probability out of
    range) is validated as before, which coerces it or raises the same error.
    """
    q_hat, mean, monitor = values["q_hat"], values["m1_mean"], values["monitor"]
    if (
        unit_float(values["m2"])
        and unit_float(values["alpha"])
        and (mean is None or unit_float(mean))
        and (q_hat is None or (type(q_hat) is float and math.isfinite(q_hat)))
        and (monitor is None or (type(monitor) is str and monitor in _MONITOR_STATES))
        and type(values["clipped_scores"]) is int
    ):
        return assembled(RetrievalSignal, values)
    return RetrievalSignal(**values)


def _reading(status: MonitorStatus) -> MonitorReading:
    interval = status.interval
    return MonitorReading(status.m1_mean, interval.low, interval.high, status.broken)
