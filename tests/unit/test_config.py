from __future__ import annotations

import subprocess
import sys

import pytest

from sidecar.config import Settings
from sidecar.exceptions import ConfigError


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
