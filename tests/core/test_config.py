from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.cli import config as config_cli
from sidecar.config import JoinSettings, Settings
from sidecar.environment import kubernetes_service_links
from sidecar.exceptions import ConfigError
from tests.deploy.kubelet import ServicePort, service_link_env


def test_defaults_are_valid() -> None:
    s = Settings.load()
    assert s.topics.retrieval == "rag.retrieval"
    assert s.kafka.bootstrap_servers == "127.0.0.1:9092"


def test_environment_with_nested_delimiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUARDRAIL_JOIN__TTL_MS", "1234")
    monkeypatch.setenv("GUARDRAIL_TOPICS__VERDICTS", "team.verdicts")
    s = Settings.load()
    assert s.join.ttl_ms == 1234
    assert s.topics.verdicts == "team.verdicts"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GUARDRAIL_JOIN__TTL_MS": "-5"}, "GUARDRAIL_JOIN__TTL_MS"),
        ({"GUARDRAIL_TOPICS__DLQ": "bad topic!"}, "not a legal Kafka topic name"),
        ({"GUARDRAIL_TOPICS__DLQ": "rag.verdicts"}, "must be distinct"),
        ({"GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"}, "GUARDRAIL_KAFKA__SASL_USERNAME"),
        ({"GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "TLS"}, "PLAINTEXT"),
        ({"GUARDRAIL_NOT_A_SETTING": "1"}, "GUARDRAIL_NOT_A_SETTING"),
        (
            {"GUARDRAIL_TENANCY__SOURCE": "fixed", "GUARDRAIL_TENANCY__TENANT": "acme\x1b[31m"},
            "GUARDRAIL_TENANCY__TENANT: a name with no control characters, line separators or "
            "bidirectional overrides (got 'acme\\x1b[31m')",
        ),
        ({"GUARDRAIL_TENANCY__HEADER": " "}, "GUARDRAIL_TENANCY__HEADER: must not be blank"),
        (
            {
                "GUARDRAIL_LIMITS__MAX_MESSAGE_BYTES": "4194304",
                "GUARDRAIL_KAFKA__MAX_BATCH_INFLATED_BYTES": "2097152",
            },
            "at least the message limit",
        ),
        (
            {"GUARDRAIL_KAFKA__REBALANCE_TIMEOUT_MS": "5000"},
            "rebalance_timeout_ms must be at least session_timeout_ms=10000, got 5000",
        ),
    ],
)
def test_bad_configuration_says_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        Settings.load()
    assert expected in str(info.value)


