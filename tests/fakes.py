"""Test doubles shared by the processor, signal-wiring and feedback tests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.contracts.events import RetrievalEvent, RetrievalSignal, SignalStatus
from sidecar.pipeline.ports import MonitorReading, MonitorSeed


@dataclass(frozen=True)
class ThresholdCertifier:
    """Trusts hits scoring >= ``threshold`` (optionally under one calibration key)."""

    calibration_key: str | None = None
    threshold: float = 0.5
    version: str = "threshold/1"

    def certify(self, event: RetrievalEvent) -> RetrievalSignal:
        trusted = [h.chunk_id for h in event.hits if h.score >= self.threshold]
        return RetrievalSignal(
            status=SignalStatus.OK,
            trusted_chunk_ids=trusted,
            m1=bool(trusted),
            m2=len(trusted) / event.k,
            calibration_key=self.calibration_key,
        )

    def observe_decided(self, event: RetrievalEvent, signal: RetrievalSignal) -> None:
        pass

    def monitor_readings(self) -> dict[str, MonitorReading]:
        return {}

    def seed_decided(self, decided: Iterable[tuple[str | None, RetrievalSignal]]) -> MonitorSeed:
        return MonitorSeed(0, 0)
