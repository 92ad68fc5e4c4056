"""``make image-check``: the built image, run the way the Helm chart runs it.

Reads the guardrail container of ``helm template`` (the chart's defaults) and
turns it into ``podman run`` options: its ``args``, its ``env`` (resolved as the
kubelet does), its user and read-only root filesystem, its ``/tmp`` emptyDir
(a tmpfs of the same size), its dropped capabilities and its memory limit.
Then, against the image:

1. ``guardrail --version`` and the version label match pyproject.toml;
2. the installed distributions (what ``pip list`` would say; the runtime venv
   has no pip) hold none of the training stack, and torch / transformers cannot
   be found by the interpreter;
3. ``guardrail run --check`` with ``--network none`` exits 0 with the models
   the chart expects at ``/models``;
4. with ``--network host`` against the project's real broker (started here on
   free loopback ports): ready, the image's HEALTHCHECK command passes, the demo
   recording is replayed from the host, and every request gets its verdict and
   every broken message its dead letter - the same reasons the package's own
   decoder gives on the host - read from the host; then SIGTERM stops it cleanly.

Only the broker address, the HTTP / Prometheus ports (host networking shares
the host's ports) and the join TTL (as ``guardrail demo`` sets it, so the
request that never finishes is evicted within seconds) are changed from the
chart's environment; the run prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiokafka import AIOKafkaConsumer

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind, decode_input
from sidecar.contracts.events import DLQ_HEADER_PREFIX
from sidecar.exceptions import InputError
from sidecar.kafka.topics import create_topics
from sidecar.lab.demo import bundled_sample, expected_request_ids
from sidecar.lab.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port, lib_for
from sidecar.lab.replay import Record, load_file, send
from tests.deploy.test_kubernetes_start import Workload, container_env, guardrail_workloads
from tests.deploy.test_runtime_image import FORBIDDEN_DISTRIBUTIONS, FORBIDDEN_MODULES

READY_TIMEOUT_S = 120.0
VERDICT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30
# As `guardrail demo`: the recording's unfinished request is evicted after this.
JOIN_TTL_MS = "3000"

# Lists the image's distributions and looks for the forbidden modules, inside it.
_INVENTORY = """
import importlib.metadata, importlib.util, json, sys
dists = sorted({d.metadata["Name"].lower() for d in importlib.metadata.distributions()})
found = sorted(m for m in sys.argv[1].split(",") if importlib.util.find_spec(m) is not None)
print(json.dumps({"distributions": dists, "modules": found}))
"""


class CheckFailed(AssertionError):
    """The image does not behave as the chart expects."""


def say(tag: str, text: str) -> None:
    sys.stdout.write(f"{tag:<14} {text}\n")
    sys.stdout.flush()


def expect(ok: bool, what: str, detail: str = "") -> None:
    if not ok:
        raise CheckFailed(f"{what}{': ' + detail if detail else ''}")
    say("[ok]", what)


# ------------------------------------------------------------------ the chart


@dataclass(frozen=True)
class ChartContainer:
    """What the rendered chart asks of the container runtime."""

    args: list[str]
    env: dict[str, str]
    options: list[str]


def _memory(quantity: str) -> str:
    """A Kubernetes memory quantity (Mi, Gi, M, G or bytes) as podman's --memory value."""
    units = {"Ki": "k", "Mi": "m", "Gi": "g", "K": "k", "M": "m", "G": "g"}
    for suffix, unit in units.items():
        if quantity.endswith(suffix):
            return quantity[: -len(suffix)] + unit
    if quantity.isdigit():
        return quantity
    raise CheckFailed(f"memory quantity {quantity!r} is not modelled (Ki/Mi/Gi/K/M/G or bytes)")


