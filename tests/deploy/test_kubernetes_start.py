"""The sidecar starts in the pods the Helm chart renders (issue #14).

Rendered with the real, pinned ``helm`` (built into ``.tools/`` by
``scripts/lib/deploy-tools.sh``, as ``make helm-check`` does), then started
the way the kubelet would start the container, as far as a test can:

* the environment is the image's ``ENV`` (read from the Dockerfile), then the
  kubelet's service-link variables for every Service of the rendering plus an
  LLM team's own ``guardrail-llm`` Service (as if ``enableServiceLinks`` were
  left on, e.g. by a parent chart in inject mode), then the container's rendered
  ``env`` with ``fieldRef`` / ``secretKeyRef`` filled in and ``$(VAR)`` expanded;
* the filesystem: every volume mount of the container becomes a directory -
  the ``/tmp`` emptyDir writable, the models (a PVC, or what the Dockerfile's
  default build bakes into the image when no volume is mounted) and ConfigMaps
  read-only copies - and the container paths in the environment point at them;
  the working directory is the image's ``WORKDIR`` (``/tmp``), HOME the image's;
* the user: the pod's ``runAsUser`` (10001) through ``setpriv`` when the tests
  run as root, otherwise the (already non-root) test user; a checkout that user
  cannot read (under ``mktemp -d``) is staged as the image has it
  (:mod:`tests.deploy.podpython`).

Not emulated: the read-only root filesystem (the interpreter and the project
are the test's, not the image's; ``test_runtime_image.py`` checks that
``run --check`` writes nothing into the installed venv), dropped capabilities
and seccomp, the image's own interpreter and venv, Secrets' real contents
(credentials are placeholders, TLS files a self-signed pair that ``run --check`` loads;
it connects to nothing).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.dockerfile import Dockerfile
from tests.deploy.kubelet import services_env
from tests.deploy.podpython import PodPython, pod_python
from tests.deploy.tools import (
    CHART,
    HELM_BUILD_TIMEOUT_S,
    NAMESPACE,
    ROOT,
    RUN_TIMEOUT_S,
    refusal,
    render,
)

DOCKERFILE = ROOT / "Dockerfile"
POD_TMP = "/tmp"  # noqa: S108 - the container's path (an emptyDir), not the host's

# A Service of the namespace that is not the chart's: an LLM team's own.
LLM_TEAM_SERVICE: dict[str, Any] = {
    "kind": "Service",
    "metadata": {"name": "guardrail-llm"},
    "spec": {
        "ports": [
            {"name": "http", "port": 8000, "protocol": "TCP"},
            {"name": "grpc", "port": 9000},
        ]
    },
}
# Present in every pod, enableServiceLinks or not (the default namespace's API server).
KUBERNETES_SERVICE: dict[str, Any] = {
    "kind": "Service",
    "metadata": {"name": "kubernetes"},
    "spec": {"ports": [{"name": "https", "port": 443}]},
}


# ------------------------------------------------------------------- rendering


# name -> (chart, helm arguments); "example" is the LLM chart injecting the sidecar.
RENDERINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "chart-defaults": ("chart", ()),
    "values-dev": ("chart", ("-f", str(ROOT / "helm" / "values-dev.yaml"))),
    "values-prod": ("chart", ("-f", str(ROOT / "helm" / "values-prod.yaml"))),
    "values-prod+gpu": (
        "chart",
        (
            "-f",
            str(ROOT / "helm" / "values-prod.yaml"),
            "-f",
            str(ROOT / "helm" / "values-gpu.yaml"),
        ),
    ),
    "ci-inject": ("chart", ("-f", str(CHART / "ci" / "inject-values.yaml"))),
    "ci-mtls": ("chart", ("-f", str(CHART / "ci" / "mtls-values.yaml"))),
    "ci-mtls-key-file": (
        "chart",
        ("-f", str(CHART / "ci" / "mtls-values.yaml"), "--set", "kafka.ssl.keyPasswordAsFile=true"),
    ),
    # values-prod with a client certificate whose key's passphrase is a file
    "values-prod+key-file": (
        "chart",
        (
            "-f",
            str(ROOT / "helm" / "values-prod.yaml"),
            "--set",
            "kafka.ssl.clientCertSecret=guardrail-kafka-client",
            "--set",
            "kafka.ssl.keyPasswordSecret=guardrail-kafka-client-key",
            "--set",
            "kafka.ssl.keyPasswordAsFile=true",
        ),
    ),
    "ci-sasl-files": ("chart", ("-f", str(CHART / "ci" / "sasl-files-values.yaml"))),
    "example-llm-service": ("example", ()),
}


def rendering(name: str, helm: Path, example_chart: Path) -> list[dict[str, Any]]:
    chart, args = RENDERINGS[name]
    return render(helm, example_chart if chart == "example" else CHART, *args)


@dataclass(frozen=True)
class Workload:
    """A pod template of the rendering and its guardrail container."""

    name: str
    pod: dict[str, Any]
    container: dict[str, Any]


def pod_specs(manifests: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    specs = []
    for m in manifests:
        kind = m["kind"]
        if kind == "Pod":
            specs.append((f"Pod/{m['metadata']['name']}", m["spec"]))
        elif kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
            specs.append((f"{kind}/{m['metadata']['name']}", m["spec"]["template"]["spec"]))
        elif kind == "CronJob":
            specs.append(
                (
                    f"{kind}/{m['metadata']['name']}",
                    m["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                )
            )
    return specs


def guardrail_workloads(manifests: list[dict[str, Any]]) -> list[Workload]:
    found = []
    for name, pod in pod_specs(manifests):
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            names = {e["name"] for e in container.get("env", [])}
            if "GUARDRAIL_MODELS__DIR" in names:
                found.append(Workload(name, pod, container))
    return found


# --------------------------------------------------------------- service links


@pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + RUN_TIMEOUT_S)
@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_every_pod_spec_turns_service_links_off(name: str, helm: Path, example_chart: Path) -> None:
    specs = pod_specs(rendering(name, helm, example_chart))
    if name != "ci-inject":  # inject mode renders only the helm test pod here
        assert any(n.startswith("Deployment/") for n, _ in specs), "no Deployment rendered"
    assert specs, "no pod rendered"
    on = [n for n, pod in specs if pod.get("enableServiceLinks") is not False]
    assert not on, (
        f"{on} leave enableServiceLinks on: every Service guardrail-... would become "
        "GUARDRAIL_* variables"
    )


@pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + 2 * RUN_TIMEOUT_S)
def test_an_encrypted_client_key_gets_its_passphrase_from_a_secret(
    helm: Path, example_chart: Path
) -> None:
    """kafka.ssl.keyPasswordSecret becomes GUARDRAIL_KAFKA__SSL_KEY_PASSWORD from the
    Secret (never a literal value); without a client certificate it is refused at render."""
    workloads = guardrail_workloads(rendering("ci-mtls", helm, example_chart))
    assert any(w.name.startswith("Deployment/") for w in workloads)
    for workload in workloads:  # the sidecar and the helm test pod's `run --check`
        (item,) = [e for e in workload.container["env"] if e["name"].endswith("KEY_PASSWORD")]
        assert item == {
            "name": "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD",
            "valueFrom": {
                "secretKeyRef": {"name": "guardrail-kafka-client-key", "key": "password"}
            },
        }, workload.name
    said = refusal(
        helm, CHART, "--set", "kafka.securityProtocol=SSL", "--set", "kafka.ssl.keyPasswordSecret=k"
    )
    assert "kafka.ssl.keyPasswordSecret is set but kafka.ssl.clientCertSecret is not" in said
    # keyPasswordAsFile: the passphrase is a file of the Secret, read with the TLS files
    for workload in guardrail_workloads(rendering("ci-mtls-key-file", helm, example_chart)):
        env = {e["name"] for e in workload.container["env"]}
        assert "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD" not in env
        path = _env_value(workload.container, "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE")
        assert path == "/etc/guardrail/kafka-key-password/password"
        (mount,) = [
            m for m in workload.container["volumeMounts"] if path.startswith(m["mountPath"] + "/")
        ]
        assert mount.get("readOnly") is True and "subPath" not in mount, mount
        (volume,) = [v for v in workload.pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"] == {
            "secretName": "guardrail-kafka-client-key",
            "items": [{"key": "password", "path": "password"}],
        }
    said = refusal(helm, CHART, "--set", "kafka.ssl.keyPasswordAsFile=true")
    assert "kafka.ssl.keyPasswordAsFile is set but kafka.ssl.keyPasswordSecret is not" in said


@pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + 3 * RUN_TIMEOUT_S)
@pytest.mark.parametrize("name", ["ci-sasl-files", "values-prod"])
def test_the_sasl_credentials_and_the_judge_key_can_be_files_the_kubelet_updates(
    helm: Path, example_chart: Path, name: str
) -> None:
    """kafka.sasl.passwordAsFile, kafka.sasl.usernameAsFile and judge.apiKeySecret: each
    secret is a file of a Secret volume mounted whole (a subPath mount is never updated
    when the Secret changes), named by its ..._FILE variable, which the sidecar reads
    again; no variable holds the secret. Both ways at once, or a SASL file without SASL,
    is refused at render. values-prod rotates its SASL user without a restart."""
    workloads = guardrail_workloads(rendering(name, helm, example_chart))
    assert any(w.name.startswith("Deployment/") for w in workloads)
    sasl_secret = "guardrail-kafka-user" if name == "ci-sasl-files" else "kafka-guardrail-sasl"
    files = [
        ("GUARDRAIL_KAFKA__SASL_USERNAME_FILE", sasl_secret, "username"),
        ("GUARDRAIL_KAFKA__SASL_PASSWORD_FILE", sasl_secret, "password"),
    ]
    if name == "ci-sasl-files":
        files.append(("GUARDRAIL_JUDGE__API_KEY_FILE", "llm-judge", "api-key"))
    for workload in workloads:  # the sidecar and the helm test pod's `run --check`
        env = {e["name"] for e in workload.container["env"]}
        assert not env & {
            "GUARDRAIL_KAFKA__SASL_USERNAME",
            "GUARDRAIL_KAFKA__SASL_PASSWORD",
            "GUARDRAIL_JUDGE__API_KEY",
        }
        volumes = {v["name"]: v for v in workload.pod["volumes"]}
        for variable, secret, key in files:
            path = _env_value(workload.container, variable)
            (mount,) = [
                m
                for m in workload.container["volumeMounts"]
                if path.startswith(m["mountPath"].rstrip("/") + "/")
            ]
            assert mount.get("readOnly") is True and "subPath" not in mount, mount
            source = volumes[mount["name"]]["secret"]
            assert source["secretName"] == secret
            relative = path.removeprefix(mount["mountPath"].rstrip("/") + "/")
            assert {"key": key, "path": relative} in source["items"], workload.name
    for args, said in (
        (
            ("--set", "judge.apiKeySecret=llm-judge", "--set", "extraEnv[0].name="
             "GUARDRAIL_JUDGE__API_KEY", "--set", "extraEnv[0].value=k"),
            "judge.apiKeySecret is set and extraEnv holds GUARDRAIL_JUDGE__API_KEY",
        ),
        (
            ("--set", "kafka.sasl.passwordAsFile=true"),
            "kafka.sasl.passwordAsFile is set but kafka.securityProtocol=PLAINTEXT",
        ),
        (
            ("--set", "kafka.sasl.usernameAsFile=true"),
            "kafka.sasl.usernameAsFile is set but kafka.securityProtocol=PLAINTEXT",
        ),
        (
            ("-f", str(ROOT / "helm" / "values-prod.yaml"), "--set",
             "kafka.sasl.usernameKey=password"),
            'kafka.sasl.usernameKey and kafka.sasl.passwordKey are both "password"',
        ),
        (
            ("--set", "kafka.sasl.usernameAsFile=yes"),
            "usernameAsFile",
        ),
    ):  # fmt: skip
        refused = refusal(helm, CHART, *args)
        assert said in refused, refused


# --------------------------------------------------------------- image-only rollback

# What the chart's default values rendered before GUARDRAIL_KAFKA__ISOLATION_LEVEL was
# added (86b7525): images of that age know these variables and refuse any other.
ROLLBACK_FLOOR = frozenset(
    {
        "GUARDRAIL_HTTP__HOST",
        "GUARDRAIL_HTTP__PORT",
        "GUARDRAIL_HTTP__READY_REQUIRES_ASSIGNMENT",  # inject mode
        "GUARDRAIL_KAFKA__AUTO_OFFSET_RESET",
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS",
        "GUARDRAIL_KAFKA__GROUP_ID",
        "GUARDRAIL_KAFKA__SECURITY_PROTOCOL",
        "GUARDRAIL_KAFKA__WAIT_AT_START",  # inject mode
        "GUARDRAIL_LOG_LEVEL",
        "GUARDRAIL_METRICS__PROMETHEUS_HOST",
        "GUARDRAIL_METRICS__PROMETHEUS_PORT",
        "GUARDRAIL_MODELS__DIR",
        "GUARDRAIL_SHUTDOWN_GRACE_MS",
        "GUARDRAIL_TOPICS__CERTIFICATES",
        "GUARDRAIL_TOPICS__CLAIMS",
        "GUARDRAIL_TOPICS__DLQ",
        "GUARDRAIL_TOPICS__FEEDBACK",
        "GUARDRAIL_TOPICS__GENERATION",
        "GUARDRAIL_TOPICS__REPORTS",
        "GUARDRAIL_TOPICS__RETRIEVAL",
        "GUARDRAIL_TOPICS__VERDICTS",
        "GUARDRAIL_TRACING__STAGE_SPANS",
    }
)


@pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + RUN_TIMEOUT_S)
@pytest.mark.parametrize("name", ["chart-defaults", "example-llm-service"])
def test_default_values_set_no_variable_an_older_image_would_refuse(
    name: str, helm: Path, example_chart: Path
) -> None:
    """``helm upgrade --set image.tag=<older>`` rolls the image back under this chart's
    environment, and the sidecar refuses variables it does not know (a typo must fail
    at start): a variable rendered by default since then would crash-loop every older
    pod. A new setting renders only when its value is set (helper-17 measured the
    rollback of read_committed's ISOLATION_LEVEL failing exactly so)."""
    names = {
        env["name"]
        for workload in guardrail_workloads(rendering(name, helm, example_chart))
        for env in workload.container.get("env", [])
        if env["name"].startswith("GUARDRAIL_")
    }
    assert names, "no GUARDRAIL_* variable rendered"
    assert names <= ROLLBACK_FLOOR, (
        f"rendered by default, unknown to an image from before they were added: "
        f"{sorted(names - ROLLBACK_FLOOR)}; render them only when their value is set"
    )


# ---------------------------------------------------------- image <-> chart models


def models_source(dockerfile: Dockerfile, workload: Workload) -> str:
    """Where the container's models come from: a volume, or the image's own directory."""
    models_dir = _env_value(workload.container, "GUARDRAIL_MODELS__DIR")
    mounts = {
        m["mountPath"].rstrip("/"): m["name"] for m in workload.container.get("volumeMounts", [])
    }
    if models_dir.rstrip("/") in mounts:
        return f"volume {mounts[models_dir.rstrip('/')]}"
    baked = dockerfile.baked_source(models_dir)
    assert baked is not None, (
        f"{workload.name} reads its models from {models_dir} inside the image (no volume mounted "
        f"there: models.volume is empty), but the Dockerfile's default build "
        f"(BAKE_MODELS={dockerfile.global_args.get('BAKE_MODELS')}) leaves {models_dir} empty: "
        "bake the models by default or mount a volume by default"
    )
    assert (ROOT / baked).is_dir(), (
        f"the Dockerfile bakes {baked}/, which is not in the build context"
    )
    return f"image:{baked}"


@pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + RUN_TIMEOUT_S)
@pytest.mark.parametrize("name", ["chart-defaults", "values-dev", "example-llm-service"])
def test_default_image_holds_the_models_the_chart_expects(
    name: str, helm: Path, example_chart: Path
) -> None:
    dockerfile = Dockerfile.read(DOCKERFILE)
    workloads = guardrail_workloads(rendering(name, helm, example_chart))
    assert workloads, "no guardrail container rendered"
    for workload in workloads:
        assert models_source(dockerfile, workload) == "image:models", workload.name


