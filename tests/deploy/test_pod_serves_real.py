"""The rendered pod serves, stops on SIGTERM and starts again (real broker, real process).

``test_kubernetes_start.py`` starts every rendering's container with ``run --check``:
configuration only, it connects to nothing. Here the Deployment of the chart's defaults,
values-dev and values-prod, and the container the example LLM chart injects into its own
Deployment, are started for real, the way that file builds them (the image's
``ENV``, the service links, the container's env, the mounts, uid 10001 through
``setpriv``, the ``/tmp`` emptyDir as working directory and HOME, the models and Secrets
read-only), against a real broker: the kubelet's probes on the chart's paths, requests in
and verdicts out, a SIGTERM that must end it with 0 inside the pod's
``terminationGracePeriodSeconds``, and a second start of the same pod that reads the
first one's verdicts back (the warm start) and matches labels sent afterwards to the
requests the first one decided. Nothing is written under the emptyDir.

What a cluster supplies is replaced, and nothing else: the broker's address (values-prod:
a SASL_SSL listener with SCRAM-SHA-512; its CA and credentials go into the files of the
Secrets the pod mounts), this test's topic names and group (one broker serves many
tests), the two listening ports (the pod has its own network namespace; the host does
not) and the OTLP collector's address (a receiver here).
"""

from __future__ import annotations

import asyncio
import re
import signal
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from sidecar.lab.replay import send
from tests.deploy.dockerfile import Dockerfile
from tests.deploy.podpython import pod_python
from tests.deploy.test_kubernetes_start import (
    DOCKERFILE,
    POD_TMP,
    build_filesystem,
    guardrail_workloads,
    pod_environment,
    pod_user,
    rendering,
)
from tests.deploy.tools import HELM_BUILD_TIMEOUT_S
from tests.kafka.harness import read_verdicts, wait_until
from tests.kafka.test_otlp import serving
from tests.kafka.test_scale_out import _settings
from tests.kafka.test_tls import PASSWORD as TLS_PASSWORD
from tests.kafka.test_tls import USER as TLS_USER
from tests.kafka.test_tls import TlsBroker, tls_broker  # noqa: F401 - fixture
from tests.kafka.test_warm_start_real import labels, requests

pytestmark = pytest.mark.connected

PARTITIONS = 3
TOPICS = ("retrieval", "generation", "claims", "verdicts", "dlq", "feedback", "reports")
N = 40


class Pod:
    """The container's process, started as the kubelet starts it (argv, env, cwd, uid)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.argv, self.env, self.cwd, self.log = argv, env, cwd, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,  # the pod's, and nothing of the test's
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def get(self, path: str, port_var: str = "GUARDRAIL_HTTP__PORT") -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.env[port_var]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except OSError:
            return -1, ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.kill()


def metrics(pod: Pod) -> dict[str, float]:
    """Each sample name's sum on the pod's Prometheus endpoint (empty: no answer)."""
    status, text = pod.get("/metrics", "GUARDRAIL_METRICS__PROMETHEUS_PORT")
    out: dict[str, float] = {}
    if status == 200:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def labelled(pod: Pod) -> float:
    """Labels counted in the pod's coverage windows (of covered and uncovered requests)."""
    seen = metrics(pod)
    return sum(
        seen.get(f"guardrail_coverage_window_labelled_{c}", 0.0) for c in ("covered", "uncovered")
    )


@pytest.fixture
def exits() -> Iterator[ExitStack]:
    """Context managers the test enters as it needs them, left at its end."""
    with ExitStack() as stack:
        yield stack


@dataclass(frozen=True)
class Cluster:
    """What the pod reaches and the test reaches of one broker, and the Secrets' files."""

    bootstrap: str  # the listener the rendering's security protocol speaks
    plain: str  # a PLAINTEXT listener of the same broker (topics, requests, verdicts)
    secrets: dict[str, str]  # a variable naming a mounted Secret's file -> its content