def chart_container(rendered: Path) -> ChartContainer:
    manifests = [m for m in yaml.safe_load_all(rendered.read_text()) if m]
    workloads = [w for w in guardrail_workloads(manifests) if w.name.startswith("Deployment/")]
    if len(workloads) != 1:
        raise CheckFailed(f"expected one guardrail Deployment in {rendered}, got {workloads}")
    workload: Workload = workloads[0]
    container = workload.container
    context = workload.pod.get("securityContext", {}) | container.get("securityContext", {})
    options = [f"--user={context['runAsUser']}:{context['runAsGroup']}"]
    if context.get("readOnlyRootFilesystem"):
        # and no writable /run, /var/tmp of podman's own: only the pod's volumes
        options += ["--read-only", "--read-only-tmpfs=false"]
    options += [f"--cap-drop={cap}" for cap in context.get("capabilities", {}).get("drop", [])]
    if context.get("allowPrivilegeEscalation") is False:
        options.append("--security-opt=no-new-privileges")
    if "memory" in container.get("resources", {}).get("limits", {}):
        options.append(f"--memory={_memory(container['resources']['limits']['memory'])}")
    volumes = {v["name"]: v for v in workload.pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" not in volume:
            raise CheckFailed(f"volume {volume} is not modelled by the image check")
        size = volume["emptyDir"].get("sizeLimit")
        options.append(
            f"--tmpfs={mount['mountPath']}:rw,mode=1777"
            + (f",size={_memory(size)}" if size else "")
        )
    return ChartContainer(list(container.get("args", [])), container_env(workload, {}), options)


# ----------------------------------------------------------------- podman


def podman(*args: str, timeout_s: float = 300, check: bool = True) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and done.returncode != 0:
        raise CheckFailed(
            f"podman {' '.join(args[:3])} ... exited {done.returncode}\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        )
    return done.stdout


def env_options(env: Mapping[str, str]) -> list[str]:
    return [f"--env={k}={v}" for k, v in env.items()]


# ------------------------------------------------------------ the steps


def check_version(image: str, version: str) -> None:
    out = podman(
        "run", "--rm", "--network=none", "--health-interval=disable", image, "--version"
    ).strip()
    expect(out == f"guardrail {version}", f"guardrail --version in the image: {out!r}")
    label = podman(
        "image",
        "inspect",
        "--format",
        '{{index .Labels "org.opencontainers.image.version"}}',
        image,
    ).strip()
    expect(label == version, f"image label org.opencontainers.image.version={label}")


def check_inventory(image: str) -> None:
    out = podman(
        "run",
        "--rm",
        "--network=none",
        "--health-interval=disable",
        "--entrypoint=python",
        image,
        "-c",
        _INVENTORY,
        ",".join(sorted(FORBIDDEN_MODULES)),
    )
    inventory = json.loads(out)
    dists = set(inventory["distributions"])
    forbidden = sorted(dists & FORBIDDEN_DISTRIBUTIONS)
    expect(
        not forbidden and not inventory["modules"],
        f"{len(dists)} distributions in the image, none of {sorted(FORBIDDEN_DISTRIBUTIONS)}",
        f"found {forbidden} {inventory['modules']}",
    )
    expect("pip" not in dists, "no pip in the runtime venv")


def check_offline(image: str, chart: ChartContainer) -> None:
    args = [a for a in chart.args if a != "--check"] + ["--check"]
    done = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--network=none",
            "--health-interval=disable",
            *chart.options,
            *env_options(chart.env),
            image,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    expect(
        done.returncode == 0 and '"config":"ok"' in report,
        f"guardrail {' '.join(args)} with --network none as the chart runs it: {report}",
        f"exit {done.returncode}\n{done.stderr[-3000:]}",
    )


def expected_dead_letters(records: Sequence[Record], settings: Settings) -> Counter[str]:
    """The reasons the package's own decoder gives for the recording's broken messages."""
    kinds = {
        settings.topics.retrieval: InputKind.RETRIEVAL,
        settings.topics.generation: InputKind.GENERATION,
        settings.topics.feedback: InputKind.FEEDBACK,
    }
    reasons: Counter[str] = Counter()
    for r in records:
        try:
            decode_input(
                kinds[r.topic],
                r.value,
                max_bytes=settings.limits.max_message_bytes,
                max_depth=settings.limits.max_json_depth,
            )
        except InputError as exc:
            reasons[exc.reason] += 1
    return reasons


@dataclass
class Outputs:
    verdicts: dict[str, dict[str, Any]]
    dead_letters: Counter[str]


async def read_outputs(
    settings: Settings, expected: set[str], dead: Counter[str], timeout_s: float
) -> Outputs:
    """Verdicts and dead letters from the host, until all expected ones are in."""
    t = settings.topics
    consumer = AIOKafkaConsumer(
        t.verdicts,
        t.dlq,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    out = Outputs({}, Counter())
    await consumer.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=250)
            for m in (m for records in batch.values() for m in records):
                if m.topic == t.dlq:
                    headers = dict(m.headers)
                    out.dead_letters[headers[f"{DLQ_HEADER_PREFIX}reason"].decode()] += 1
                else:
                    verdict = orjson.loads(m.value)
                    out.verdicts[verdict["request_id"]] = verdict
            if expected <= out.verdicts.keys() and sum(out.dead_letters.values()) >= dead.total():
                break
    finally:
        await consumer.stop()
    return out


def verdict_line(v: Mapping[str, Any]) -> str:
    reasons = ",".join(r["code"] for r in v["reasons"] if not r["code"].startswith("profile."))
    retrieval = v["signals"]["retrieval"]
    trusted = (
        f" trusted={len(retrieval['trusted_chunk_ids'])}" if retrieval["status"] == "ok" else ""
    )
    confidence = f" confidence={v['confidence']:.2f}" if v.get("confidence") is not None else ""
    return (
        f"{v['request_id']:<13} {v['decision'].upper():<7} reasons={reasons}{confidence}"
        f"{trusted}  policy={v['policy']}"
    )


def wait_ready(name: str, port: int, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        state = podman("inspect", "--format", "{{.State.Status}}", name).strip()
        if state != "running":
            raise CheckFailed(f"the container is {state} before it was ready:\n{logs(name)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.5)
    raise CheckFailed(f"not ready within {timeout_s:.0f}s:\n{logs(name)}")


def logs(name: str) -> str:
    return podman("logs", "--tail", "40", name, check=False)


def check_verdicts(settings: Settings, version: str) -> None:
    """Replay the demo recording from the host and read what the container published."""
    records = [
        r for r in load_file(bundled_sample(), settings) if r.topic != settings.topics.feedback
    ]
    expected = expected_request_ids(records)
    dead = expected_dead_letters(records, settings)
    sent = asyncio.run(send(settings, records))
    say("[replay]", f"{sent} messages of {bundled_sample().name}: {len(expected)} requests")
    out = asyncio.run(read_outputs(settings, expected, dead, VERDICT_TIMEOUT_S))
    for reason, n in sorted(out.dead_letters.items()):
        say("[dlq]", f"{reason} x{n}")
    for rid in sorted(out.verdicts):
        say("[verdict]", verdict_line(out.verdicts[rid]))
    missing = sorted(expected - out.verdicts.keys())
    expect(not missing, f"a verdict for each of the {len(expected)} requests", f"missing {missing}")
    expect(
        out.dead_letters == dead,
        f"dead letters as the package's decoder expects: {dict(dead)}",
        f"got {dict(out.dead_letters)}",
    )
    versions = {v["sidecar_version"] for v in out.verdicts.values()}
    expect(versions == {version}, f"verdicts come from sidecar {version}", str(versions))


def check_against_broker(image: str, chart: ChartContainer, version: str) -> None:
    home = default_home()
    lib = ensure_jars(lib_for(home))
    workdir = Path(tempfile.mkdtemp(prefix="image-check-", dir=home))
    broker = LocalKafka(workdir / "broker", lib, port=free_port(), controller_port=free_port())
    name = f"guardrail-image-check-{os.getpid()}"
    try:
        broker.start()
        say("[broker]", f"Apache Kafka (KRaft, single node) on {broker.bootstrap_servers}")
        overrides = {
            "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "GUARDRAIL_HTTP__PORT": str(free_port()),
            "GUARDRAIL_METRICS__PROMETHEUS_PORT": str(free_port()),
            "GUARDRAIL_JOIN__TTL_MS": JOIN_TTL_MS,
        }
        changed = {k: f"{chart.env.get(k, '(unset)')} -> {v}" for k, v in overrides.items()}
        say("[env]", f"the chart's env with {changed}")
        env = chart.env | overrides
        # The host side sees the topics exactly as the container does.
        for key in [k for k in os.environ if k.startswith("GUARDRAIL_")]:
            del os.environ[key]
        os.environ.update({k: v for k, v in env.items() if k.startswith("GUARDRAIL_")})
        settings = Settings.load()
        created = asyncio.run(create_topics(settings))
        say("[broker]", f"topics: {', '.join(created)}")

        started = time.monotonic()
        podman(
            "run",
            "--detach",
            f"--name={name}",
            "--network=host",
            "--health-interval=disable",  # no systemd timers here: run below, by hand
            *chart.options,
            *env_options(env),
            image,
            *chart.args,
        )
        port = int(overrides["GUARDRAIL_HTTP__PORT"])
        ready_s = wait_ready(name, port, READY_TIMEOUT_S)
        say("[container]", f"{name} ready in {ready_s:.1f}s (/readyz on 127.0.0.1:{port})")
        health = subprocess.run(
            ["podman", "healthcheck", "run", name],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        expect(
            health.returncode == 0,
            "the image's HEALTHCHECK command passes",
            health.stdout + health.stderr,
        )

        check_verdicts(settings, version)
        elapsed = time.monotonic() - started
        stats = podman("stats", "--no-stream", "--format", "{{.MemUsage}}", name, check=False)
        say("[container]", f"memory {stats.strip() or 'n/a'}; start to last verdict {elapsed:.1f}s")

        podman("stop", f"--time={STOP_TIMEOUT_S}", name, timeout_s=STOP_TIMEOUT_S + 30)
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).strip()
        expect(code == "0", "SIGTERM (podman stop) ends the sidecar with exit code 0", logs(name))
    except CheckFailed:
        sys.stderr.write(f"--- container log (last lines)\n{logs(name)}\n")
        raise
    finally:
        podman("rm", "--force", "--ignore", name, check=False)
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--image", required=True)
    parser.add_argument("--version", required=True, help="the package version (pyproject.toml)")
    parser.add_argument("--rendered", type=Path, required=True, help="helm template output")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        chart = chart_container(args.rendered)
        say("[chart]", f"args={chart.args} options={' '.join(chart.options)}")
        check_version(args.image, args.version)
        check_inventory(args.image)
        check_offline(args.image, chart)
        check_against_broker(args.image, chart, args.version)
    except CheckFailed as exc:
        sys.stderr.write(f"image-check FAILED: {exc}\n")
        return 1
    say("[image-check]", f"OK ({time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