def _error(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        Settings.load()
    return str(info.value)


def test_a_long_session_timeout_that_started_before_still_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # before rebalance_timeout_ms, aiokafka waited the session timeout for a rejoin: a
    # session above 300 s left the new setting unset must not refuse to start
    monkeypatch.setenv("GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS", "400000")
    kafka = Settings.load().kafka
    assert (kafka.session_timeout_ms, kafka.rebalance_timeout_ms) == (400_000, 400_000)
    monkeypatch.setenv("GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS", "20000")
    assert Settings.load().kafka.rebalance_timeout_ms == 300_000  # the default stands


def test_an_unknown_field_of_a_section_is_answered_with_the_sections_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``GUARDRAIL_JOIN__TTL=5`` said only "Extra inputs are not permitted"."""
    said = _error(monkeypatch, GUARDRAIL_JOIN__TTL="5")
    assert "GUARDRAIL_JOIN__TTL: no such setting; did you mean GUARDRAIL_JOIN__TTL_MS?" in said
    fields = said.split("the settings of GUARDRAIL_JOIN are ", 1)[1].split(", ")
    assert fields[0] == "GUARDRAIL_JOIN__TTL_MS"  # the closest first
    assert sorted(fields) == sorted(
        f"GUARDRAIL_JOIN__{n.upper()}" for n in JoinSettings.model_fields
    )
    assert "Extra inputs" not in said


def test_a_check_across_settings_speaks_without_pydantics_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It read ``GUARDRAIL_: Value error, GUARDRAIL_METRICS__PROMETHEUS_PORT and ...``."""
    said = _error(
        monkeypatch, GUARDRAIL_METRICS__PROMETHEUS_PORT="8080", GUARDRAIL_HTTP__PORT="8080"
    )
    assert said.splitlines()[1] == (
        "  GUARDRAIL_METRICS__PROMETHEUS_PORT and GUARDRAIL_HTTP__PORT are both 8080; "
        "the metrics and the health endpoints need two different ports"
    )
    said = _error(monkeypatch, GUARDRAIL_KAFKA__SASL_MECHANISM="PLAIN")
    assert said.splitlines()[1].startswith("  GUARDRAIL_KAFKA: sasl_mechanism set, but")
    assert "Value error" not in said


def test_a_judge_timeout_over_half_the_stall_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an answer waits for its judge calls on the processor thread: a hung judge at the
    # allowed timeout_s 60 held it for the whole default stall limit (60 s), not ready
    judge = {"GUARDRAIL_JUDGE__ENDPOINT": "http://127.0.0.1:8000/v1", "GUARDRAIL_JUDGE__MODEL": "m"}
    said = _error(monkeypatch, **judge, GUARDRAIL_JUDGE__TIMEOUT_S="60")
    assert (
        "GUARDRAIL_JUDGE__TIMEOUT_S (60) is over half of GUARDRAIL_HTTP__PROCESSING_STALL_S (60)"
        in said
    )
    assert "allowed: at most 30 (or raise the stall limit)" in said
    monkeypatch.setenv("GUARDRAIL_HTTP__PROCESSING_STALL_S", "120")
    assert Settings.load().judge.timeout_s == 60.0
    monkeypatch.delenv("GUARDRAIL_JUDGE__ENDPOINT")  # no judge: its timeout waits for nothing
    monkeypatch.setenv("GUARDRAIL_HTTP__PROCESSING_STALL_S", "10")
    assert Settings.load().judge.timeout_s == 60.0


def test_secrets_never_appear_in_config_show(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "GUARDRAIL_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "GUARDRAIL_KAFKA__SASL_USERNAME": "svc",
        "GUARDRAIL_KAFKA__SASL_PASSWORD": "hunter2-very-secret",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings.load()
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.redacted())
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "config", "show"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "hunter2" not in out.stdout + out.stderr
    assert '"sasl_username": "svc"' in out.stdout


def test_config_show_sources_names_the_variable_behind_each_changed_setting() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.upper().startswith("GUARDRAIL_")},
        "GUARDRAIL_JOIN__TTL_MS": "5000",
        "GUARDRAIL_KAFKA": '{"group_id": "fleet-b"}',
        "guardrail_kafka__security_protocol": "SASL_SSL",  # names are case-insensitive
        "GUARDRAIL_KAFKA__SASL_MECHANISM": "PLAIN",
        "GUARDRAIL_KAFKA__SASL_USERNAME": "svc",
        "GUARDRAIL_KAFKA__SASL_PASSWORD": "hunter2-very-secret",
    }
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "config", "show", "--sources"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    lines = {line.split()[0]: line.split(maxsplit=1)[1] for line in out.stdout.splitlines()}
    assert lines == {
        "kafka.group_id": '"fleet-b"  <- GUARDRAIL_KAFKA (JSON)',
        "kafka.security_protocol": '"SASL_SSL"  <- guardrail_kafka__security_protocol',
        "kafka.sasl_mechanism": '"PLAIN"  <- GUARDRAIL_KAFKA__SASL_MECHANISM',
        "kafka.sasl_username": '"svc"  <- GUARDRAIL_KAFKA__SASL_USERNAME',
        "kafka.sasl_password": '"**********"  <- GUARDRAIL_KAFKA__SASL_PASSWORD',
        "join.ttl_ms": "5000  <- GUARDRAIL_JOIN__TTL_MS",
    }
    assert "hunter2" not in out.stdout + out.stderr


