"""OpenTelemetry at the edge: messaging spans around the Kafka loop, and the metrics.

The SDK is installed from the ``OTEL_*`` variables by
:func:`sidecar.telemetry_setup.configure_from_env`; without it the API's no-op
tracer and meter are used. Without a recording tracer (``Telemetry.from_setup``)
no span is opened at all: a verdict's no-op spans cost ~11 us and the consumer
span's links ~2 us per record, for nothing; verdicts' headers still get the
inputs' trace context.

Spans follow the messaging semantic conventions (attributes ``messaging.*``; the
sidecar's own are ``guardrail.*``):
  process <topic>        CONSUMER, one per handled poll (a batch, or one record);
                         messaging.system=kafka, messaging.operation.type=process,
                         messaging.destination.name (when the batch has one topic),
                         messaging.consumer.group.name; for one record also the
                         partition, messaging.kafka.offset, messaging.kafka.message.key;
                         a link to the producer context (``traceparent``) of each record.
  guardrail.request      INTERNAL, one per answer verdict, a child of the LLM service's
                         span (the inputs' ``traceparent``), linked to the consumer span
                         that completed it and to inputs in other traces (a retrieval's);
                         children, one per stage:
    guardrail.join / .certify / .score / .verify_claims / .policy
    send rag.verdicts    PRODUCER, until the broker confirmed the record (partition and
                         offset set then); the verdict's headers carry ITS context.
  guardrail.verify_claim INTERNAL per streamed claim verdict, with its ``send rag.claims``.
  send <topic>           PRODUCER for every other output (dead letters, reports), a
                         child of the consumer span; their headers are left as they are
                         (a dead letter keeps the input's own trace context).

The Kafka client instrumentation (``opentelemetry-instrumentation-aiokafka``) is not
used: it wraps ``AIOKafkaProducer.send`` (a span that ends when the record is queued,
not confirmed, parented to whatever context is current) and the fetch calls (consumer
spans that end before the record is processed), and it pins the SDK's contrib
packages to another release. The loop's own points (handled poll, confirmed publish)
are where the spans belong.

Metrics (meter ``guardrail.sidecar``; Prometheus names in brackets):
  guardrail.verdicts            counter   decision, profile, stage   [guardrail_verdicts_total]
                                          once per answer verdict (stage: stream | final);
                                          a final verdict's decisions under each profile
                                          start at 0
  guardrail.verdict.reasons     counter   reason, decision   [guardrail_verdict_reasons_total]
  guardrail.claim_verdicts      counter   label
                                (these three count what the broker confirmed, in plain dicts
                                observed at collection: an SDK ``add`` costs ~10 us, several
                                per verdict; one replaced by its dead letter is not counted)
  guardrail.dead_letters        counter   reason
  guardrail.stage.duration      histogram stage, seconds, buckets 50 us .. 5 s
                                          [guardrail_stage_duration_seconds_bucket]
                                          (join, certify, score, verify_claims, policy, publish;
                                          answer_to_verdict: from the final event's Kafka
                                          timestamp to the verdict's confirmation;
                                          a plain histogram read at scrape / export time:
                                          sidecar.stage_durations, local_metrics_otlp)
  guardrail.publish.retries     counter
  guardrail.join.evictions      counter (observed: capacity + ttl)
  guardrail.join.open_requests  gauge
  guardrail.consumer.lag        gauge     topic, partition
  guardrail.consumer.records    counter   topic, outcome (accepted, dead-lettered, duplicate)
                                          input records consumed, added once per batch
  guardrail.ready, guardrail.live
                                gauges    1 while /readyz, /livez answer 200 (read at
                                          collection from the same checks)
  guardrail.queue.records, .queue.bytes, guardrail.consumer.paused_partitions
                                gauges    (what waits for the processor; what is paused)
  guardrail.join.partition_mismatch, .misrouted, .rerouted, .rerouted_late, .byte_evictions,
  guardrail.join.rereads,
  guardrail.claims.refused, guardrail.feedback.unmatched, .replaced, .early,
  guardrail.coverage.evicted_keys,
  guardrail.pipeline.internal_errors
                                counters (cumulative, observed at collection)
  guardrail.retrieval.m1_mean, .m1_wilson_low, .m1_wilson_high, .exchangeability_broken
                                gauges    calibration_key (the rolling m1 monitor)
  guardrail.coverage.*          gauges    calibration_key (the coverage bound:
                                          docs/methods.md §Coverage bound)
                                (these per-key gauges are read at scrape / export time
                                outside the SDK, which remembers every key it ever saw:
                                sidecar.keyed_gauges)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from opentelemetry.util.types import AttributeValue

from sidecar import __version__
from sidecar.contracts.verdicts import Decision
from sidecar.keyed_gauges import LABEL, KeyedGauges, KeyedValues
from sidecar.pipeline.outputs import Destination, Output, TraceRecord
from sidecar.stage_durations import (
    DESCRIPTION,
    DURATION_BUCKETS_S,
    INSTRUMENT,
    SCOPE,
    OtelStageDurations,
    StageDurations,
)
from sidecar.telemetry_setup import TelemetrySetup

__all__ = ["DURATION_BUCKETS_S", "SCOPE", "PublishHandle", "Telemetry"]

MESSAGING_SYSTEM = "kafka"
MAX_KEY_ATTRIBUTE_BYTES = 256  # messaging.kafka.message.key in spans
# answer_to_verdict times only answers stamped within this of the sidecar's clock: a
# producer clock slightly ahead is read as 0, but a final event stamped minutes ahead
# (year 2100) or days back (timestamp 1: 55 years) is no latency at all. Audit: one
# producer stamping 1990 put 588 verdicts of 36.9 years each in +Inf (sum 6.9e11 s),
# one stamping 2100 put 588 in the 50 us bucket.
ANSWER_AHEAD_MAX_NS: Final = 300 * 1_000_000_000  # flow.FUTURE_TOLERANCE_MS
ANSWER_AGE_MAX_NS: Final = 7 * 86_400 * 1_000_000_000  # Kafka's default retention


def _carrier(headers: Iterable[tuple[str, bytes | str | None]]) -> dict[str, str]:
    """W3C trace context headers as text (the in-memory test broker hands text values)."""
    return {
        k: v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
        for k, v in headers
        if v is not None  # a null header value (Kafka allows it)
    }


class ConsumedRecord(Protocol):
    """What a consumer span reads of a Kafka record (aiokafka's ``ConsumerRecord``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


def _record_attributes(record: ConsumedRecord) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "messaging.destination.name": record.topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
    }
    if record.key is not None:
        attributes["messaging.kafka.message.key"] = _key_text(record.key)
    return attributes


