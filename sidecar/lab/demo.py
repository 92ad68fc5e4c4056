"""The demo: a real Kafka broker, the sidecar as its own process, events, verdicts.

Starts a fresh single-node broker, creates the topics, starts ``guardrail run``
as a subprocess (exactly as a pod would), waits for its readiness endpoint,
replays the bundled recording and prints every verdict, claim verdict and dead
letter as it arrives; then stops the sidecar with SIGTERM and the broker.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import orjson
from aiokafka import AIOKafkaConsumer

from sidecar.config import Settings
from sidecar.contracts.codec import encode
from sidecar.contracts.events import DLQ_HEADER_PREFIX, FeedbackEvent
from sidecar.exceptions import ConfigError, SidecarNotReadyError
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port, lib_for
from sidecar.lab.replay import Record, load_file, send


def bundled_sample() -> Path:
    return Path(str(resources.files("sidecar.samples") / "demo_events.jsonl"))


def expected_request_ids(records: list[Record]) -> set[str]:
    """Requests that must each get a verdict: those with a valid-looking retrieval event."""
    ids = set()
    for r in records:
        if r.key is None:
            continue
        try:
            obj = orjson.loads(r.value)
        except orjson.JSONDecodeError:
            continue
        if (
            isinstance(obj, dict)
            and obj.get("event_type") == "retrieval"
            and obj.get("schema_version") == 1
        ):
            ids.add(r.key.decode())
    return ids


@dataclass
class DemoResult:
    decisions: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    claims: int = 0
    verdict_ids: set[str] = field(default_factory=set)
    coverage: dict[str, dict[str, Any]] = field(default_factory=dict)


REAL_QUESTIONS = Path("../shared/data/nq-open/nq-open-oracle.dev.jsonl.gz")
"""``--real``'s questions and passages: the shared data folder beside the checkout."""

REAL_QDRANT = Path("out/demo/qdrant")
"""``--real``'s embedded Qdrant (``out/`` is git-ignored): the corpus is embedded once."""

DEMO_PROBE = Path("models/confidence/report/leakage-probe.json")
"""The shipped leakage probe of SmolLM2 (docs/methods.md §Coverage bound) in a checkout."""


async def _flow(
    settings: Settings,
    records: list[Record],
    *,
    feedback: list[Record],
    expected: set[str],
    result: DemoResult,
    out: TextIO,
) -> None:
    """Replay, print verdicts as they come; then send the labels and print the coverage bound."""
    watcher = asyncio.create_task(_watch(settings, expected, result, out, 60))
    sent = await send(settings, records)
    _line(out, "[demo]", f"replayed {sent} messages for {len(expected)} requests")
    await watcher
    if feedback:
        # labels arrive after the verdicts, as they would from users or reviewers
        await send(settings, feedback)
        _line(out, "[demo]", f"sent {len(feedback)} feedback labels to {settings.topics.feedback}")
        await _watch(
            settings,
            expected,
            result,
            out,
            20,
            done=lambda: _labelled(result) >= len(feedback),
            topics=(settings.topics.reports,),
        )
    for report in result.coverage.values():
        _line(out, "[coverage]", _coverage_line(report))


# The demo's broker is its own, local and plaintext: a shell set up for the team's TLS or
# SASL cluster must not carry those settings to it (audit: the demo failed to connect).
_LOCAL_KAFKA: dict[str, object] = {
    "security_protocol": "PLAINTEXT",
    "sasl_mechanism": None,
    "sasl_username": None,
    "sasl_username_file": None,
    "sasl_password": None,
    "sasl_password_file": None,
    "ssl_cafile": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
    "ssl_key_password": None,
    "ssl_key_password_file": None,
}
# ... nor the section as one JSON variable, nor a replication factor its one node cannot hold
_CLUSTER_ONLY = (
    *(f"GUARDRAIL_KAFKA__{name.upper()}" for name in _LOCAL_KAFKA),
    "GUARDRAIL_KAFKA",
    "GUARDRAIL_TOPICS__REPLICATION_FACTOR",
)


def _sidecar_env(broker: LocalKafka, http_port: int, *, claims: bool) -> dict[str, str]:
    env = {
        **{k: v for k, v in os.environ.items() if k.upper() not in _CLUSTER_ONLY},
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "GUARDRAIL_HTTP__PORT": str(http_port),
        "GUARDRAIL_HTTP__HOST": "127.0.0.1",
        "GUARDRAIL_JOIN__TTL_MS": os.environ.get("GUARDRAIL_JOIN__TTL_MS", "3000"),
        "GUARDRAIL_COVERAGE__REPORT_INTERVAL_S": "1",
    }
    if claims:
        env["GUARDRAIL_SIGNALS__CLAIMS"] = "true"
    if DEMO_PROBE.exists() and "GUARDRAIL_COVERAGE__PROBE_FILE" not in env:
        env["GUARDRAIL_COVERAGE__PROBE_FILE"] = str(DEMO_PROBE)
    return env