def test_config_show_all_lists_every_setting_once_defaults_included(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [k for k in os.environ if k.upper().startswith("GUARDRAIL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GUARDRAIL_LOG_LEVEL", "DEBUG")
    listed = config_cli.sources(Settings.load(), os.environ)
    paths = [s.path for s in listed]
    assert len(paths) == len(set(paths)) > 100
    by_path = {s.path: s for s in listed}
    assert by_path[("log_level",)].source == "GUARDRAIL_LOG_LEVEL"
    assert by_path[("kafka", "bootstrap_servers")] == config_cli.Source(
        ("kafka", "bootstrap_servers"), "127.0.0.1:9092", "default"
    )
    assert {s.source for s in listed} == {"default", "GUARDRAIL_LOG_LEVEL"}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://bob:s3cr@tPW@llm:8000/v1", "https://bob:**********@llm:8000/v1"),
        ("https://bob:ab/cd@llm/v1", "https://bob:**********@llm/v1"),
        ("https://qd:6333/?api_key=TOPSECRET&x=1", "https://qd:6333/?api_key=**********&x=1"),
        (
            "https://qd/?X-Amz-Signature=abc&token=t0k",
            "https://qd/?X-Amz-Signature=**********&token=**********",
        ),
        ("http://qdrant:6333", "http://qdrant:6333"),
        # a quote or a space in the password: the text's mask stops at them (audit)
        ('https://bob:hun"ter2@qd:6333', "https://bob:**********@qd:6333"),
        ("https://bob:hun'ter2@qd:6333", "https://bob:**********@qd:6333"),
        ("https://bob:hun ter2@qd:6333", "https://bob:**********@qd:6333"),
        # a token given as the user (https://<token>@host) was shown whole (audit)
        ("https://ghp_T0KEN@qd:6333", "https://**********@qd:6333"),
        ("https://qd/v1/@scope", "https://qd/v1/@scope"),  # an "@" in the path
    ],
)
def test_config_show_hides_every_part_of_a_url_that_is_a_credential(
    monkeypatch: pytest.MonkeyPatch, url: str, shown: str
) -> None:
    """Audit: a password holding '@' or '/' was shown in part or whole, query tokens as is."""
    monkeypatch.setenv("GUARDRAIL_QDRANT__URL", url)
    assert Settings.load().redacted()["qdrant"]["url"] == shown


def test_a_refused_url_is_not_echoed_with_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    said = _error(monkeypatch, GUARDRAIL_JUDGE__ENDPOINT="ftp://bob:HUNTER2@judge")
    assert "HUNTER2" not in said and "ftp://bob:**********@judge" in said


