"""What publishing one traced verdict costs in telemetry, as the sidecar configures it (JSON).

Times :meth:`Telemetry.before_publish` + :meth:`Telemetry.after_publish` for a
final verdict with six stages and two reasons, the way the Kafka loop calls
them, each mode in its own child process:

* ``off``: as the sidecar starts without metrics or tracing (the API's no-op
  meter and tracer);
* ``on``: as the Helm chart starts it (Prometheus on: stage durations in the
  plain histogram ``/metrics`` reads);
* ``traced`` / ``sampled_out``: Prometheus on and the SDK's tracer, recording
  every verdict's spans (a batch span processor whose exporter drops them: the
  cost of a fast collector) / sampling every verdict out;
* ``traced_stage_attributes``: as ``traced`` with ``GUARDRAIL_TRACING__STAGE_SPANS=false``
  (the stages as attributes of the request span, not child spans);
* ``otlp_metrics``: Prometheus and an OTLP metric exporter (stage durations in
  the plain histogram both read, ``sidecar.local_metrics_otlp``; the exporter is
  never reached while timing).

Best of 5 rounds of 20,000 calls each. Not a timed test.

    PYTHONPATH=. .venv/bin/python bench/telemetry_cost.py --out bench/results/telemetry_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

CALLS = 20_000
ROUNDS = 5
MODES = {  # child mode -> the JSON's key
    "off": "us_per_verdict_metrics_off",
    "on": "us_per_verdict_metrics_on",
    "traced": "us_per_verdict_traced",
    "sampled_out": "us_per_verdict_sampled_out",
    "traced_stage_attributes": "us_per_verdict_traced_stage_attributes",
    "otlp_metrics": "us_per_verdict_otlp_metrics",
}
# an OTLP metric endpoint that is never reached while timing (the reader exports every 60 s)
UNREACHED_OTLP = "http://127.0.0.1:9/v1/metrics"
STAGES = ("join", "certify", "lookback", "confidence", "score", "policy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _record_spans(sampled: bool) -> None:
    """Install the SDK's tracer, batching spans to an exporter that drops them."""
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON  # noqa: PLC0415

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            del spans
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


def measure(
    prometheus_port: int | None, *, traced: bool | None = None, stage_spans: bool = True
) -> float:
    """µs per verdict (best round) in this process, telemetry configured as the sidecar does."""
    from sidecar.pipeline.outputs import Destination, Output, TraceRecord  # noqa: PLC0415
    from sidecar.telemetry import Telemetry  # noqa: PLC0415
    from sidecar.telemetry_setup import configure_from_env  # noqa: PLC0415

    if traced is not None:  # the SDK's tracer; True: every verdict sampled, False: none
        _record_spans(traced)

    telemetry = Telemetry.from_setup(configure_from_env(prometheus_port), stage_spans=stage_spans)
    now = time.monotonic_ns()  # a TraceRecord holds monotonic times, as the processor does
    stages = tuple((s, now + 1000 * i, now + 1000 * (i + 1)) for i, s in enumerate(STAGES))
    attributes: dict[str, str | bool | int | float | list[str]] = {
        "guardrail.request_id": "r-1",
        "guardrail.tenant": "",
        "guardrail.decision": "caveat",
        "guardrail.stage": "final",
        "guardrail.profile": "default",
        "guardrail.reasons": ["lookback-unavailable", "claims-not-configured"],
        "guardrail.policy": "default/1",
        "guardrail.model.generator": "smollm2",
    }
    parent = (("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)

    def one() -> None:
        record = TraceRecord("guardrail.request", parent, now, now + 9000, attributes, stages)
        out = Output(Destination.VERDICTS, b"r-1", b"{}", [("x-idempotency-key", b"k")], record)
        telemetry.after_publish(telemetry.before_publish(out, "rag.verdicts"))

    for _ in range(2_000):
        one()
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(CALLS):
            one()
        best = min(best, (time.perf_counter() - started) / CALLS * 1e6)
    return round(best, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/telemetry_cost.json"))
    parser.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        if args.child == "otlp_metrics":
            os.environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = UNREACHED_OTLP
        port = _free_port() if args.child != "off" else None
        traced = {"traced": True, "traced_stage_attributes": True, "sampled_out": False}.get(
            args.child
        )
        stage_spans = args.child != "traced_stage_attributes"
        sys.stdout.write(f"{measure(port, traced=traced, stage_spans=stage_spans)}\n")
        return 0
    result: dict[str, object] = {
        "machine": platform.machine(),
        "processor": platform.processor(),
        "calls_per_round": CALLS,
        "rounds": ROUNDS,
        "stages": len(STAGES),
        "reasons": 2,
    }
    for mode, key in MODES.items():
        child = subprocess.run(
            [sys.executable, __file__, "--child", mode],
            capture_output=True,
            text=True,
            check=True,
        )
        result[key] = float(child.stdout.strip())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