def test_the_models_check_fails_when_image_and_chart_disagree(tmp_path: Path) -> None:
    # The same Dockerfile with the models stage switched off, as it was before #14.
    empty = tmp_path / "Dockerfile"
    empty.write_text(
        re.sub(r"(?m)^ARG BAKE_MODELS=\w+$", "ARG BAKE_MODELS=false", DOCKERFILE.read_text())
    )
    container = {
        "env": [{"name": "GUARDRAIL_MODELS__DIR", "value": "/models"}],
        "volumeMounts": [{"name": "guardrail-tmp", "mountPath": POD_TMP}],
    }
    with pytest.raises(AssertionError, match="leaves /models empty"):
        models_source(Dockerfile.read(empty), Workload("Deployment/x", {}, container))
    mounted = container | {"volumeMounts": [{"name": "guardrail-models", "mountPath": "/models"}]}
    source = models_source(Dockerfile.read(empty), Workload("Deployment/x", {}, mounted))
    assert source == "volume guardrail-models"


# --------------------------------------------------------------- the pod itself


def _env_value(container: Mapping[str, Any], name: str) -> str:
    values = [e.get("value") for e in container.get("env", []) if e["name"] == name]
    assert len(values) == 1 and isinstance(values[0], str), f"{name} is not set once with a value"
    return values[0]