@pytest.mark.parametrize(
    ("env", "named"),
    [
        # a misspelled secret's name
        ({"GUARDRAIL_KAFKA__SASL_PASWORD": "HUNTER2-secret"}, "GUARDRAIL_KAFKA__SASL_PASWORD"),
        ({"GUARDRAIL_JUDGE__APIKEY": "HUNTER2-secret"}, "GUARDRAIL_JUDGE__APIKEY"),
        ({"GUARDRAIL_QDRANT": '{"apikey": "HUNTER2-secret"}'}, "GUARDRAIL_QDRANT__APIKEY"),
        # a secret of the wrong type
        ({"GUARDRAIL_KAFKA": '{"sasl_password": 12345678}'}, "GUARDRAIL_KAFKA__SASL_PASSWORD"),
        ({"GUARDRAIL_JUDGE": '{"api_key": ["HUNTER2-secret"]}'}, "GUARDRAIL_JUDGE__API_KEY"),
    ],
)
def test_a_configuration_error_never_shows_a_secrets_value(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    """Audit: ``GUARDRAIL_KAFKA__SASL_PASWORD=...`` (one S short) printed ``no such setting
    (got '<the password>')`` on the way out, into the pod's log; a secret of the wrong type
    printed it too."""
    said = _error(monkeypatch, **env)
    assert "HUNTER2" not in said and "12345678" not in said
    assert f"\n  {named}: " in said  # still says which variable is wrong


def test_run_fails_fast_on_bad_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUARDRAIL_JOIN__MAX_ENTRIES", "0")
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "run", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "GUARDRAIL_JOIN__MAX_ENTRIES" in out.stderr


# ------------------------------------------------- Kubernetes service links (#14)
# What the kubelet injected in the user's report: `helm upgrade --install
# guardrail charts/guardrail-sidecar` creates the Service guardrail-guardrail-sidecar.
REPORTED_LINKS = {
    "GUARDRAIL_GUARDRAIL_SIDECAR_SERVICE_HOST": "10.96.12.34",
    "GUARDRAIL_GUARDRAIL_SIDECAR_SERVICE_PORT": "8080",
    "GUARDRAIL_GUARDRAIL_SIDECAR_SERVICE_PORT_HTTP": "8080",
    "GUARDRAIL_GUARDRAIL_SIDECAR_SERVICE_PORT_METRICS": "9464",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT": "tcp://10.96.12.34:8080",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_8080_TCP": "tcp://10.96.12.34:8080",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_8080_TCP_PROTO": "tcp",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_8080_TCP_PORT": "8080",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_8080_TCP_ADDR": "10.96.12.34",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_9464_TCP": "tcp://10.96.12.34:9464",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_9464_TCP_PROTO": "tcp",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_9464_TCP_PORT": "9464",
    "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_9464_TCP_ADDR": "10.96.12.34",
}
SETTINGS = set(Settings.model_fields)


def test_the_kubelet_helper_writes_the_reported_variables() -> None:
    ports = [ServicePort(8080, "http"), ServicePort(9464, "metrics")]
    assert service_link_env("guardrail-guardrail-sidecar", "10.96.12.34", ports) == REPORTED_LINKS


def test_service_links_are_ignored_and_real_port_settings_still_parsed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A Service named exactly "guardrail" (an LLM team's), over IPv6 and UDP.
    own = service_link_env("guardrail", "fd00:10:96::7", [ServicePort(53, "dns", "UDP")])
    assert own["GUARDRAIL_PORT"] == "udp://[fd00:10:96::7]:53"
    for k, v in (REPORTED_LINKS | own).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GUARDRAIL_HTTP__PORT", "9000")
    monkeypatch.setenv("GUARDRAIL_METRICS__PROMETHEUS_PORT", "9465")
    with caplog.at_level(logging.INFO, logger="sidecar.config"):
        s = Settings.load()
    assert s.http.port == 9000
    assert s.metrics.prometheus_port == 9465
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert f"ignoring {len(REPORTED_LINKS) + len(own)} Kubernetes service-link" in logged
    assert "GUARDRAIL_GUARDRAIL_SIDECAR_PORT_9464_TCP_ADDR" in logged
    assert "GUARDRAIL_HTTP__PORT" not in logged


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        # a typo of a real setting, with or without service links around
        ({"GUARDRAIL_JOIN__TTL": "5"}, "GUARDRAIL_JOIN__TTL"),
        # the "__" forgotten: looks like <SVC>_PORT, but the value is no link URL
        ({"GUARDRAIL_HTTP_PORT": "9000"}, "GUARDRAIL_HTTP_PORT"),
        ({"GUARDRAIL_METRICS_PROMETHEUS_PORT": "9464"}, "GUARDRAIL_METRICS_PROMETHEUS_PORT"),
        # link-shaped, but no <SVC>_SERVICE_HOST of that family
        ({"GUARDRAIL_QDRANT_PORT": "tcp://10.96.12.34:6333"}, "GUARDRAIL_QDRANT_PORT"),
        ({"GUARDRAIL_QDRANT_SERVICE_PORT": "6333"}, "GUARDRAIL_QDRANT_SERVICE_PORT"),
        # <SVC>_SERVICE_HOST that is not an IP address
        ({"GUARDRAIL_QDRANT_SERVICE_HOST": "qdrant.rag.svc"}, "GUARDRAIL_QDRANT_SERVICE_HOST"),
        # values the kubelet would not write for that family
        ({"GUARDRAIL_GUARDRAIL_SIDECAR_PORT_8080_TCP_ADDR": "10.0.0.1"}, "_8080_TCP_ADDR"),
        ({"GUARDRAIL_GUARDRAIL_SIDECAR_PORT_8080_TCP_PORT": "8081"}, "_8080_TCP_PORT"),
        ({"GUARDRAIL_GUARDRAIL_SIDECAR_PORT_8080_TCP_PROTO": "udp"}, "_8080_TCP_PROTO"),
        ({"GUARDRAIL_GUARDRAIL_SIDECAR_PORT": "http://10.96.12.34:8080"}, "SIDECAR_PORT"),
        ({"GUARDRAIL_GUARDRAIL_SIDECAR_SERVICE_PORT_HTTP": "http"}, "SERVICE_PORT_HTTP"),
    ],
)
def test_typos_are_still_refused_among_service_links(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, str], refused: str
) -> None:
    for k, v in (REPORTED_LINKS | extra).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        Settings.load()
    message = str(info.value)
    assert refused in message
    # only the bad variable is named, never the genuine links beside it
    named = {k for k in REPORTED_LINKS if re.search(rf"\b{k}\b", message)}
    assert named <= set(extra), message