def _labelled(result: DemoResult) -> int:
    return sum(int(r["measured_hallucination"]["trials"]) for r in result.coverage.values())


def _ci(est: dict[str, Any]) -> str:
    if est["value"] is None:
        return "n/a"
    return f"{est['value']:.2f} [{est['low']:.2f}, {est['high']:.2f}]"


def _coverage_line(r: dict[str, Any]) -> str:
    bound = (
        "n/a"
        if r["bound"] is None
        else f"{r['bound']:.2f} [{r['bound_low']:.2f}, {r['bound_high']:.2f}]"
    )
    cert = r.get("certificate")
    certificate = ""
    if cert is not None and cert["labelled"]:
        certificate = (
            f"; certified allow: {cert['errors']}/{cert['labelled']} labelled allows wrong "
            f"[{cert['error_low']:.2f}, {cert['error_high']:.2f}] vs risk {cert['risk']:g} "
            f"-> {cert['status']}"
        )
    by_stratum = ""
    if r.get("measured_by_stratum") is not None:
        by_stratum = (
            f" (by stratum {r['measured_by_stratum']:.2f} [{r['measured_by_stratum_low']:.2f}, "
            f"{r['measured_by_stratum_high']:.2f}])"
        )
    return (
        f"{r['calibration_key']}: requests={r['window_requests']} c={_ci(r['coverage'])} "
        f"eps={_ci(r['epsilon'])} delta={_ci(r['delta'])} ({r['delta_source']}) "
        f"bound H<={bound} measured H={_ci(r['measured_hallucination'])}{by_stratum} "
        f"-> {r['status']}" + certificate
    )


def _line(out: TextIO, tag: str, text: str) -> None:
    out.write(f"{tag:<9} {text}\n")
    out.flush()


async def _watch(
    settings: Settings,
    expected: set[str],
    result: DemoResult,
    out: TextIO,
    timeout_s: float,
    *,
    done: Callable[[], bool] | None = None,
    topics: tuple[str, ...] | None = None,
) -> None:
    t = settings.topics
    consumer = AIOKafkaConsumer(
        *(topics or (t.verdicts, t.claims, t.dlq, t.reports)),
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    deadline = time.monotonic() + timeout_s
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=250)
            # across topics, print in production order (a request's claim verdicts are
            # published before its answer verdict; equal timestamps: claims first)
            ordered = sorted(
                (m for records in batch.values() for m in records),
                key=lambda m: (m.timestamp, m.topic != t.claims),
            )
            for m in ordered:
                if m.topic != t.reports:  # reports keep coming; they do not count as traffic
                    quiet_since = time.monotonic()
                _show(
                    m.topic,
                    value=m.value,
                    headers=dict(m.headers),
                    settings=settings,
                    result=result,
                    out=out,
                )
            finished = done() if done is not None else expected <= result.verdict_ids
            if finished and time.monotonic() - quiet_since > 1.5:
                return
    finally:
        await consumer.stop()


def _show(
    topic: str,
    *,
    value: bytes,
    headers: dict[str, bytes],
    settings: Settings,
    result: DemoResult,
    out: TextIO,
) -> None:
    t = settings.topics
    if topic == t.dlq:
        h = {k: v.decode("utf-8", "replace") for k, v in headers.items()}
        reason = h.get(f"{DLQ_HEADER_PREFIX}reason", "?")
        result.dead_letters[reason] += 1
        _line(
            out,
            "[dlq]",
            f"{h.get(f'{DLQ_HEADER_PREFIX}request-id', '-'):<13} {reason}: "
            f"{h.get(f'{DLQ_HEADER_PREFIX}detail', '')[:90]}",
        )
        return
    obj = orjson.loads(value)
    if topic == t.reports:
        result.coverage[obj["calibration_key"]] = obj
        return
    if topic == t.claims:
        result.claims += 1
        _line(
            out,
            "[claim]",
            f"{obj['request_id']:<13} #{obj['claim_index']} {obj['label'].upper():<11} "
            f"{obj['score']:.2f}  {obj['text'][:70]}",
        )
        return
    result.decisions[obj["decision"]] += 1
    result.verdict_ids.add(obj["request_id"])
    reasons = ",".join(r["code"] for r in obj["reasons"] if not r["code"].startswith("profile."))
    conf = obj.get("confidence")
    sig = obj["signals"]
    extra = ""
    if sig["retrieval"]["status"] == "ok":
        extra += f" trusted={len(sig['retrieval']['trusted_chunk_ids'])}"
    if sig["lookback"]["status"] == "ok":
        extra += f" p_factual={sig['lookback']['p_factual']:.2f}"
    if sig["claims"]["status"] == "ok":
        extra += f" reliability={sig['claims']['reliability']}"
    if obj.get("certified_risk") is not None:
        extra += f" certified_risk={obj['certified_risk']:g} (delta {obj['certified_delta']:g})"
    if obj.get("advice"):
        extra += f" advice=retrieve_again(best forecast {obj['advice']['best_forecast']:.2f})"
    _line(
        out,
        "[verdict]",
        f"{obj['request_id']:<13} {obj['decision'].upper():<7} reasons={reasons}"
        + (f" confidence={conf:.2f}" if conf is not None else "")
        + extra
        + f"  policy={obj['policy']}",
    )