_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_env(workload: Workload, base: Mapping[str, str]) -> dict[str, str]:
    """The container's env as the kubelet resolves it (on top of ``base``)."""
    env = dict(base)
    pod_name = f"{workload.name.split('/')[1]}-5d9c7b8f6-x2x7q"
    for item in workload.container.get("env", []):
        if "value" in item:
            # $(VAR) refers to variables defined before (the service links included)
            value = _REF.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
        elif "fieldRef" in item.get("valueFrom", {}):
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            value = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE}[path]
        elif "secretKeyRef" in item.get("valueFrom", {}):
            ref = item["valueFrom"]["secretKeyRef"]
            value = f"placeholder-{ref['name']}-{ref['key']}"
        else:
            raise AssertionError(f"env {item} is not modelled by this test")
        env[item["name"]] = value
    assert not workload.container.get("envFrom"), "envFrom is not modelled by this test"
    return env


@functools.cache
def _tls_pair() -> tuple[bytes, bytes]:
    """A self-signed certificate and its key, PEM (the CA file and the client pair alike)."""
    with tempfile.TemporaryDirectory() as tmp:
        crt, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=guardrail-test", "-keyout", str(key), "-out", str(crt)],
            check=True,
            capture_output=True,
        )  # fmt: skip
        return crt.read_bytes(), key.read_bytes()


