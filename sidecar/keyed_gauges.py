"""Gauges per calibration key, read at scrape / export time outside the OpenTelemetry SDK.

The rolling m1 monitor (``guardrail.retrieval.*``) and the coverage bound
(``guardrail.coverage.*``) report one value per calibration key, and keys come and
go with tenants (``global[<tenant>]``). The SDK remembers every attribute set an
instrument ever saw, for the life of the process, and puts each one past its
2,000th into a single ``otel_metric_overflow="true"`` series: once ~2,000 keys
had ever been exported, a key that then broke was reported only there, and the
per-key alert could not say which key broke (audit). Here nothing remembers a
key: each scrape or export reads the keys reported now (at most
``metrics.max_key_series``, chosen by ``Telemetry``).

:class:`KeyedGauges` is a ``prometheus_client`` collector that writes the
families the SDK's Prometheus exporter wrote (same names, HELP text, the
``calibration_key`` label and the ``otel_scope_*`` labels of the rest of the
page); the OTLP metric exporter reads :meth:`KeyedGauges.read` at export time
(``sidecar.local_metrics_otlp``) and sends the gauges the SDK would have sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["LABEL", "GaugeReading", "KeyedGauges", "KeyedValues"]

log = logging.getLogger("sidecar.telemetry")

LABEL = "calibration_key"  # the one attribute of every point

KeyedValues = Mapping[str, Mapping[str, float]]
"""Instrument name -> calibration key -> value, as one read of a group says."""


class GaugeReading(NamedTuple):
    """One gauge as read at one moment: its value per calibration key."""

    name: str
    description: str
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class _Group:
    gauges: tuple[tuple[str, str], ...]  # instrument name, description
    read: Callable[[], KeyedValues]


class KeyedGauges:
    """Groups of per-key gauges, each group read once per scrape or export."""

    def __init__(self, scope: dict[str, str] | None = None) -> None:
        """``scope``: labels put on every Prometheus sample (the SDK's ``otel_scope_*``)."""
        self.scope = dict(scope or {})
        self._groups: list[_Group] = []

    def add(self, gauges: Sequence[tuple[str, str]], read: Callable[[], KeyedValues]) -> None:
        """Gauges (instrument name, description) whose values ``read()`` gives together:
        one call per collection, not one per gauge."""
        self._groups.append(_Group(tuple(gauges), read))

    def read(self) -> list[GaugeReading]:
        """Every gauge with a value for at least one key, read now (a gauge without any is
        left out, as the SDK leaves out an instrument without points).

        A group whose ``read`` raises is left out of this collection and logged, as the
        SDK does with a failing callback: the rest of the scrape still goes out."""
        readings = []
        for group in list(self._groups):  # the loop's thread may be adding one
            try:
                values = group.read()
            except Exception:
                log.exception("per-key gauges %s could not be read", group.gauges[0][0])
                continue
            for name, description in group.gauges:
                if points := values.get(name):
                    readings.append(GaugeReading(name, description, dict(points)))
        return readings

    def collect(self) -> Iterator[Any]:
        """The ``prometheus_client`` collector protocol: one gauge family per gauge."""
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

        # the SDK's exporter sorts the label names: calibration_key, then otel_scope_*
        labels = sorted([LABEL, *self.scope])
        for name, description, values in self.read():
            # the SDK's exporter writes the instrument name with "." as "_" (no unit here)
            family = GaugeMetricFamily(name.replace(".", "_"), description, labels=labels)
            for key, value in values.items():
                family.add_metric([key if n == LABEL else self.scope[n] for n in labels], value)
            yield family