def wait_http(
    url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float, every_s: float = 0.25
) -> None:
    """Wait until ``url`` answers 200; name ``what`` when ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SidecarNotReadyError(
                f"{what} exited with code {proc.returncode} before it was ready"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - local http only
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(every_s)
    raise SidecarNotReadyError(f"{what} was not ready within {timeout_s:.0f}s")


def real_records(settings: Settings, questions: Path, n: int, out: TextIO) -> list[Record]:
    """Events from the real RAG loop: Qdrant + MiniLM retrieval, SmolLM2 with the summariser."""
    from sidecar.lab.generator.service import demo_requests  # noqa: PLC0415 - the ml extra

    _line(
        out,
        "[demo]",
        f"real generator: SmolLM2-135M answers {n} held-out questions from {questions}",
    )
    records = []
    for req in demo_requests(questions, n=n, threads=1, qdrant_path=REAL_QDRANT):
        key = req.request_id.encode()
        for event in req.events:
            topic = (
                settings.topics.retrieval
                if event.event_type == "retrieval"
                else settings.topics.generation
            )
            records.append(Record(topic, key, encode(event)))
        label = FeedbackEvent(
            request_id=req.request_id, correct=req.correct, source="nq-open-label"
        )
        records.append(Record(settings.topics.feedback, key, encode(label)))
        gold = "/".join(req.gold_answers[:2])
        _line(
            out,
            "[answer]",
            f"{req.request_id:<13} {req.final.answer.strip()[:70]!r} gold={gold!r} "
            f"correct={req.correct}",
        )
    return records


def run_demo(
    sample: Path | None = None,
    out: TextIO = sys.stdout,
    *,
    keep: bool = False,
    real: int = 0,
    questions: Path | None = None,
    claims: bool = False,
) -> int:
    started = time.monotonic()
    # what to replay is read before anything starts: a wrong path or line costs no broker
    sample_records = [] if real else load_file(sample or bundled_sample(), Settings.load())
    if real and questions is not None and not questions.is_file():
        raise ConfigError(f"--questions {questions}: no such file")
    if real and questions is None and not REAL_QUESTIONS.is_file():
        raise ConfigError(
            f"--real reads the NQ-open questions and passages at {REAL_QUESTIONS} (the "
            "shared data folder beside the checkout, see README: Data); it is not there "
            f"(from {Path.cwd()}): run from the checkout or give --questions FILE"
        )
    home = default_home()
    lib = ensure_jars(lib_for(home))
    home.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="demo-", dir=home))
    broker = LocalKafka(workdir / "broker", lib, port=free_port(), controller_port=free_port())
    sidecar: subprocess.Popen[bytes] | None = None
    try:
        _line(
            out,
            "[demo]",
            f"starting Apache Kafka (KRaft, single node) on {broker.bootstrap_servers}",
        )
        broker.start()
        http_port = free_port()
        env = _sidecar_env(broker, http_port, claims=claims)
        settings = Settings.load(
            kafka={"bootstrap_servers": broker.bootstrap_servers, **_LOCAL_KAFKA},
            topics={"replication_factor": 1},
        )
        created = asyncio.run(create_topics(settings))
        _line(out, "[demo]", f"topics: {', '.join(created)}")
        log_path = workdir / "sidecar.log"
        with log_path.open("wb") as log:
            sidecar = subprocess.Popen(
                [sys.executable, "-m", "sidecar", "run"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_http(f"http://127.0.0.1:{http_port}/readyz", sidecar, "the sidecar", 60)
        _line(out, "[demo]", f"sidecar ready (pid {sidecar.pid}, health on 127.0.0.1:{http_port})")
        if real:
            path = questions or REAL_QUESTIONS
            records = real_records(settings, path, real, out)
        else:
            records = sample_records
        expected = expected_request_ids(records)
        feedback = [r for r in records if r.topic == settings.topics.feedback]
        records = [r for r in records if r.topic != settings.topics.feedback]
        result = DemoResult()

        asyncio.run(
            _flow(settings, records, feedback=feedback, expected=expected, result=result, out=out)
        )
        missing = expected - result.verdict_ids
        _line(
            out,
            "[summary]",
            f"verdicts={sum(result.decisions.values())} {dict(result.decisions)} "
            f"claims={result.claims} "
            f"dead_letters={sum(result.dead_letters.values())} {dict(result.dead_letters)} "
            f"missing={sorted(missing)} elapsed={time.monotonic() - started:.1f}s",
        )
        return 0 if not missing else 1
    finally:
        if sidecar is not None and sidecar.poll() is None:
            sidecar.send_signal(signal.SIGTERM)
            try:
                sidecar.wait(timeout=30)
            except subprocess.TimeoutExpired:
                sidecar.kill()
        broker.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
