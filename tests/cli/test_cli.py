from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from sidecar.cli.main import main
from sidecar.config import Settings
from sidecar.runtime import short_join_ttl, unread_settings


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "replay", "demo", "topics", "kafka", "config", "schemas"):
        assert f"    {command} " in out


def test_python_dash_m_runs_the_same_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "run", "--check"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = orjson.loads(out.stdout)
    assert report["config"] == "ok"
    assert report["policy"] == "default/1"
    assert "certifier" in report["models"]


def test_check_does_not_import_torch() -> None:
    code = (
        "import sys; from sidecar.cli.main import main; main(['run', '--check']); "
        "bad = [m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def _otlp_env(monkeypatch: pytest.MonkeyPatch, sampler_arg: str) -> None:
    for name in ("PROTOCOL", "TRACES_PROTOCOL", "METRICS_PROTOCOL"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{name}", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", sampler_arg)


def test_check_stops_on_an_otlp_setting_before_loading_models(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sampler ratio the SDK would misread (and then trace every verdict) stops
    ``run --check`` with exit 2 and what is allowed."""
    _otlp_env(monkeypatch, "10%")
    monkeypatch.setattr(
        "sidecar.runtime.build_processor",
        lambda settings: pytest.fail("models loaded before the OTLP settings were checked"),
    )
    assert main(["run", "--check"]) == 2
    assert "OTEL_TRACES_SAMPLER_ARG must be a ratio in [0, 1]" in capsys.readouterr().err


def test_check_reports_what_goes_out_over_otlp(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _otlp_env(monkeypatch, "0.1")
    assert main(["run", "--check"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["otlp"] == {
        "traces": "otlp http/protobuf, parentbased_traceidratio 0.1",
        "metrics": "otlp http/protobuf",
    }


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"SECURITY_PROTOCOL": "SSL", "SSL_CAFILE": "/nonexistent/ca.pem"},
            "GUARDRAIL_KAFKA__SSL_CAFILE=/nonexistent/ca.pem: cannot load CA certificates",
        ),
        (  # a file that is not PEM (a p12 bundle, a policy file mounted by mistake)
            {"SECURITY_PROTOCOL": "SSL", "SSL_CAFILE": __file__},
            "it must be a readable PEM file",
        ),
        (
            {"SECURITY_PROTOCOL": "SSL", "SSL_CERTFILE": "/nonexistent/client.pem"},
            "GUARDRAIL_KAFKA__SSL_CERTFILE=/nonexistent/client.pem",
        ),
    ],
    ids=["missing-ca", "not-pem", "missing-cert"],
)
def test_check_stops_on_tls_files_it_cannot_load(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    says: str,
) -> None:
    """``run --check`` builds the TLS context ``run`` builds: a bad file is a configuration
    error (exit 2, the variable named), not a traceback at the first Kafka call."""
    for name, value in env.items():
        monkeypatch.setenv(f"GUARDRAIL_KAFKA__{name}", value)
    assert main(["run", "--check"]) == 2
    assert says in capsys.readouterr().err


def _encrypted_client_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed client certificate and its key, encrypted with ``secret-pass``."""
    key, crt = tmp_path / "client.key", tmp_path / "client.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "2", "-subj", "/CN=c",
         "-passout", "pass:secret-pass", "-keyout", str(key), "-out", str(crt)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, crt


def test_an_encrypted_client_key_is_named_and_never_prompted_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An encrypted key without GUARDRAIL_KAFKA__SSL_KEY_PASSWORD is a configuration error
    saying so: OpenSSL's own fallback prompted on the terminal (a hang under a TTY) or,
    without one, said "Invalid argument" under "they must be readable PEM files that
    match"."""
    key, crt = _encrypted_client_pair(tmp_path)
    for name, value in {
        "SECURITY_PROTOCOL": "SSL",
        "SSL_CERTFILE": str(crt),
        "SSL_KEYFILE": str(key),
    }.items():
        monkeypatch.setenv(f"GUARDRAIL_KAFKA__{name}", value)
    assert main(["run", "--check"]) == 2
    err = capsys.readouterr().err
    assert f"GUARDRAIL_KAFKA__SSL_KEYFILE={key}: the private key is encrypted" in err, err
    # the key inside the certificate file (no SSL_KEYFILE): the variable set is named
    both = tmp_path / "both.pem"
    both.write_text(crt.read_text() + key.read_text())
    monkeypatch.setenv("GUARDRAIL_KAFKA__SSL_CERTFILE", str(both))
    monkeypatch.delenv("GUARDRAIL_KAFKA__SSL_KEYFILE")
    assert main(["run", "--check"]) == 2
    err = capsys.readouterr().err
    assert f"GUARDRAIL_KAFKA__SSL_CERTFILE={both} (its key): the private key is encrypted" in err


def test_an_encrypted_client_key_opens_with_its_passphrase(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """GUARDRAIL_KAFKA__SSL_KEY_PASSWORD decrypts the key; a wrong one is named as wrong
    (not as an unreadable file), and the passphrase never reaches the output."""
    key, crt = _encrypted_client_pair(tmp_path)
    for name, value in {
        "SECURITY_PROTOCOL": "SSL",
        "SSL_CERTFILE": str(crt),
        "SSL_KEYFILE": str(key),
        "SSL_KEY_PASSWORD": "secret-pass",
    }.items():
        monkeypatch.setenv(f"GUARDRAIL_KAFKA__{name}", value)
    assert main(["run", "--check"]) == 0
    assert "secret-pass" not in "".join(capsys.readouterr())
    monkeypatch.setenv("GUARDRAIL_KAFKA__SSL_KEY_PASSWORD", "not-the-pass")
    assert main(["run", "--check"]) == 2
    out, err = capsys.readouterr()
    assert (
        f"GUARDRAIL_KAFKA__SSL_KEYFILE={key}: GUARDRAIL_KAFKA__SSL_KEY_PASSWORD does not "
        "decrypt the private key"
    ) in err, err
    assert "not-the-pass" not in out + err
    # a passphrase with no client certificate to use it for is refused, not ignored
    monkeypatch.delenv("GUARDRAIL_KAFKA__SSL_CERTFILE")
    monkeypatch.delenv("GUARDRAIL_KAFKA__SSL_KEYFILE")
    assert main(["run", "--check"]) == 2
    assert "ssl_key_password set without ssl_certfile" in capsys.readouterr().err
    monkeypatch.setenv("GUARDRAIL_KAFKA__SECURITY_PROTOCOL", "PLAINTEXT")
    assert main(["run", "--check"]) == 2
    assert "ssl_key_password set, but security_protocol=PLAINTEXT" in capsys.readouterr().err


def test_the_metrics_port_cannot_be_the_health_port(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GUARDRAIL_METRICS__PROMETHEUS_PORT", "8080")
    assert main(["run", "--check"]) == 2
    assert "need two different ports" in capsys.readouterr().err
    monkeypatch.setenv("GUARDRAIL_HTTP__ENABLED", "false")  # no health server: no clash
    assert main(["run", "--check"]) == 0


def test_qdrant_settings_are_flagged_as_read_by_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The chart offers qdrant.url; the sidecar never queries Qdrant, so a user who sets
    it is told at start instead of believing it is used."""
    assert unread_settings(Settings.load()) == []
    monkeypatch.setenv("GUARDRAIL_QDRANT__URL", "http://qdrant:6333")
    (note,) = unread_settings(Settings.load())
    assert "never queries Qdrant" in note
    with caplog.at_level("WARNING", logger="sidecar"):
        assert main(["run", "--check"]) == 0
    assert "never queries Qdrant" in caplog.text


def test_a_judge_key_without_a_judge_is_flagged_as_read_by_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The chart's judge.apiKeySecret mounts the key whether or not an endpoint is set:
    a key with no judge was read by nothing, without a word."""
    key = tmp_path / "key"
    key.write_text("s3cret-value\n", encoding="utf-8")
    monkeypatch.setenv("GUARDRAIL_JUDGE__API_KEY_FILE", str(key))
    (note,) = unread_settings(Settings.load())
    assert note.startswith("GUARDRAIL_JUDGE__API_KEY_FILE is set, but no LLM judge is")
    assert "s3cret" not in note
    monkeypatch.setenv("GUARDRAIL_QDRANT__URL", "http://qdrant:6333")
    assert len(unread_settings(Settings.load())) == 2  # each said


def test_a_join_ttl_shorter_than_a_failover_is_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At a 3 s TTL, a killed Kafka leader (its partitions away ~10 s) tore requests whose
    halves were both in Kafka (tests/kafka/test_cluster_restarts_real.py)."""
    assert short_join_ttl(Settings.load()) is None  # the defaults: 30 s over 10 s
    monkeypatch.setenv("GUARDRAIL_JOIN__TTL_MS", "3000")
    note = short_join_ttl(Settings.load())
    assert note is not None and note.startswith("GUARDRAIL_JOIN__TTL_MS=3000 is shorter")
    assert "Keep it above 10000" in note
    monkeypatch.setenv("GUARDRAIL_JOIN__TTL_MS", "20000")
    monkeypatch.setenv("GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS", "45000")  # the session's longer
    note = short_join_ttl(Settings.load())
    assert note is not None and "Keep it above 45000" in note
    with caplog.at_level("WARNING", logger="sidecar"):
        assert main(["run", "--check"]) == 0
    assert "GUARDRAIL_JOIN__TTL_MS=20000 is shorter" in caplog.text


def test_run_stops_on_an_otlp_setting_before_touching_kafka(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``guardrail run`` checks the OTLP environment before it asks the broker for the
    topics: a typo is reported even when Kafka is unreachable."""
    from sidecar import runtime
    from sidecar.exceptions import ConfigError

    _otlp_env(monkeypatch, "10%")

    async def no_kafka(settings: Settings) -> None:
        pytest.fail("the broker was asked before the OTLP settings were checked")

    monkeypatch.setattr(runtime, "verify_topics", no_kafka)
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER_ARG must be a ratio"):
        asyncio.run(runtime.serve(Settings.load()))


def test_run_reports_a_policy_error_while_kafka_does_not_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Audit: with ``wait_at_start`` and no broker, a policy typo was never reported (only
    "cannot reach Kafka" retries); without it, the Kafka error hid the typo. The models and
    the policy now load while Kafka is reached, and the first error ends the start."""
    from sidecar import runtime
    from sidecar.exceptions import BrokerError, ConfigError

    policy = tmp_path / "policy.yaml"
    shipped = Path(__file__).parents[2] / "models/policy/default.yaml"
    policy.write_text(shipped.read_text().replace("caveat_below", "caveat_belw", 1))
    monkeypatch.setenv("GUARDRAIL_POLICY__FILE", str(policy))
    monkeypatch.setenv("GUARDRAIL_HTTP__ENABLED", "false")
    asked: list[float] = []

    async def unreachable(settings: Settings) -> dict[str, int]:
        asked.append(time.monotonic())
        raise BrokerError("cannot reach Kafka at 127.0.0.1:1")

    monkeypatch.setattr(runtime, "verify_topics", unreachable)
    for wait in ("true", "false"):
        monkeypatch.setenv("GUARDRAIL_KAFKA__WAIT_AT_START", wait)
        with pytest.raises(ConfigError, match="caveat_belw: no such field"):
            asyncio.run(asyncio.wait_for(runtime.serve(Settings.load()), 60))
    assert asked  # the broker was asked meanwhile, not after the models


def test_run_reports_a_wrong_topic_layout_without_waiting_for_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sidecar import runtime
    from sidecar.exceptions import ConfigError

    monkeypatch.setenv("GUARDRAIL_HTTP__ENABLED", "false")
    loading = threading.Event()

    def models_still_loading(settings: Settings) -> None:
        loading.wait(60)  # released once serve() has raised

    async def split(settings: Settings) -> dict[str, int]:
        raise ConfigError("rag.retrieval has 3 partitions and rag.generation 2")

    monkeypatch.setattr(runtime, "build_processor", models_still_loading)
    monkeypatch.setattr(runtime, "verify_topics", split)
    loop = asyncio.new_event_loop()  # not asyncio.run: it would join the loading thread
    try:
        with pytest.raises(ConfigError, match="3 partitions"):
            loop.run_until_complete(asyncio.wait_for(runtime.serve(Settings.load()), 20))
    finally:
        loading.set()
        loop.close()


def test_an_errors_text_cannot_colour_the_terminal_or_forge_a_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log escapes what it writes; the fatal line on stderr did not. A policy path
    holding an ESC sequence and a newline (or a broker's reply quoted in an error) reached
    the terminal raw: the colour took, and the text after the newline stood as a line of
    its own."""
    monkeypatch.setenv("GUARDRAIL_HTTP__ENABLED", "false")
    monkeypatch.setenv("GUARDRAIL_POLICY__FILE", "/nonexistent/p\x1b[31m\nguardrail: all clear")
    assert main(["run", "--check"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[31m" in err
    first, *rest = err.rstrip("\n").split("\n")
    assert first.startswith("guardrail: configuration error: GUARDRAIL_POLICY__FILE=")
    assert rest == ["  guardrail: all clear does not exist"]


def test_each_setting_of_a_settings_error_keeps_its_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GUARDRAIL_KAFKA__SECURITY_PROTOCOL", "TLS")
    monkeypatch.setenv("GUARDRAIL_LOG_LEVEL", "LOUD")
    assert main(["run", "--check"]) == 2
    lines = capsys.readouterr().err.rstrip("\n").split("\n")
    assert lines[0] == "guardrail: configuration error: invalid configuration:"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "  GUARDRAIL_KAFKA__SECURITY_PROTOCOL",
        "  GUARDRAIL_LOG_LEVEL",
    ]


def test_topics_acls_prints_a_grant_line_per_acl_for_this_configuration(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDRAIL_TOPICS__DLQ", "team.dlq")
    monkeypatch.setenv("GUARDRAIL_KAFKA__GROUP_ID", "team-guard")
    assert main(["topics", "acls", "--principal", "User:rag"]) == 0
    lines = capsys.readouterr().out.splitlines()
    grant = "kafka-acls.sh --bootstrap-server 127.0.0.1:9092 --add --allow-principal User:rag"
    assert f"{grant} --operation Read --group team-guard  # the consumer group" in lines
    assert f"{grant} --operation Write --topic team.dlq  # DLQ" in lines
    optional = [line for line in lines if "# optional: reroute" in line]
    assert len(optional) == 3 and all("--operation Write" in line for line in optional)
    warm = [line for line in lines if "# optional: the warm start" in line]
    assert len(warm) == 1 and "--operation Read --topic rag.verdicts" in warm[0]
    monkeypatch.setenv("GUARDRAIL_JOIN__REROUTE", "false")
    monkeypatch.setenv("GUARDRAIL_SIGNALS__WARM_START", "0")
    assert main(["topics", "acls", "--json"]) == 0
    rows = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(row["essential"] for row in rows) and "granted" not in rows[0]
    assert {(r["operation"], r["name"]) for r in rows if r["resource"] == "group"} == {
        ("Read", "team-guard")
    }
    assert "--allow-principal User:PRINCIPAL" in rows[0]["command"]  # no SASL user to name