@pytest.fixture(params=["chart-defaults", "values-dev", "values-prod", "example-llm-service"])
def cluster(request: pytest.FixtureRequest) -> tuple[str, Cluster]:
    """A rendering and a broker for it: PLAINTEXT, or (values-prod) SASL_SSL with
    SCRAM-SHA-512 and the test CA, the credentials as files of the Secrets it mounts."""
    name = str(request.param)
    if name != "values-prod":
        broker: LocalKafka = request.getfixturevalue("kafka_broker")
        return name, Cluster(broker.bootstrap_servers, broker.bootstrap_servers, {})
    tls: TlsBroker = request.getfixturevalue("tls_broker")
    secrets = {
        "GUARDRAIL_KAFKA__SSL_CAFILE": (tls.certs / "ca.pem").read_text(),
        "GUARDRAIL_KAFKA__SASL_USERNAME_FILE": f"{TLS_USER}\n",
        "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE": f"{TLS_PASSWORD}\n",
    }
    return name, Cluster(tls.sasl_ssl, tls.broker.bootstrap_servers, secrets)


def fill(path: Path, content: str) -> None:
    """A mounted Secret's file (read-only, as the kubelet mounts it) given its content."""
    mode = path.stat().st_mode
    path.chmod(mode | stat.S_IWUSR)
    path.write_text(content)
    path.chmod(mode)


@pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + 300)
async def test_the_rendered_pod_serves_stops_on_sigterm_and_starts_warm(
    cluster: tuple[str, Cluster],
    helm: Path,
    example_chart: Path,
    pod_root: Path,
    unique_topics: dict[str, str],
    pods: list[Pod],
    exits: ExitStack,
) -> None:
    name, reach = cluster
    manifests = rendering(name, helm, example_chart)
    dockerfile = Dockerfile.read(DOCKERFILE)
    (workload,) = [w for w in guardrail_workloads(manifests) if w.name.startswith("Deployment/")]
    user = pod_user(workload, dockerfile)
    python = pod_python(user.argv_prefix, pod_root / "image")
    paths = build_filesystem(pod_root / "pod", workload, manifests, dockerfile, user)
    env = pod_environment(workload, manifests, dockerfile, paths, python)
    settings = _settings(reach.plain, unique_topics, PARTITIONS)
    t = settings.topics
    # as many servers as the chart lists (values-prod: three), the reachable one last and
    # the others down: a list of several never started before (FastStream took it as one)
    listed = env["GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS"].split(",")
    down = [f"127.0.0.1:{free_port()}" for _ in listed[1:]]
    replaced = {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": ",".join([*down, reach.bootstrap]),
        "GUARDRAIL_KAFKA__GROUP_ID": settings.kafka.group_id,
        **{
            f"GUARDRAIL_TOPICS__{topic.upper()}": getattr(t, topic)
            for topic in (*TOPICS, "certificates")
        },
        "GUARDRAIL_HTTP__PORT": str(free_port()),
        "GUARDRAIL_METRICS__PROMETHEUS_PORT": str(free_port()),
    }
    collector = None
    if "OTEL_EXPORTER_OTLP_ENDPOINT" in env:  # values-dev: the cluster's collector
        collector = exits.enter_context(serving(env["OTEL_EXPORTER_OTLP_PROTOCOL"]))
        replaced["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint
    for variable in replaced:  # each replaces one the chart sets: nothing is added
        assert variable in env, f"{name} does not set {variable}"
    env |= replaced
    for variable, content in reach.secrets.items():
        fill(Path(env[variable]), content)
    assert env["HOME"] == str(paths[POD_TMP])  # the image's HOME: the emptyDir
    await create_topics(settings)
    argv = [*user.argv_prefix, *python.argv, "-m", "sidecar", *workload.container["args"]]
    grace_s = float(workload.pod.get("terminationGracePeriodSeconds", 30))
    probes = {
        kind: workload.container[kind]["httpGet"]["path"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }

    async def started(pod: Pod) -> None:
        pod.start()
        pods.append(pod)

        def ready() -> bool:
            assert pod.alive(), f"the pod exited:\n{pod.tail()}"
            return all(pod.get(path)[0] == 200 for path in probes.values())

        await wait_until(ready, 60, f"{probes} to answer 200")

    async def stopped(pod: Pod) -> float:
        assert pod.proc is not None
        t0 = time.monotonic()
        pod.proc.send_signal(signal.SIGTERM)  # what the kubelet sends first
        code = await asyncio.to_thread(pod.proc.wait, grace_s + 5)
        took = time.monotonic() - t0
        assert code == 0, f"exit {code} after SIGTERM:\n{pod.tail()}"
        assert took < grace_s, f"{took:.1f} s after SIGTERM (grace {grace_s:g} s)"
        return took

    logs = pod_root / "logs"
    logs.mkdir()
    first = Pod(argv, env, paths[POD_TMP], logs / "first.log")
    await started(first)
    assert first.proc is not None and Path(f"/proc/{first.proc.pid}").stat().st_uid == user.uid
    await send(settings, requests(settings, "before", N, trusted=True))
    verdicts = await read_verdicts(settings, N, timeout_s=60)
    finals = {v["request_id"]: v for v in verdicts if v["stage"] == "final"}
    assert set(finals) == {f"before-{i}" for i in range(N)}
    assert {v["decision"] for v in finals.values()} <= {"allow", "caveat", "block"}
    first_stop = await stopped(first)

    second = Pod(argv, env, paths[POD_TMP], logs / "second.log")
    await started(second)
    await send(settings, requests(settings, "after", N, trusted=True))
    await send(settings, labels(settings, [f"before-{i}" for i in range(N)]))
    verdicts = await read_verdicts(settings, 2 * N, timeout_s=60)
    assert {v["request_id"] for v in verdicts if v["stage"] == "final"} == set(finals) | {
        f"after-{i}" for i in range(N)
    }
    # every label reached its request, decided by the first start (no label is unmatched)
    await wait_until(lambda: labelled(second) == N, 30, f"{N} labels counted")
    seen = metrics(second)
    unmatched = seen.get("guardrail_feedback_unmatched_total")
    # what deciding cost, read from its thread's clock (gr-processor): within the process's
    deciding = seen.get("guardrail_processor_cpu_time_seconds_total", 0.0)
    assert 0 < deciding <= seen.get("process_cpu_seconds_total", 0.0), seen
    second_stop = await stopped(second)

    log = second.log.read_text(errors="replace")
    (warm,) = [ln for ln in log.splitlines() if "warm start: the last" in ln]
    assert f"the last {N} record(s)" in warm and f"{N} request(s) kept" in warm, warm
    # its one assignment read on from there: what was decided between the read and the join
    (recalled,) = [ln for ln in log.splitlines() if "now read here" in ln and "decided" in ln]
    read_again = re.search(r"\((\d+) record\(s\) of ", recalled)
    assert read_again is not None and read_again[1] == "0", recalled
    assert "past what this process had read" in recalled
    assert unmatched == 0, log[-6000:]
    for text in (first.log.read_text(errors="replace"), log):
        bad = [
            ln
            for ln in text.splitlines()
            if any(w in ln for w in (" ERROR ", " CRITICAL ", "Traceback", "Read-only", "denied"))
        ]
        assert not bad, "\n".join(bad[:20])
    written = sorted(
        str(p.relative_to(paths[POD_TMP])) for p in paths[POD_TMP].rglob("*") if p.is_file()
    )
    # nothing of its own (onnxruntime's usage telemetry wrote a device id, an event
    # database and a session file here until sidecar/onnxrt.py turned it off)
    assert written == [], written
    if collector is not None:  # its telemetry reached the collector the rendering names
        assert {m.name for _, m in collector.metrics} >= {"guardrail.verdicts"}
        if env.get("OTEL_TRACES_SAMPLER_ARG", "1") == "1":  # else a sample of the traces
            names = {span.name for span in collector.spans}
            assert f"send {t.verdicts}" in names and f"process {t.retrieval}" in names, names
    print(  # pytest -s: what the report quotes
        f"\n{name}: uid {user.uid}; stopped {first_stop:.2f} / {second_stop:.2f} s after "
        f"SIGTERM (grace {grace_s:g} s); {warm.split(' INFO ', 1)[-1]}; warnings: "
        f"{[ln.split(' WARNING ', 1)[-1][:160] for ln in log.splitlines() if ' WARNING ' in ln]}"
    )
