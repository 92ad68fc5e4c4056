"""Where ``guardrail.stage.duration`` goes: the OpenTelemetry SDK, a plain histogram, or nowhere.

Every answer verdict records about seven stage durations. Through the SDK's
``Histogram.record`` each costs ~6.6 us (attribute cleaning and hashing, the
measurement object, exemplar sampling, a lock): 80 us per verdict with
Prometheus on (the Helm chart's default), a fifth of the fast path's CPU.

* :class:`OtelStageDurations` records into the SDK's histogram: used when a
  meter provider installed by someone else may read it, or when the OTLP
  exporter aggregates histograms another way than explicit buckets.
* :class:`LocalStageDurations` counts into fixed buckets on the loop's thread
  (~0.5 us). A ``prometheus_client`` collector reads it at scrape time and
  writes the family the SDK's Prometheus exporter wrote
  (``guardrail_stage_duration_seconds``, same buckets, labels ``stage`` and the
  ``otel_scope_*`` labels of the rest of the page); the OTLP metric exporter
  reads it at export time (``sidecar.local_metrics_otlp``) and sends the
  metric the SDK's histogram would have sent.
* Nowhere (``Telemetry`` discards them) when no metric is read at all (the
  API's no-op meter).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram

__all__ = [
    "DESCRIPTION",
    "DURATION_BUCKETS_S",
    "INSTRUMENT",
    "SCOPE",
    "LocalStageDurations",
    "OtelStageDurations",
    "StageDurations",
    "StageSnapshot",
]

SCOPE = "guardrail.sidecar"  # the meter's (and tracer's) instrumentation scope
INSTRUMENT = "guardrail.stage.duration"
DESCRIPTION = "per-stage latency of a request (publish: until the broker confirmed)"
# the SDK's Prometheus exporter names it guardrail_stage_duration_seconds: name + unit
NAME, UNIT = "guardrail_stage_duration", "seconds"
# explicit histogram boundaries (seconds): the fast path takes ~0.5 ms, a slow
# verification seconds; 50 us .. 5 s, about 2.5 per decade
DURATION_BUCKETS_S = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class StageDurations(Protocol):
    def record(self, stage: str, seconds: float) -> None: ...


class OtelStageDurations:
    """The SDK's histogram, with one attribute dict per stage (not one per record)."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self._attributes: dict[str, dict[str, AttributeValue]] = {}

    def record(self, stage: str, seconds: float) -> None:
        attributes = self._attributes.get(stage)
        if attributes is None:
            attributes = self._attributes[stage] = {"stage": stage}
        self.histogram.record(seconds, attributes)


class _Stage:
    __slots__ = ("counts", "extrema", "started_ns", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # the last one: above the largest bound (+Inf)
        self.total = 0.0
        self.extrema = [math.inf, -math.inf]  # min, max since the last take_extrema
        self.started_ns = time.time_ns()


class StageSnapshot(NamedTuple):
    """One stage's histogram as read at one moment (``collect``, an OTLP export)."""

    counts: list[int]
    """Non-cumulative bucket counts; the last one is above every bound (+Inf)."""
    total: float
    started_ns: int


class LocalStageDurations:
    """Cumulative explicit-bucket histograms per stage, exported by :meth:`collect`.

    ``record`` runs on the loop's thread, ``collect`` on the HTTP server's: a
    scrape copies each stage's counts with one C-level ``list`` copy, and its
    ``_count`` is the sum of the copied buckets, so ``+Inf`` and ``_count``
    always agree (``_sum`` may lag or lead them by the records in flight).
    """

    def __init__(
        self,
        bounds: Sequence[float],
        *,
        description: str,
        scope: dict[str, str] | None = None,
    ) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bucket bounds must be strictly increasing, got {list(bounds)}")
        self.bounds = tuple(float(b) for b in bounds)
        self.description = description
        self.scope = dict(scope or {})
        self._stages: dict[str, _Stage] = {}

    def record(self, stage: str, seconds: float) -> None:
        held = self._stages.get(stage)
        if held is None:
            held = self._stages[stage] = _Stage(len(self.bounds))
        # a value equal to a bound belongs to that bucket (le = less than or equal)
        held.counts[bisect_left(self.bounds, seconds)] += 1
        held.total += seconds
        # comparisons, not min()/max(): 15 ns against 260 ns a record (timeit)
        extrema = held.extrema
        if seconds < extrema[0]:  # noqa: PLR1730
            extrema[0] = seconds
        if seconds > extrema[1]:  # noqa: PLR1730
            extrema[1] = seconds

    def snapshot(self) -> dict[str, StageSnapshot]:
        """Per stage: the bucket counts, the sum and when the stage was first recorded."""
        return {
            stage: StageSnapshot(list(h.counts), h.total, h.started_ns)
            for stage, h in list(self._stages.items())
        }

    def take_extrema(self, stage: str) -> tuple[float, float]:
        """The smallest and largest value recorded for ``stage`` since the last call
        (``inf, -inf`` when none), starting a new window (the OTLP export's min and max).

        Lock-free: the window is swapped, not cleared, so a record on the loop's thread
        lands in the old window or the new one; one that read the old window just
        before the swap can be missing from both windows' extrema (never from the
        counts or the sum).
        """
        held = self._stages.get(stage)
        if held is None:
            return math.inf, -math.inf
        taken, held.extrema = held.extrema, [math.inf, -math.inf]
        return taken[0], taken[1]

    def collect(self) -> Iterator[Any]:
        """The ``prometheus_client`` collector protocol: one histogram family."""
        from prometheus_client.core import HistogramMetricFamily  # noqa: PLC0415

        scope_names = sorted(self.scope)
        family = HistogramMetricFamily(
            NAME, self.description, labels=["stage", *scope_names], unit=UNIT
        )
        les = [f"{b}" for b in self.bounds] + ["+Inf"]  # as the SDK's exporter writes them
        for stage, (counts, total, _) in sorted(self.snapshot().items()):
            running, buckets = 0, []
            for le, count in zip(les, counts, strict=True):
                running += count
                buckets.append((le, running))
            family.add_metric([stage, *(self.scope[n] for n in scope_names)], buckets, total)
        yield family

    def describe(self) -> list[Any]:
        """Registration checks names without collecting (no stage is known yet)."""
        return list(self.collect())
