"""The sidecar process exports its spans and metrics over OTLP to a receiver on loopback.

Two receivers, as a collector has: OTLP/HTTP (POST /v1/traces and /v1/metrics,
protobuf) and OTLP/gRPC (the TraceService and MetricsService from
``opentelemetry-proto`` served by ``grpcio``). The sidecar picks the protocol from
``OTEL_EXPORTER_OTLP_PROTOCOL``, as the chart sets it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from sidecar.config import TOPIC_ROLES
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.lab.replay import Record, send
from sidecar.stage_durations import DURATION_BUCKETS_S, INSTRUMENT, SCOPE
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import settings_for, wait_until

pytestmark = pytest.mark.connected


class HttpReceiver(ThreadingHTTPServer):
    spans: list[Any]
    metrics: list[tuple[str, Any]]


@dataclass
class Receiver:
    """An OTLP receiver on loopback: the exporter's protocol and endpoint, the spans it
    got and the metrics (with their scope's name)."""

    protocol: str
    endpoint: str = ""
    spans: list[Any] = field(default_factory=list)
    metrics: list[tuple[str, Any]] = field(default_factory=list)

    def stage_points(self) -> dict[str, Any]:
        """The newest ``guardrail.stage.duration`` point per stage."""
        points = {}
        for scope, metric in list(self.metrics):
            if metric.name == INSTRUMENT:
                assert scope == SCOPE
                for point in metric.histogram.data_points:
                    stage = {a.key: a.value.string_value for a in point.attributes}["stage"]
                    points[stage] = point
        return points


def _keep_metrics(request: ExportMetricsServiceRequest, into: list[tuple[str, Any]]) -> None:
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            into.extend((sm.scope.name, m) for m in sm.metrics)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, spans: list[Any]) -> None:
        self.spans = spans

    def Export(
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        del context
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
        return ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, metrics: list[tuple[str, Any]]) -> None:
        self.metrics = metrics

    def Export(
        self, request: ExportMetricsServiceRequest, context: Any
    ) -> ExportMetricsServiceResponse:
        del context
        _keep_metrics(request, self.metrics)
        return ExportMetricsServiceResponse()


class _Handler(BaseHTTPRequestHandler):
    server: HttpReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    self.server.spans.extend(ss.spans)
        elif self.path == "/v1/metrics":
            metrics = ExportMetricsServiceRequest()
            metrics.ParseFromString(body)
            _keep_metrics(metrics, self.server.metrics)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    with serving(request.param) as got:
        yield got


@contextmanager
def serving(protocol: str) -> Iterator[Receiver]:
    """An OTLP receiver for ``protocol`` (``grpc`` or ``http/protobuf``) on loopback."""
    got = Receiver(protocol)
    if got.protocol == "grpc":
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        service = _TraceService(got.spans)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            service, server
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsService(got.metrics), server
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        got.endpoint = f"http://127.0.0.1:{port}"
        yield got
        server.stop(grace=None)
        return
    http = HttpReceiver(("127.0.0.1", 0), _Handler)
    http.spans = got.spans
    http.metrics = got.metrics
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    got.endpoint = f"http://127.0.0.1:{http.server_address[1]}"
    yield got
    http.shutdown()
    http.server_close()


@pytest.mark.parametrize("stage_spans", [True, False], ids=["stage-spans", "stage-attributes"])
async def test_spans_reach_an_otlp_receiver_with_the_llm_span_as_parent(
    stage_spans: bool,
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    receiver: Receiver,
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    env = {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        "GUARDRAIL_KAFKA__GROUP_ID": unique_topics["group"],
        **{f"GUARDRAIL_TOPICS__{n.upper()}": unique_topics[n] for n in TOPIC_ROLES},
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": receiver.protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        "OTEL_SERVICE_NAME": "guardrail-test",
        "GUARDRAIL_TRACING__STAGE_SPANS": str(stage_spans).lower(),
    }
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    await asyncio.to_thread(sidecar.start)
    trace_id, llm_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    header = [("traceparent", f"00-{trace_id}-{llm_span}-01".encode())]
    await send(
        settings,
        [
            Record(t.retrieval, b"req-otlp", dumps(retrieval_event("req-otlp")), header),
            Record(t.generation, b"req-otlp", dumps(final_event("req-otlp")), header),
        ],
    )
    await wait_until(
        lambda: any(s.name.startswith("send ") for s in receiver.spans), 30, "exported spans"
    )
    await wait_until(lambda: "publish" in receiver.stage_points(), 30, "exported stage durations")
    assert sidecar.signal(signal.SIGTERM) == 0
    spans = {s.name: s for s in receiver.spans}
    root = spans["guardrail.request"]
    assert root.trace_id.hex() == trace_id
    assert root.parent_span_id.hex() == llm_span
    attributes = {a.key: a.value.string_value for a in root.attributes}
    assert attributes["guardrail.request_id"] == "req-otlp"
    assert attributes["guardrail.decision"] in {"allow", "caveat", "block"}
    assert attributes["guardrail.policy"] == "default/1"
    assert spans[f"send {t.verdicts}"].parent_span_id == root.span_id
    stage_children = {"guardrail.join", "guardrail.certify", "guardrail.policy"}
    stage_attributes = {
        a.key: a.value.double_value for a in root.attributes if a.key.startswith("guardrail.stage.")
    }
    if stage_spans:
        for child in stage_children:
            assert spans[child].parent_span_id == root.span_id, child
        assert stage_attributes == {}
    else:  # the stages' durations on the request span instead
        assert not stage_children & spans.keys()
        assert {f"guardrail.stage.{s}.duration_ms" for s in ("join", "certify", "policy")} <= (
            stage_attributes.keys()
        )
        assert all(v >= 0 for v in stage_attributes.values())
    # the stage histogram (the plain one, added to the OTLP exporter's batches) arrived
    # beside the SDK's own metrics, shaped as the SDK's histogram: one record per stage
    stages = receiver.stage_points()
    assert {"join", "certify", "policy", "publish"} <= stages.keys()
    for stage, point in stages.items():
        assert point.count == 1 == sum(point.bucket_counts), stage
        assert tuple(point.explicit_bounds) == DURATION_BUCKETS_S, stage
        assert point.min == point.max == point.sum > 0, stage
        assert point.start_time_unix_nano <= point.time_unix_nano, stage
    assert any(
        scope == SCOPE and metric.name == "guardrail.verdicts" for scope, metric in receiver.metrics
    )
    # the per-key gauges (read outside the SDK, added to the batches the same way): the
    # request's calibration key, as the SDK's observable gauge sent it
    broken = [
        point
        for scope, metric in receiver.metrics
        if scope == SCOPE and metric.name == "guardrail.retrieval.exchangeability_broken"
        for point in metric.gauge.data_points
    ]
    assert broken, "no guardrail.retrieval.exchangeability_broken point"
    assert {a.key for p in broken for a in p.attributes} == {"calibration_key"}
    assert {p.as_double for p in broken} <= {0.0, 1.0}