def _key_text(key: bytes) -> str:
    """A record key as a span attribute: text, at most ``MAX_KEY_ATTRIBUTE_BYTES`` of it (a
    key is a request id of at most 128 characters; a hostile 1 MiB key stays out of spans)."""
    return key[:MAX_KEY_ATTRIBUTE_BYTES].decode("utf-8", errors="replace")


def _observed(
    counts: Mapping[Any, int], names: tuple[str, ...]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """An observable counter's callback over ``counts`` (key: one value per attribute name)."""

    def read(_options: CallbackOptions) -> Iterable[Observation]:
        snapshot = dict(counts)  # one C-level copy: the loop's thread may be counting
        return [
            Observation(n, dict(zip(names, key if isinstance(key, tuple) else (key,), strict=True)))
            for key, n in snapshot.items()
        ]

    return read


# the HELP text of each observed count (audit: every one was blank)
COUNT_HELP: Final = {
    "join.partition_mismatch": "requests whose events came on different partition numbers "
    "(mixed partitioners, or partition counts changed): joined here, counted once each",
    "join.misrouted": "requests decided incomplete, and feedback labels, with an input on "
    "another partition than murmur2 of its request id (a producer not using Kafka's default "
    "partitioner): its halves may be read by two replicas and each decided incomplete, a "
    "label unmatched",
    "join.rerouted": "input records read off the partition murmur2 of their request id puts "
    "them on (a producer not using Kafka's default partitioner), where another replica reads "
    "that partition: sent on to it so that their request's halves meet (join.reroute)",
    "join.rerouted_late": "records off their request's partition that came after its verdict "
    "(a rerouted copy sent twice, when a replica restarted before committing the original), "
    "and deltas after its final when its inputs came on several partitions: finished, not "
    "dead-lettered",
    "join.rereads": "records of already decided requests read again after a rebalance or "
    "restart: finished, not dead-lettered",
    "claims.refused": "answers decided with claims unavailable: their evidence index alone "
    "crossed max_request_bytes",
    "join.byte_evictions": "open requests evicted to stay under join.max_bytes",
    "feedback.unmatched": "feedback labels whose request was never decided here",
    "feedback.replaced": "feedback labels that replaced an earlier label of their request",
    "feedback.early": "feedback labels that came before their verdict and waited for it",
    "pipeline.internal_errors": "events that hit a bug in the pipeline: dead-lettered "
    "(internal-error) and logged",
    "kafka.backpressure_pauses": "times input fetching was paused because the processing "
    "queue was full",
    "join.clock_held_ms": "milliseconds (cumulative) the join's clock was held back while "
    "inputs were behind, so TTLs do not expire requests whose halves are still in Kafka",
    "coverage.evicted_keys": "coverage keys whose windows were dropped for a newer key past "
    "coverage.max_keys (a producer inventing tenants under tenancy.source=event)",
    "lookback.mismatches": "attention summaries the lookback model cannot score (another "
    "generator or shape): scored unavailable",
    "kafka.offset_resets": "input records gone before they were read (retention, delete-records)",
    "kafka.handover_skips": "input records skipped on assignment because their last owner had "
    "finished them (the handover in its commit's metadata)",
    "kafka.commit_fallbacks": "commits of a partition number whose handover did not fit the "
    "offset metadata: committed at a cut lowered until no request straddles it",
    "kafka.commit_holds": "commits left out because a handover did not fit where one was "
    "committed before: the last commit stands (the lag grows until it fits again)",
    "judge.calls": "LLM judge calls sent (claims the verifier left uncertain)",
    "judge.ok": "LLM judge calls that returned a usable label",
    "judge.failed": "LLM judge calls that failed (error, timeout, unusable reply, "
    "rate-limited): the verifier's label stands",
    "judge.late": "LLM judge replies not back when their answer was decided: the verifier's "
    "label stands",
    "judge.skipped": "LLM judge calls not sent: the answer's call budget spent, the breaker "
    "open, or the call pool saturated",
}
# the HELP text of each observed gauge (what waits in the sidecar, and what it stopped reading)
GAUGE_HELP: Final = {
    "queue.records": "consumed input records waiting for the processor",
    "queue.bytes": "bytes of the consumed input records waiting for the processor",
    "consumer.paused_partitions": "input partitions this instance has paused "
    "(backpressure: the processing queue is full; alignment: one input topic is ahead)",
    "judge.breaker_open": "1 while the LLM judge is not called (failures in a row, or it "
    "asked for a pause with 429 / Retry-After), else 0",
    "ready": "1 while /readyz answers 200 (broker reached, inputs co-partitioned, publishing "
    "and processing keep up, group joined), else 0",
    "live": "1 while /livez answers 200 (no fatal publish error, the consumer not failing, "
    "the processor not wedged), else 0",
}
MAX_KEY_SERIES: Final = 100  # metrics.max_key_series
_V = TypeVar("_V")


def bounded_keys(
    values: Mapping[str, _V], limit: int, alarming: Callable[[_V], bool]
) -> dict[str, _V]:
    """At most ``limit`` of ``values``' keys: alarming ones first, then the calibrations'
    own keys before tenants' ``global[...]`` windows, then by name (the same keys from one
    scrape to the next)."""
    if len(values) <= limit:
        return dict(values)
    order = sorted(values, key=lambda k: (not alarming(values[k]), "[" in k, k))
    return {k: values[k] for k in order[:limit]}


class _Discarded:
    """Stage durations when no meter reads them (the API's no-op meter)."""

    def record(self, stage: str, seconds: float) -> None:
        del stage, seconds


_NO_STAGE_DURATIONS: Final = _Discarded()


@dataclass(slots=True)
class PublishHandle:
    """The open spans of one output between handing it to the producer and its confirmation.

    Without recorded spans (no tracer provider installed) both are ``None``, and a
    sampled-out verdict has no producer span; ``traced`` says the output is a
    request's verdict, whose publish is timed.
    """

    producer: Span | None
    request: Span | None
    request_end_ns: int  # wall clock (epoch ns)
    started_ns: int  # monotonic ns: the publish stage is timed from it
    traced: bool = False
    # a verdict or claim verdict: counted once the broker confirms it (not a dead letter
    # that replaced it)
    counted: tuple[Output, TraceRecord] | None = None


class Telemetry:
    """Opens the loop's messaging spans, exports the processor's trace records, counts."""

    def __init__(
        self,
        tracer: Tracer | None = None,
        meter: metrics.Meter | None = None,
        *,
        spans: bool = True,
        stage_spans: bool = True,
        stage_durations: StageDurations | None = None,
        keyed_gauges: KeyedGauges | None = None,
    ) -> None:
        """``spans=False``: no tracer records them, so none is opened; the verdicts'
        headers still carry the inputs' trace context, as the API's no-op tracer
        propagates it. ``stage_spans=False``: a traced verdict's stages become
        attributes of its request span instead of child spans. ``stage_durations``:
        where stage durations go instead of the meter's histogram (see
        :meth:`from_setup`). ``keyed_gauges``: where the per-calibration-key gauges go
        instead of the meter's observable gauges (our Prometheus and OTLP readers read
        it; the SDK would keep every key it ever saw)."""
        self.tracer = tracer or trace.get_tracer(SCOPE, __version__)
        self.meter = meter or metrics.get_meter(SCOPE, __version__)
        self.spans = spans
        self.stage_spans = stage_spans
        # per-verdict counts: plain dicts (written on the loop's thread), read at collection
        self._verdicts: dict[tuple[str, str, str], int] = {}
        self._reasons: dict[tuple[str, str], int] = {}
        self._claims: dict[str, int] = {}
        self.meter.create_observable_counter(
            "guardrail.verdicts",
            [_observed(self._verdicts, ("decision", "profile", "stage"))],
            unit="{verdict}",
            description="answer verdicts, one per verdict (stage: stream or final)",
        )
        self.meter.create_observable_counter(
            "guardrail.verdict.reasons",
            [_observed(self._reasons, ("reason", "decision"))],
            unit="{reason}",
            description="reasons given by answer verdicts, one per reason",
        )
        self.meter.create_observable_counter(
            "guardrail.claim_verdicts",
            [_observed(self._claims, ("label",))],
            unit="{verdict}",
            description="claim verdicts",
        )
        self.dead_letters = self.meter.create_counter(
            "guardrail.dead_letters", unit="{message}", description="DLQ messages"
        )
        self.stage_duration: metrics.Histogram | None = None
        if stage_durations is None:
            self.stage_duration = self.meter.create_histogram(
                INSTRUMENT,
                unit="s",
                description=DESCRIPTION,
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
            )
            stage_durations = OtelStageDurations(self.stage_duration)
        self.stage_durations = stage_durations
        self.keyed_gauges = keyed_gauges
        self.publish_retries = self.meter.create_counter(
            "guardrail.publish.retries", unit="{retry}"
        )
        self.producer_resets = self.meter.create_counter(
            "guardrail.publish.producer_resets", unit="{reset}"
        )

    @classmethod
    def from_setup(cls, setup: TelemetrySetup, *, stage_spans: bool = True) -> Telemetry:
        """As the sidecar runs: spans only when a tracer provider records them; stage
        durations in the plain histogram our Prometheus and OTLP readers read, in the
        SDK's when another meter provider (or aggregation) reads them, or nowhere; the
        per-key gauges where our readers read them, else on the meter."""
        if setup.stage_durations is not None:
            durations: StageDurations | None = setup.stage_durations
        elif setup.metrics:
            durations = None  # the meter's histogram
        else:
            durations = _NO_STAGE_DURATIONS
        return cls(
            spans=setup.tracing,
            stage_spans=stage_spans,
            stage_durations=durations,
            keyed_gauges=setup.keyed_gauges,
        )

    def observe(
        self,
        open_requests: Callable[[], int],
        evictions: Callable[[], int],
        lag: Callable[[], dict[tuple[str, int], int]],
    ) -> None:
        """Register the observable instruments (read at collection time, not per message).

        ``evictions`` is cumulative (an observable counter); open requests and the
        consumer lag are gauges.
        """

        def _one(fn: Callable[[], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _options: [Observation(fn())]

        def _lag(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(v, {"topic": t, "partition": p}) for (t, p), v in lag().items()]

        self.meter.create_observable_gauge(
            "guardrail.join.open_requests", [_one(open_requests)], unit="{request}"
        )
        self.meter.create_observable_counter(
            "guardrail.join.evictions", [_one(evictions)], unit="{request}"
        )
        self.meter.create_observable_gauge("guardrail.consumer.lag", [_lag], unit="{message}")

    @contextmanager
    def consuming(self, records: Sequence[ConsumedRecord], group: str) -> Iterator[Span]:
        """The CONSUMER span of one handled poll; current while the block runs.

        Linked to each record's producer context (its ``traceparent``); a lone
        record's producer context is also its parent. Without recorded spans, none
        (reading every record's context for links costs ~2 us a record).
        """
        if not self.spans:
            yield trace.INVALID_SPAN
            return
        topics = sorted({r.topic for r in records})
        attributes: dict[str, AttributeValue] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": group,
        }
        if len(topics) == 1:
            attributes["messaging.destination.name"] = topics[0]
        if len(records) == 1:
            attributes.update(_record_attributes(records[0]))
        else:
            attributes["messaging.batch.message_count"] = len(records)
        links = []
        for record in records:
            carrier = _carrier(record.headers or ())
            context = trace.get_current_span(extract(carrier)).get_span_context()
            if context.is_valid:
                links.append(Link(context, _record_attributes(record)))
        parent = extract(_carrier(records[0].headers or ())) if len(records) == 1 else None
        name = f"process {topics[0]}" if len(topics) == 1 else "process"
        with self.tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes, links=links
        ) as span:
            yield span

    def dead_lettered(self, out: Output) -> None:
        """Count a dead letter by its ``x-dlq-reason`` (``before_publish`` does; so does the
        publisher for one that replaces an output whose span was already open)."""
        reason = out.header("x-dlq-reason") or b"unknown"
        self.dead_letters.add(1, {"reason": reason.decode("utf-8", errors="replace")})

    def before_publish(self, out: Output, topic: str) -> PublishHandle:
        """Open the output's spans (PRODUCER ``send <topic>``); traced outputs' headers
        get the PRODUCER span's context."""
        if out.destination is Destination.DLQ:
            self.dead_lettered(out)
        handle = self._open(out, topic)
        if out.trace is not None:
            handle.counted = (out, out.trace)
        return handle

    def _open(self, out: Output, topic: str) -> PublishHandle:
        record = out.trace
        now, started = time.time_ns(), time.monotonic_ns()
        if record is not None:  # monotonic times: a step of the wall clock times no stage
            for stage, start, end in record.stages:
                self.stage_durations.record(stage, (end - start) / 1e9)
        if not self.spans:
            if record is not None and record.parent:  # no parent: nothing to inject (~2 us)
                self._propagate(out, extract(_carrier(record.parent)))
            return PublishHandle(None, None, now, started, traced=record is not None)
        producing: dict[str, AttributeValue] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.destination.name": topic,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if out.key is not None:
            producing["messaging.kafka.message.key"] = _key_text(out.key)
        if record is None:  # a child of the consumer span, if any; headers untouched
            producer = self.tracer.start_span(
                f"send {topic}", kind=SpanKind.PRODUCER, attributes=producing
            )
            return PublishHandle(producer, None, now, started)
        wall = now - started  # the record's monotonic times as wall-clock times, from now
        parent = extract(_carrier(record.parent))
        consumer = trace.get_current_span().get_span_context()
        links = [Link(consumer)] if consumer.is_valid else []
        for headers in record.links:  # inputs written under other traces (a retrieval's)
            linked = trace.get_current_span(extract(_carrier(headers))).get_span_context()
            if linked.is_valid:
                links.append(Link(linked))
        request = self.tracer.start_span(
            record.name,
            context=parent,
            start_time=record.start_ns + wall,
            attributes=record.attributes,
            links=links or None,
        )
        ctx = trace.set_span_in_context(request, parent)
        if not request.is_recording():  # sampled out: its children would be too (~4 us each)
            self._propagate(out, ctx)
            return PublishHandle(None, request, record.end_ns + wall, started, traced=True)
        if self.stage_spans:
            for stage, start, end in record.stages:
                self.tracer.start_span(
                    f"guardrail.{stage}", context=ctx, start_time=start + wall
                ).end(end + wall)
        else:  # ~15 us a child span; an attribute is a dict entry
            request.set_attributes(
                {
                    f"guardrail.stage.{stage}.duration_ms": (end - start) / 1e6
                    for stage, start, end in record.stages
                }
            )
        producer = self.tracer.start_span(
            f"send {topic}", context=ctx, kind=SpanKind.PRODUCER, attributes=producing
        )
        self._propagate(out, trace.set_span_in_context(producer, ctx))
        return PublishHandle(producer, request, record.end_ns + wall, started, traced=True)

    @staticmethod
    def _propagate(out: Output, context: Context) -> None:
        """Write ``context`` into the output's headers (replacing what it had of those keys).

        Without a recording tracer the API's spans carry their parent's context, so
        the inputs' extracted context is what a verdict's headers get either way."""
        carrier: dict[str, str] = {}
        inject(carrier, context=context)
        out.headers[:] = [(k, v) for k, v in out.headers if k not in carrier] + [
            (k, v.encode("utf-8")) for k, v in carrier.items()
        ]

    def after_publish(
        self, handle: PublishHandle, metadata: Any = None, published: Output | None = None
    ) -> None:
        """The broker confirmed the record (``metadata``: aiokafka's ``RecordMetadata``):
        ``published``, the output the handle was opened for unless a dead letter replaced
        it (then the verdict it stands for is not counted)."""
        now = time.time_ns()
        answered = 0
        if handle.counted is not None:
            out, record = handle.counted
            if published is None or published.destination is out.destination:
                self._count(out, record)
                answered = record.answered_ns
        if handle.traced:
            self.stage_durations.record("publish", (time.monotonic_ns() - handle.started_ns) / 1e9)
        # the producer's clock may be ahead of this one: never below 0; a stamp far off is
        # no measurement (see ANSWER_AHEAD_MAX_NS)
        if answered > 0 and -ANSWER_AHEAD_MAX_NS <= now - answered <= ANSWER_AGE_MAX_NS:
            self.stage_durations.record("answer_to_verdict", max(0, now - answered) / 1e9)
        producer = handle.producer
        if producer is not None:
            partition = getattr(metadata, "partition", None)
            offset = getattr(metadata, "offset", None)
            if isinstance(partition, int):
                producer.set_attribute("messaging.destination.partition.id", str(partition))
            if isinstance(offset, int):
                producer.set_attribute("messaging.kafka.offset", offset)
            producer.end(now)
        if handle.request is not None:  # a sampled-out request span has no producer child
            handle.request.end(max(handle.request_end_ns, now))

    def observe_counts(self, counts: Callable[[], dict[str, int]]) -> None:
        """Cumulative counts kept by the pipeline, as observable counters ``guardrail.<name>``
        (each with its :data:`COUNT_HELP` text)."""
        self._observe_each(counts, COUNT_HELP, self.meter.create_observable_counter)

    def observe_consumed(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        """Input records consumed, ``(topic, outcome) -> n`` (cumulative; the processor adds a
        batch's records once), as ``guardrail.consumer.records``."""

        def read(_options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(n, {"topic": topic, "outcome": outcome})
                for (topic, outcome), n in counts().items()
            ]

        self.meter.create_observable_counter(
            "guardrail.consumer.records",
            [read],
            unit="{record}",
            description="input records consumed, by topic and outcome (accepted, "
            "dead-lettered, duplicate: read again or re-sent identical)",
        )

    def observe_processor_cpu(self, seconds: Callable[[], float]) -> None:
        """The processor thread's CPU seconds (cumulative), as
        ``guardrail.processor.cpu_time``: against the process's own CPU, the share of it
        that goes to deciding rather than to the Kafka loop around it."""

        def read(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(seconds())]

        self.meter.create_observable_counter(
            "guardrail.processor.cpu_time",
            [read],
            unit="s",
            description="CPU seconds spent by the processor's thread (deciding, and the claim "
            "verifier on it); the process's CPU less this is the Kafka loop's",
        )

    def observe_gauges(self, gauges: Callable[[], dict[str, int]]) -> None:
        """Current levels kept by the loop, as observable gauges ``guardrail.<name>``
        (each with its :data:`GAUGE_HELP` text)."""
        self._observe_each(gauges, GAUGE_HELP, self.meter.create_observable_gauge)

    @staticmethod
    def _observe_each(
        values: Callable[[], dict[str, int]],
        help_texts: Mapping[str, str],
        create: Callable[..., object],
    ) -> None:
        """One observable instrument per name of ``values()``, read at each collection."""
        for name in values():

            def _read(_options: CallbackOptions, name: str = name) -> Iterable[Observation]:
                return [Observation(values().get(name, 0))]

            create(f"guardrail.{name}", [_read], description=help_texts.get(name, ""))

    def preset_verdicts(self, profiles: Iterable[str]) -> None:
        """A zero series for each decision of a final verdict under each profile (and
        ``none``), so that a rate or an alert on ``guardrail_verdicts_total`` reads 0, not
        nothing, before the first such verdict."""
        for decision in Decision:
            for profile in (*profiles, "none"):
                self._verdicts.setdefault((decision.value, profile, "final"), 0)

    def observe_monitor(
        self,
        statuses: Callable[[], dict[str, tuple[float, float, float, bool]]],
        max_keys: int = MAX_KEY_SERIES,
    ) -> None:
        """The rolling mean(m1) monitor per calibration key: (mean, low, high, broken).

        At most ``max_keys`` keys get series of their own (broken ones first, then the
        calibrations' own keys, then tenants' ``global[...]`` windows): a key's tenant is
        producer text, and 5,000 tenants made 8,197 series, a 1.6 MB scrape, and pushed the
        real keys into the SDK's overflow series (audit). ``guardrail.retrieval.monitor_keys``
        counts every key by ``exported`` and ``broken``, so an alarm on broken keys holds
        whatever is cut."""
        gauges = (
            ("guardrail.retrieval.m1_mean", "rolling mean(m1) of the key's certified retrievals"),
            ("guardrail.retrieval.m1_wilson_low", "lower end of the Wilson interval of m1_mean"),
            ("guardrail.retrieval.m1_wilson_high", "upper end of the Wilson interval of m1_mean"),
            (
                "guardrail.retrieval.exchangeability_broken",
                "1 when m1_wilson_high < 1 - alpha: recalibrate",
            ),
        )

        def read() -> KeyedValues:
            kept = bounded_keys(statuses(), max_keys, lambda v: bool(v[3]))
            return {
                name: {key: float(values[index]) for key, values in kept.items()}
                for index, (name, _) in enumerate(gauges)
            }

        self._observe_keyed(gauges, read)

        def _keys(_options: CallbackOptions) -> Iterable[Observation]:
            current = statuses()
            kept = bounded_keys(current, max_keys, lambda v: bool(v[3]))
            counts: Counter[tuple[bool, bool]] = Counter(
                (key in kept, bool(values[3])) for key, values in current.items()
            )
            return [
                Observation(counts[(exported, broken)], {
                    "exported": str(exported).lower(), "broken": str(broken).lower()
                })
                for exported in (True, False)
                for broken in (True, False)
            ]  # fmt: skip

        self.meter.create_observable_gauge(
            "guardrail.retrieval.monitor_keys",
            [_keys],
            description="calibration keys the m1 monitor watches, by whether they have series "
            "of their own (metrics.max_key_series) and whether exchangeability is broken",
        )

    def observe_coverage(
        self,
        reports: Callable[[], dict[str, dict[str, float | None]]],
        max_keys: int = MAX_KEY_SERIES,
    ) -> None:
        """The coverage bound per calibration key (the latest values of each quantity), for
        at most ``max_keys`` keys (violated ones first, as :meth:`observe_monitor`).

        ``reports()`` maps a calibration key to named values (``coverage``,
        ``coverage_low``, ``epsilon``, ``delta``, ``bound``, ``bound_high``,
        ``measured_hallucination``, ``violated``, ...); each name becomes the gauge
        ``guardrail.coverage.<name>``; a value that is ``None`` is not reported.
        """
        names = (
            "coverage",
            "coverage_low",
            "coverage_high",
            "epsilon",
            "epsilon_high",
            "delta",
            "delta_high",
            "bound",
            "bound_low",
            "bound_high",
            "measured_hallucination",
            "measured_hallucination_low",
            "measured_hallucination_high",
            "violated",
            "window_requests",
            "window_covered",
            "window_labelled_covered",
            "window_errors_covered",
            "window_labelled_uncovered",
            "window_errors_uncovered",
            "certificate_violated",  # certified allow re-tested on feedback (1: broken)
            "certificate_error",
            "certificate_error_high",
            "certificate_labelled",
        )

        def alarming(values: dict[str, float | None]) -> bool:
            return bool(values.get("violated") or values.get("certificate_violated"))

        def read() -> KeyedValues:
            kept = bounded_keys(reports(), max_keys, alarming)
            return {
                f"guardrail.coverage.{name}": {
                    key: float(value)
                    for key, values in kept.items()
                    if (value := values.get(name)) is not None
                }
                for name in names
            }

        self._observe_keyed(
            [
                (
                    f"guardrail.coverage.{name}",
                    f"coverage bound: {name.replace('_', ' ')} of the key's window "
                    "(docs/methods.md §Coverage bound)",
                )
                for name in names
            ],
            read,
        )

    def _observe_keyed(
        self, gauges: Sequence[tuple[str, str]], read: Callable[[], KeyedValues]
    ) -> None:
        """Per-key gauges (name, description) whose values ``read()`` gives: in
        :attr:`keyed_gauges` when our readers read them there, else as the meter's
        observable gauges (another meter provider's, or the API's no-op)."""
        if self.keyed_gauges is not None:
            self.keyed_gauges.add(gauges, read)
            return
        for name, description in gauges:

            def observe(_options: CallbackOptions, name: str = name) -> Iterable[Observation]:
                return [Observation(value, {LABEL: key}) for key, value in read()[name].items()]

            self.meter.create_observable_gauge(name, [observe], description=description)

    def _count(self, out: Output, record: TraceRecord) -> None:
        attrs = record.attributes
        if out.destination is Destination.VERDICTS:
            decision = str(attrs.get("guardrail.decision"))
            key = (
                decision,
                str(attrs.get("guardrail.profile", "none")),
                str(attrs.get("guardrail.stage", "final")),
            )
            self._verdicts[key] = self._verdicts.get(key, 0) + 1
            reasons = attrs.get("guardrail.reasons", [])
            for reason in reasons if isinstance(reasons, list) else [str(reasons)]:
                pair = (str(reason), decision)
                self._reasons[pair] = self._reasons.get(pair, 0) + 1
        elif out.destination is Destination.CLAIMS:
            label = str(attrs.get("guardrail.claim.label"))
            self._claims[label] = self._claims.get(label, 0) + 1
