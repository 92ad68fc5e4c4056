"""The sidecar's own metrics, exported over OTLP beside the SDK's.

:class:`LocalMetricsExporter` wraps the OTLP metric exporter: each time the
SDK's periodic reader exports, the wrapper adds to the batch, in the sidecar's
instrumentation scope, what is kept outside the SDK:

* one ``guardrail.stage.duration`` metric built from
  :class:`~sidecar.stage_durations.LocalStageDurations`, shaped as the SDK's
  explicit-bucket histogram would have shaped it (same name, unit, description,
  bounds, ``stage`` attribute; cumulative or delta, as the exporter prefers). So
  an OTLP metric exporter no longer sends every stage record through the SDK's
  ``Histogram.record`` (~6.6 us each, ~7 per verdict);
* the per-calibration-key gauges of :class:`~sidecar.keyed_gauges.KeyedGauges`
  (``guardrail.retrieval.*``, ``guardrail.coverage.*``), as the SDK's observable
  gauges would have sent them, without the SDK's memory of every key ever seen.

Differences from the SDK's histogram, both within one record in flight: a
record landing while an export reads the histogram may count in this export's
buckets and the next one's sum (or the reverse); one landing during the
min/max window swap may be missing from the exported min and max (never from
the counts). A min or max that no window saw is left out of the point (OTLP
makes both optional).

Only the explicit-bucket aggregation is built here: when the exporter prefers
another one for histograms (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION
=base2_exponential_bucket_histogram``), :func:`exports_explicit_buckets` says no and
the stage durations stay on the SDK's histogram.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any, cast

from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import DefaultAggregation, ExplicitBucketHistogramAggregation
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from sidecar import __version__
from sidecar.keyed_gauges import LABEL, KeyedGauges
from sidecar.stage_durations import DESCRIPTION, INSTRUMENT, SCOPE, LocalStageDurations

__all__ = ["LocalMetricsExporter", "exports_explicit_buckets", "keyed_gauge_metrics"]

log = logging.getLogger("sidecar.telemetry")

UNIT = "s"  # the instrument's unit, as Telemetry creates it


def exports_explicit_buckets(exporter: MetricExporter) -> bool:
    """Does ``exporter`` aggregate histograms into explicit buckets (the OTLP default)?"""
    preferred = (exporter._preferred_aggregation or {}).get(HistogramInstrument)
    return preferred is None or isinstance(
        preferred, DefaultAggregation | ExplicitBucketHistogramAggregation
    )


def keyed_gauge_metrics(keyed: KeyedGauges, now_ns: int) -> list[Metric]:
    """The per-key gauges read now, as the SDK's observable gauges export them: a
    ``Gauge`` of one point per key, no unit, no start time."""
    return [
        Metric(
            name=reading.name,
            description=reading.description,
            unit="",
            data=Gauge(
                data_points=[
                    NumberDataPoint(
                        attributes={LABEL: key},
                        start_time_unix_nano=cast(int, None),  # as the SDK's gauges
                        time_unix_nano=now_ns,
                        value=value,
                    )
                    for key, value in reading.values.items()
                ]
            ),
        )
        for reading in keyed.read()
    ]


@dataclass(slots=True)
class _Exported:
    """What the last export of one stage said (delta: counts, sum and time, where the next
    point starts; cumulative: the min and max over every window)."""

    counts: list[int]
    total: float
    time_ns: int
    low: float = math.inf
    high: float = -math.inf


class LocalMetricsExporter(MetricExporter):
    """``inner`` with the stage histogram (when ``local`` is given: the exporter takes
    explicit buckets) and the per-key gauges (when ``keyed`` is) added to every export."""

    def __init__(
        self,
        inner: MetricExporter,
        local: LocalStageDurations | None,
        keyed: KeyedGauges | None = None,
    ) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self.local = local
        self.keyed = keyed
        temporality = (inner._preferred_temporality or {}).get(HistogramInstrument)
        self.temporality = (
            AggregationTemporality.DELTA
            if temporality is AggregationTemporality.DELTA
            else AggregationTemporality.CUMULATIVE
        )
        self._exported: dict[str, _Exported] = {}

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return self.inner.export(
            self.with_local_metrics(metrics_data), timeout_millis=timeout_millis, **kwargs
        )

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    def with_local_metrics(self, metrics_data: MetricsData) -> MetricsData:
        """``metrics_data`` with the stage histogram and the per-key gauges in the
        sidecar's scope (those that have a point to export)."""
        now_ns = time.time_ns()
        added: list[Metric] = []
        try:
            metric = self.stage_metric(now_ns)
        except Exception:  # the SDK's own metrics still go out
            log.exception("the stage histogram could not be added to this OTLP export")
        else:
            added += [metric] if metric is not None else []
        if self.keyed is not None:
            added += keyed_gauge_metrics(self.keyed, now_ns)  # a failing read is logged there
        if not added or not metrics_data.resource_metrics:
            return metrics_data
        first, *rest = metrics_data.resource_metrics
        scopes = list(first.scope_metrics)
        for i, scoped in enumerate(scopes):
            if scoped.scope.name == SCOPE:
                scopes[i] = replace(scoped, metrics=[*scoped.metrics, *added])
                break
        else:
            scopes.append(
                ScopeMetrics(
                    scope=InstrumentationScope(SCOPE, __version__),
                    metrics=added,
                    schema_url="",
                )
            )
        return MetricsData(resource_metrics=[replace(first, scope_metrics=scopes), *rest])

    def stage_metric(self, now_ns: int) -> Metric | None:
        """The stage histogram's points at ``now_ns``; ``None`` when there is none."""
        if self.local is None:
            return None
        points = []
        for stage, snapshot in sorted(self.local.snapshot().items()):
            low, high = self.local.take_extrema(stage)
            last = self._exported.get(stage)
            if last is None:
                last = self._exported[stage] = _Exported(
                    [0] * len(snapshot.counts), 0.0, snapshot.started_ns
                )
            if self.temporality is AggregationTemporality.DELTA:
                counts = [
                    count - before
                    for count, before in zip(snapshot.counts, last.counts, strict=True)
                ]
                total, start_ns = snapshot.total - last.total, last.time_ns
                last.counts, last.total, last.time_ns = snapshot.counts, snapshot.total, now_ns
            else:
                counts, total, start_ns = snapshot.counts, snapshot.total, snapshot.started_ns
                last.low, last.high = min(last.low, low), max(last.high, high)
                low, high = last.low, last.high
            if not any(counts):
                continue  # as the SDK: a delta point only for a stage recorded since the last
            points.append(
                HistogramDataPoint(
                    attributes={"stage": stage},
                    start_time_unix_nano=start_ns,
                    time_unix_nano=now_ns,
                    count=sum(counts),
                    sum=total,
                    bucket_counts=tuple(counts),
                    explicit_bounds=self.local.bounds,
                    # a window that saw no record has no min or max: OTLP leaves them out
                    min=cast(float, low if math.isfinite(low) else None),
                    max=cast(float, high if math.isfinite(high) else None),
                )
            )
        if not points:
            return None
        return Metric(
            name=INSTRUMENT,
            description=DESCRIPTION,
            unit=UNIT,
            data=Histogram(data_points=points, aggregation_temporality=self.temporality),
        )
