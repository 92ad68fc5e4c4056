"""The sidecar process exports its spans over OTLP/HTTP to a receiver on loopback.

The receiver is a small OTLP/HTTP endpoint (POST /v1/traces, protobuf) that
decodes what the OpenTelemetry SDK's exporter sends, as a collector would.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sidecar.chaos.process import SidecarProcess
from sidecar.kafka.topics import create_topics
from sidecar.localkafka.broker import LocalKafka
from sidecar.replay import Record, send
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import settings_for, wait_until

pytestmark = pytest.mark.connected


class Receiver(ThreadingHTTPServer):
    spans: list[Any]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    self.server.spans.extend(ss.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(("127.0.0.1", 0), _Handler)
    server.spans = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


async def test_spans_reach_an_otlp_receiver_with_the_llm_span_as_parent(
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
        **{
            f"GUARDRAIL_TOPICS__{n.upper()}": unique_topics[n]
            for n in ("retrieval", "generation", "claims", "verdicts", "dlq", "feedback", "reports")
        },
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_SERVICE_NAME": "guardrail-test",
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
        lambda: any(s.name == "sidecar.publish" for s in receiver.spans), 30, "exported spans"
    )
    assert sidecar.signal(signal.SIGTERM) == 0
    spans = {s.name: s for s in receiver.spans}
    root = spans["sidecar.request"]
    assert root.trace_id.hex() == trace_id
    assert root.parent_span_id.hex() == llm_span
    attributes = {a.key: a.value.string_value for a in root.attributes}
    assert attributes["request_id"] == "req-otlp"
    assert attributes["decision"] in {"allow", "caveat", "block"}
    assert attributes["policy"] == "default/1"
    for child in ("sidecar.join", "sidecar.certify", "sidecar.policy", "sidecar.publish"):
        assert spans[child].parent_span_id == root.span_id, child