def _read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)


@dataclass(frozen=True)
class PodUser:
    uid: int
    gid: int
    argv_prefix: tuple[str, ...]


def pod_user(workload: Workload, dockerfile: Dockerfile) -> PodUser:
    context = workload.pod.get("securityContext", {}) | workload.container.get(
        "securityContext", {}
    )
    image_user = (dockerfile.runtime_user() or "0:0").split(":")
    uid = int(context.get("runAsUser", image_user[0]))
    gid = int(context.get("runAsGroup", image_user[-1]))
    if os.geteuid() == 0 and uid != 0 and shutil.which("setpriv"):
        return PodUser(uid, gid, ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"))
    # Not root: already a non-root user, and read-only copies stay read-only.
    return PodUser(os.geteuid(), os.getegid(), ())


def _fill_secret(host: Path, secret: Mapping[str, Any]) -> None:
    """A Secret volume's files: TLS material as a real self-signed pair (run --check loads
    it, connects to nothing); a password or an API key (a ..._FILE setting) as a
    placeholder line."""
    host.mkdir(parents=True)
    cert, key = _tls_pair()
    for item in secret.get("items", [{"key": k, "path": k} for k in ("tls.crt", "tls.key")]):
        path = item["path"]
        if path.endswith((".crt", ".pem", ".key")):
            (host / path).write_bytes(key if path.endswith(".key") else cert)
        else:
            (host / path).write_text(f"placeholder-{secret['secretName']}-{item['key']}\n")


def build_filesystem(
    root: Path,
    workload: Workload,
    manifests: list[dict[str, Any]],
    dockerfile: Dockerfile,
    user: PodUser,
) -> dict[str, Path]:
    """Container path -> host directory, for every mount and the image's models."""
    volumes = {v["name"]: v for v in workload.pod.get("volumes", [])}
    config_maps = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "ConfigMap"}
    models_dir = _env_value(workload.container, "GUARDRAIL_MODELS__DIR").rstrip("/")
    paths: dict[str, Path] = {}
    for mount in workload.container.get("volumeMounts", []):
        target = mount["mountPath"].rstrip("/")
        host = root / target.lstrip("/")
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            host.mkdir(parents=True)
            os.chown(host, user.uid, user.gid)  # fsGroup: the pod's user owns it
        elif target == models_dir:  # a PVC / ConfigMap / image volume holding the models
            shutil.copytree(ROOT / "models", host)
        elif "configMap" in volume:
            # the chart's own (policy.inline), else an existing one (values-prod:
            # guardrail-policy), assumed to hold the shipped default policy
            cm = config_maps.get(volume["configMap"]["name"])
            host.mkdir(parents=True)
            for item in volume["configMap"].get("items", []):
                data = (
                    cm["data"][item["key"]]
                    if cm
                    else (ROOT / "models/policy/default.yaml").read_text()
                )
                (host / item["path"]).write_text(data)
        elif "secret" in volume:
            _fill_secret(host, volume["secret"])
        else:
            raise AssertionError(f"volume {volume} is not modelled by this test")
        if mount.get("readOnly"):
            _read_only(host)
        paths[target] = host
    if models_dir not in paths:  # the image's own directory
        host = root / models_dir.lstrip("/")
        baked = dockerfile.baked_source(models_dir)
        if baked is None:
            host.mkdir(parents=True)
        else:
            shutil.copytree(ROOT / baked, host)
        _read_only(host)
        paths[models_dir] = host
    return paths


