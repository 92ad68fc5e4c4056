"""``make demo-service``: broker + sidecar + reference service, three real questions, verdicts.

Starts a fresh single-node Kafka broker, creates the topics, starts ``guardrail
run`` and ``python -m examples.rag_service`` (SmolLM2) as processes, then asks
three held-out NQ-open questions over HTTP -- one per mode, as ``curl -N``
would -- and prints the streamed text, the verdict and what the user saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from examples.rag_service.__main__ import DEFAULT_CORPUS
from examples.rag_service.app import MODE_HEADER
from sidecar.config import Settings
from sidecar.kafka.topics import create_topics
from sidecar.lab.demo import wait_http
from sidecar.lab.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port, lib_for
from sidecar.lab.lookback.dataset import select_part
from sidecar.lab.retrieval.corpus import load_questions

MODES = ("stream", "hold", "hold")


def _say(tag: str, text: str) -> None:
    sys.stdout.write(f"{tag:<9} {text}\n")
    sys.stdout.flush()


def ask(base_url: str, question: str, mode: str) -> None:
    """One chat completion, printed as it streams (``curl -N`` style)."""
    body = {"stream": True, "messages": [{"role": "user", "content": question}]}
    _say(  # a command that works when copied
        "$",
        f"curl -N {base_url}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-H '{MODE_HEADER}: {mode}' -d {shlex.quote(json.dumps(body))}",
    )
    request = urllib.request.Request(  # noqa: S310 - local http only
        f"{base_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", MODE_HEADER: mode},
    )
    started = time.monotonic()
    shown, event = [], "message"
    with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310
        for raw in response:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: ") and line != "data: [DONE]":
                data = json.loads(line[len("data: ") :])
                if event == "guardrail.verdict":
                    sys.stdout.write("\n")
                    reasons = ",".join(r for r in data.get("reasons") or [] if "." not in r)
                    source = "" if data["source"] == "sidecar" else f" ({data['source']})"
                    _say(
                        "[verdict]",
                        f"{data['request_id']} {str(data['decision']).upper()}{source} "
                        f"reasons={reasons} after {time.monotonic() - started:.1f}s",
                    )
                    event = "message"
                else:
                    piece = data["choices"][0]["delta"].get("content")
                    if piece:
                        shown.append(piece)
                        sys.stdout.write(piece if shown[1:] else f"{'[shown]':<9} {piece}")
                        sys.stdout.flush()


def main() -> int:
    if not DEFAULT_CORPUS.is_file():  # before anything starts: a missing file costs no broker
        sys.stderr.write(
            f"demo-service: the NQ-open questions and passages are read from {DEFAULT_CORPUS} "
            f"(the shared data folder beside the checkout, see README: Data), and there is no "
            f"such file from {Path.cwd()}\n"
        )
        return 2
    home = default_home()
    lib = ensure_jars(lib_for(home))
    home.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="demo-service-", dir=home))
    broker = LocalKafka(workdir / "broker", lib, port=free_port(), controller_port=free_port())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _say("[demo]", f"starting Apache Kafka on {broker.bootstrap_servers}")
        broker.start()
        settings = Settings.load(kafka={"bootstrap_servers": broker.bootstrap_servers})
        asyncio.run(create_topics(settings))
        http_port, service_port = free_port(), free_port()
        env = {
            **os.environ,
            "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "GUARDRAIL_HTTP__HOST": "127.0.0.1",
            "GUARDRAIL_HTTP__PORT": str(http_port),
            "RAG_SERVICE_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "RAG_SERVICE_PORT": str(service_port),
        }
        for argv, log in (
            (["-m", "sidecar", "run"], "sidecar.log"),
            (["-m", "examples.rag_service", "--threads", "2"], "service.log"),
        ):
            with (workdir / log).open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, *argv], env=env, stdout=out, stderr=subprocess.STDOUT
                    )
                )
        wait_http(f"http://127.0.0.1:{http_port}/readyz", procs[0], "the sidecar", 90, 0.5)
        _say("[demo]", f"sidecar ready (pid {procs[0].pid})")
        base = f"http://127.0.0.1:{service_port}"
        _say("[demo]", "service loading SmolLM2 + MiniLM + Qdrant (first run embeds the corpus)")
        wait_http(f"{base}/healthz", procs[1], "the service", 600, 0.5)
        _say("[demo]", f"service ready on {base} (pid {procs[1].pid})")
        records = select_part(load_questions(DEFAULT_CORPUS), "eval", limit=len(MODES))
        for record, mode in zip(records, MODES, strict=True):
            ask(base, record.question, mode)
        return 0
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