def test_a_link_shaped_typo_points_at_enable_service_links(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GUARDRAIL_HTTP_PORT", "9000")
    with pytest.raises(ConfigError, match="enableServiceLinks: false"):
        Settings.load()
    monkeypatch.delenv("GUARDRAIL_HTTP_PORT")
    monkeypatch.setenv("GUARDRAIL_NOT_A_SETTING", "1")
    with pytest.raises(ConfigError) as info:
        Settings.load()
    assert "enableServiceLinks" not in str(info.value)


_DNS_LABEL = st.from_regex(r"\A[a-z]([a-z0-9]|-(?=[a-z0-9])){0,40}\Z")
_PORTS = st.lists(
    st.builds(
        ServicePort,
        port=st.integers(1, 65535),
        name=st.one_of(st.just(""), st.from_regex(r"\A[a-z]([a-z0-9]|-(?=[a-z0-9])){0,13}\Z")),
        protocol=st.sampled_from(["TCP", "UDP", "SCTP"]),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda p: (p.port, p.protocol),
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    suffix=_DNS_LABEL,
    ip=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str),
    ports=_PORTS,
)
def test_every_guardrail_service_family_is_recognised(
    suffix: str, ip: str, ports: list[ServicePort]
) -> None:
    env = service_link_env(f"guardrail-{suffix}", ip, ports)
    real = {
        "GUARDRAIL_HTTP__PORT": "8080",
        "GUARDRAIL_METRICS__PROMETHEUS_PORT": "9464",
        "GUARDRAIL_LOG_LEVEL": "INFO",
        "GUARDRAIL_HTTP_PORT": "8080",  # a typo: never a link
    }
    assert kubernetes_service_links(env | real, SETTINGS) == set(env)


def test_a_top_level_setting_is_never_taken_for_a_link() -> None:
    # No setting of today ends like a link; were one added (say x_port), a Service
    # named guardrail-x must not hide it from validation.
    env = {"GUARDRAIL_X_SERVICE_HOST": "10.0.0.1", "GUARDRAIL_X_PORT": "tcp://10.0.0.1:80"}
    assert kubernetes_service_links(env, SETTINGS) == set(env)
    assert kubernetes_service_links(env, SETTINGS | {"x_port"}) == {"GUARDRAIL_X_SERVICE_HOST"}


def test_a_name_with_the_section_delimiter_is_always_a_setting() -> None:
    # GUARDRAIL_HTTP__PORT is the health port, whatever else looks like a family around it.
    env = {"GUARDRAIL_HTTP__SERVICE_HOST": "10.0.0.1", "GUARDRAIL_HTTP__PORT": "tcp://10.0.0.1:80"}
    assert kubernetes_service_links(env, SETTINGS) == set()


def test_stage_spans_are_read_and_a_wrong_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.load().tracing.stage_spans
    monkeypatch.setenv("GUARDRAIL_TRACING__STAGE_SPANS", "false")
    assert not Settings.load().tracing.stage_spans
    monkeypatch.setenv("GUARDRAIL_TRACING__STAGE_SPANS", "maybe")
    with pytest.raises(ConfigError, match=r"GUARDRAIL_TRACING__STAGE_SPANS: .*valid boolean"):
        Settings.load()