def namespace_services_env(manifests: list[dict[str, Any]]) -> dict[str, str]:
    return services_env([*manifests, LLM_TEAM_SERVICE, KUBERNETES_SERVICE])


def pod_environment(
    workload: Workload,
    manifests: list[dict[str, Any]],
    dockerfile: Dockerfile,
    paths: Mapping[str, Path],
    python: PodPython,
) -> dict[str, str]:
    image = dockerfile.runtime_env()
    image["PATH"] = f"{Path(python.argv[0]).parent}{os.pathsep}{os.defpath}"
    env = container_env(workload, image | namespace_services_env(manifests))
    # container paths -> the emulated filesystem (longest mount first)
    for name, value in env.items():
        for target in sorted(paths, key=len, reverse=True):
            if value == target or value.startswith(f"{target}/"):
                env[name] = str(paths[target]) + value[len(target) :]
                break
    # the project under test instead of the image's venv
    env["PYTHONPATH"] = python.pythonpath
    return env


def start(
    workload: Workload, env: Mapping[str, str], user: PodUser, python: PodPython, cwd: Path
) -> subprocess.CompletedProcess[str]:
    args = list(workload.container.get("args", []))
    assert args[:1] == ["run"], f"{workload.name} does not run the sidecar: {args}"
    if "--check" not in args:
        args.append("--check")
    return subprocess.run(
        [*user.argv_prefix, *python.argv, "-m", "sidecar", *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


@pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + 4 * RUN_TIMEOUT_S)
@pytest.mark.parametrize(
    "name",
    [
        "chart-defaults",
        "values-prod",
        "values-dev",
        "example-llm-service",
        "ci-sasl-files",
        "values-prod+key-file",
    ],
)
def test_the_rendered_pod_starts_beside_service_links(
    name: str, helm: Path, example_chart: Path, pod_root: Path
) -> None:
    manifests = rendering(name, helm, example_chart)
    dockerfile = Dockerfile.read(DOCKERFILE)
    workloads = guardrail_workloads(manifests)
    assert workloads, "no guardrail container rendered"
    for i, workload in enumerate(workloads):
        user = pod_user(workload, dockerfile)
        python = pod_python(user.argv_prefix, pod_root / f"image-{i}")
        paths = build_filesystem(pod_root / str(i), workload, manifests, dockerfile, user)
        env = pod_environment(workload, manifests, dockerfile, paths, python)
        links = [k for k in namespace_services_env(manifests) if k.startswith("GUARDRAIL_")]
        assert any(k.startswith("GUARDRAIL_LLM_") for k in links), (
            "the LLM team's Service is missing"
        )
        if name != "example-llm-service":  # the chart's own Service (standalone mode)
            assert "GUARDRAIL_GUARDRAIL_SIDECAR_SERVICE_HOST" in env

        ok = start(workload, env, user, python, cwd=paths[POD_TMP])
        assert ok.returncode == 0, (
            f"{workload.name} as uid {user.uid}: guardrail run --check exited {ok.returncode}\n"
            f"stdout:\n{ok.stdout}\nstderr:\n{ok.stderr[-4000:]}"
        )
        assert '"config":"ok"' in ok.stdout
        assert f"ignoring {len(links)} Kubernetes service-link variable(s)" in ok.stderr, ok.stderr[
            -4000:
        ]

        typo = start(workload, env | {"GUARDRAIL_JOIN__TTL": "5"}, user, python, cwd=paths[POD_TMP])
        assert typo.returncode == 2, typo.stderr[-4000:]  # the configuration-error exit code
        assert "GUARDRAIL_JOIN__TTL" in typo.stderr
