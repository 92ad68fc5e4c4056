"""Sloppy or hostile files and environments: one-line errors naming what is wrong, never a guess."""

from __future__ import annotations

import gzip
import json
import os
import socket
from pathlib import Path

import pytest

from sidecar.cli.main import main
from sidecar.config import Settings
from sidecar.exceptions import BrokerError, ConfigError, InputError
from sidecar.health import HealthServer
from sidecar.lab import demo
from sidecar.lab.localkafka.broker import free_port
from sidecar.lab.replay import load_file, send
from sidecar.lab.report.collect import load_rows
from sidecar.lab.retrieval.corpus import read_jsonl
from sidecar.lab.verifier.evaluate import finite_or_none, read_pair_items
from sidecar.lab.verifier.jsonl import iter_json_objects
from sidecar.policy.config import parse_policy
from sidecar.telemetry_setup import configure_from_env


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _row(qid: int, correct: object) -> dict[str, object]:
    return {"qid": qid, "correct": correct, "retrieval": {}, "final": {}}


@pytest.mark.parametrize("correct", ["false", "true", 0, 1, None, "no"])
def test_outcome_rows_take_only_boolean_labels(tmp_path: Path, correct: object) -> None:
    rows = _write(tmp_path / "rows.jsonl", (json.dumps(_row(1, correct)) + "\n").encode())
    with pytest.raises(InputError, match=r"rows.jsonl:1: correct must be true or false"):
        load_rows(rows)


def test_outcome_rows_refuse_a_repeated_qid_and_name_both_lines(tmp_path: Path) -> None:
    text = "".join(json.dumps(_row(7, True)) + "\n" for _ in range(2))
    rows = _write(tmp_path / "rows.jsonl", text.encode())
    with pytest.raises(InputError, match=r"rows.jsonl:2: qid 7 already on line 1"):
        load_rows(rows)


def test_outcome_rows_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="do not exist"):
        load_rows(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"a": 1}\n{"b": "caf\xe9"}\n', r":2: not UTF-8 \(byte 0xe9"),
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", r":1: not usable JSON"),
        (b'{"id": ' + b"9" * 5000 + b"}\n", r":1: not usable JSON"),
        (b"42\n", r":1: expected a JSON object, got int"),
        (b'{"a": 1} trailing\n', r":1: Extra data \(column 10\)"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, data: bytes, match: str) -> None:
    path = _write(tmp_path / "f.jsonl", data)
    with pytest.raises(InputError, match=match):
        list(iter_json_objects(path))


def test_jsonl_reads_a_bom_and_crlf(tmp_path: Path) -> None:
    path = _write(tmp_path / "f.jsonl", b'\xef\xbb\xbf{"a": 1}\r\n\r\n{"a": 2}\r\n')
    assert [obj["a"] for _, obj in iter_json_objects(path)] == [1, 2]


def test_jsonl_fake_gzip_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "f.gz", b'{"a": 1}\n')
    with pytest.raises(InputError, match=r"not a readable \.gz file"):
        list(iter_json_objects(path))


@pytest.mark.parametrize("label", ["1.0", "0.0", "1e0", '"true"', '"1"', "null"])
def test_pair_labels_are_the_integers_0_and_1_or_true_and_false(tmp_path: Path, label: str) -> None:
    line = f'{{"evidence": "e", "claim": "c", "label": {label}}}\n'
    path = _write(tmp_path / "p.jsonl", line.encode())
    with pytest.raises(InputError, match=r"p.jsonl:1: .*label \(1 or 0, or true / false\)"):
        read_pair_items(path)


def test_json_booleans_are_pair_labels_as_calibrate_scores_takes_them(tmp_path: Path) -> None:
    """Audit: eval claims refused true/false while calibrate scores took them."""
    lines = b'{"evidence": "e", "claim": "c", "label": true}\n'
    lines += b'{"evidence": "e", "claim": "d", "label": false}\n'
    items = read_pair_items(_write(tmp_path / "p.jsonl", lines))
    assert [i.label for i in items] == [1, 0]


def test_undefined_numbers_are_null_not_nan() -> None:
    out = finite_or_none({"auroc": float("nan"), "n": 2, "accuracy": 1.0})
    assert out == {"auroc": None, "n": 2, "accuracy": 1.0}
    json.dumps(out, allow_nan=False)


def test_a_policy_key_given_twice_is_refused() -> None:
    text = "schema_version: 1\nname: a\nname: b\n"
    with pytest.raises(ConfigError, match="duplicate key 'name'"):
        parse_policy(text, "p.yaml")


_PROFILES_WITH_ANCHORS = """\
schema_version: 1
name: anchors
profiles:
  base: &base
    max_hallucination_rate: 0.2
    escalate_on_block: true
  strict:
    <<: *base
    max_hallucination_rate: 0.05
default_profile: base
"""


def test_policy_merge_keys_work_and_may_override_what_they_merge() -> None:
    """Audit: ``<<: *base`` was refused with PyYAML's 'could not determine a constructor'."""
    config = parse_policy(_PROFILES_WITH_ANCHORS, "p.yaml")
    base, strict = config.profiles["base"], config.profiles["strict"]
    assert strict.escalate_on_block and base.escalate_on_block
    assert (base.max_hallucination_rate, strict.max_hallucination_rate) == (0.2, 0.05)


def test_a_key_given_twice_beside_a_merge_key_is_still_refused() -> None:
    text = _PROFILES_WITH_ANCHORS.replace(
        "    max_hallucination_rate: 0.05\n",
        "    max_hallucination_rate: 0.05\n    max_hallucination_rate: 0.1\n",
    )
    with pytest.raises(ConfigError, match="duplicate key 'max_hallucination_rate'"):
        parse_policy(text, "p.yaml")


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS", "", "bootstrap_servers must be host"),
        ("GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS", "host:99999", "ports in"),
        ("GUARDRAIL_KAFKA__GROUP_ID", " ", "GUARDRAIL_KAFKA__GROUP_ID"),
        ("GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS", "99999999999999999999999", "less than or equal"),
        ("GUARDRAIL_KAFKA", "", "takes a JSON object"),
        ("GUARDRAIL_KAFKA", "not json", "takes a JSON object"),
        ("GUARDRAIL_SHUTDOWN_GRACE_MS__X", "5", "GUARDRAIL_SHUTDOWN_GRACE_MS__X"),
        ("GUARDRAIL_GC_FREEZE__ENABLED", "false", "GUARDRAIL_GC_FREEZE__ENABLED"),
        ("GUARDRAIL_COVERAGE__REPORT_INTERVAL_S", "inf", "finite"),
        ("GUARDRAIL_JUDGE__COOLDOWN_S", "inf", "finite"),
        ("GUARDRAIL_SHUTDOWN_GRACE_MS", "0", "greater than or equal to 1"),
        # a wrong type says what is allowed, not only that the value is wrong
        ("GUARDRAIL_SIGNALS__CLAIMS", "maybe", r"\(got 'maybe'\); allowed: true or false"),
        ("GUARDRAIL_JOIN__TTL_MS", "abc", r"\(got 'abc'\); allowed: a whole number"),
    ],
)
def test_bad_settings_fail_fast(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, match: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=match):
        Settings.load()


def test_empty_sasl_credentials_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "GUARDRAIL_KAFKA__SASL_MECHANISM": "PLAIN",
        "GUARDRAIL_KAFKA__SASL_USERNAME": "",
        "GUARDRAIL_KAFKA__SASL_PASSWORD": "",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="needs sasl_username, sasl_password"):
        Settings.load()


def test_header_tenancy_needs_a_header_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUARDRAIL_TENANCY__SOURCE", "header")
    monkeypatch.setenv("GUARDRAIL_TENANCY__HEADER", "")
    with pytest.raises(ConfigError, match="GUARDRAIL_TENANCY__HEADER"):
        Settings.load()


def test_config_show_hides_passwords_in_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUARDRAIL_QDRANT__URL", "https://reader:s3cret-pw@qdrant:6333")
    monkeypatch.setenv("GUARDRAIL_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("GUARDRAIL_KAFKA__SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("GUARDRAIL_KAFKA__SASL_USERNAME", "svc")
    monkeypatch.setenv("GUARDRAIL_KAFKA__SASL_PASSWORD", "kafka-pw")
    shown = json.dumps(Settings.load().redacted())
    assert "s3cret-pw" not in shown and "kafka-pw" not in shown
    assert "https://reader:**********@qdrant:6333" in shown


async def test_a_port_in_use_or_a_foreign_address_is_a_config_error() -> None:
    # was an OSError traceback from `guardrail run`
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"cannot listen on 127.0.0.1:{port}.*free port"):
            await HealthServer("127.0.0.1", port, dict, dict).start()
    with pytest.raises(ConfigError, match="GUARDRAIL_HTTP__HOST"):
        await HealthServer("not an ip", 0, dict, dict).start()


def test_the_prometheus_port_in_use_is_a_config_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match="GUARDRAIL_METRICS__PROMETHEUS_PORT"):
            configure_from_env(port, "127.0.0.1")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            b'{"topic": "retrieval", "raw": "{}", "headers": [1]}\n',
            r":1: headers must be an object",
        ),
        (b'{"event_type": "retrieval"}\n\xff\n', r":2: not UTF-8 \(byte 0xff"),
    ],
)
def test_replay_files_are_checked_line_by_line(tmp_path: Path, data: bytes, match: str) -> None:
    path = _write(tmp_path / "events.jsonl", data)
    with pytest.raises(ConfigError, match=match):
        load_file(path, Settings.load())
    with pytest.raises(ConfigError, match="is not a file"):
        load_file(tmp_path, Settings.load())


async def test_replay_without_a_broker_says_where_it_looked() -> None:
    settings = Settings.load(kafka={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    with pytest.raises(BrokerError, match=r"cannot reach Kafka at 127\.0\.0\.1"):
        await send(settings, [])


def test_retrieval_corpora_are_read_by_the_same_checked_reader(tmp_path: Path) -> None:
    # calibrate / eval retrieval read corpora with their own reader, which still raised
    # UnicodeDecodeError; gzip is found by its magic bytes, whatever the file's name
    bad = _write(tmp_path / "nq.jsonl", b'{"question": "q"}\n\xfe\n')
    with pytest.raises(InputError, match=r"nq.jsonl:2: not UTF-8"):
        list(read_jsonl(bad))
    packed = _write(tmp_path / "nq.data", gzip.compress(b'\n{"question": "q"}\n'))
    assert list(read_jsonl(packed)) == [(1, {"question": "q"})]


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("GUARDRAIL_TOPICS__VERDICTS", ".", "not a legal Kafka topic name"),
        ("GUARDRAIL_TOPICS__DLQ", "..", "not a legal Kafka topic name"),
        ("GUARDRAIL_TOPICS__REPLICATION_FACTOR", "40000", "less than or equal to 32767"),
        ("GUARDRAIL_TOPICS__MAX_MESSAGE_BYTES", str(2**31), "less than or equal"),
        ("GUARDRAIL_KAFKA__SSL_CAFILE", "", "GUARDRAIL_KAFKA__SSL_CAFILE"),
    ],
)
def test_settings_kafka_would_refuse_later_are_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, match: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=match):
        Settings.load()


def test_topics_create_with_zero_partitions_is_refused_not_defaulted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topics", "create", "--partitions", "0", "--bootstrap-servers", "x:1"]) == 2
    assert "GUARDRAIL_TOPICS__PARTITIONS" in capsys.readouterr().err


def test_demo_reads_its_events_before_it_starts_a_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_broker(*args: object, **kwargs: object) -> None:
        raise AssertionError("a broker was started for a file that cannot be replayed")

    monkeypatch.setattr(demo, "LocalKafka", no_broker)
    monkeypatch.setattr(demo, "ensure_jars", no_broker)
    with pytest.raises(ConfigError, match="is not a file"):
        demo.run_demo(tmp_path / "missing.jsonl")
    bad = _write(tmp_path / "bad.jsonl", b"{}\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: a line is either an event"):
        demo.run_demo(bad)
    # --real without --questions reads the shared data beside the checkout: from elsewhere
    # it said so only after the broker and the sidecar were up
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"--real reads the NQ-open questions and passages"):
        demo.run_demo(real=3)
    with pytest.raises(ConfigError, match="no such file"):
        demo.run_demo(real=3, questions=tmp_path / "nq.jsonl.gz")


@pytest.mark.parametrize(
    ("protocol", "name", "wanted"),
    [
        ("PLAINTEXT", "GUARDRAIL_KAFKA__SASL_USERNAME", "SASL_SSL or SASL_PLAINTEXT"),
        ("SSL", "GUARDRAIL_KAFKA__SASL_USERNAME", "SASL_SSL or SASL_PLAINTEXT"),
        ("PLAINTEXT", "GUARDRAIL_KAFKA__SSL_CAFILE", "SSL or SASL_SSL"),
        ("SASL_PLAINTEXT", "GUARDRAIL_KAFKA__SSL_CAFILE", "SSL or SASL_SSL"),
    ],
)
def test_security_settings_the_protocol_ignores_are_refused(
    monkeypatch: pytest.MonkeyPatch, protocol: str, name: str, wanted: str
) -> None:
    monkeypatch.setenv("GUARDRAIL_KAFKA__SECURITY_PROTOCOL", protocol)
    if protocol.startswith("SASL"):
        for var, value in (("MECHANISM", "PLAIN"), ("USERNAME", "u"), ("PASSWORD", "p")):
            monkeypatch.setenv(f"GUARDRAIL_KAFKA__SASL_{var}", value)
    monkeypatch.setenv(name, "/etc/ca.pem" if "SSL_" in name else "svc")
    with pytest.raises(ConfigError, match=rf"does not use them: .*{wanted}"):
        Settings.load()


@pytest.mark.timeout(60)
def test_a_fifo_where_the_calibration_belongs_stops_the_check_instead_of_hanging_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A FIFO blocks its reader until something writes to it: `guardrail run --check` hung
    # on a calibration path that was one (the CLI audit). A device or a directory is no
    # file either.
    shipped = Path(__file__).resolve().parents[2] / "models"
    models = tmp_path / "models"
    for entry in shipped.iterdir():
        (models / entry.name).parent.mkdir(exist_ok=True)
        if entry.name != "conformal":
            (models / entry.name).symlink_to(entry)
    (models / "conformal").mkdir()
    os.mkfifo(models / "conformal" / "nq-open-minilm.json")
    monkeypatch.setenv("GUARDRAIL_MODELS__DIR", str(models))
    assert main(["run", "--check"]) == 1
    err = capsys.readouterr().err
    assert "nq-open-minilm.json is not a regular file (a FIFO)" in err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_confidence_files_and_hashes_refuse_what_is_not_a_file(tmp_path: Path, kind: str) -> None:
    from sidecar.confidence.model import ConfidenceModel
    from sidecar.confidence.scorer import CalibratedConfidenceScorer
    from sidecar.exceptions import ArtifactError
    from sidecar.hashing import sha256_file

    shipped = Path(__file__).resolve().parents[2] / "models" / "confidence"
    [model_dir] = [p for p in shipped.iterdir() if (p / "card.json").is_file()][:1]
    target = tmp_path / "confidence"
    target.mkdir()
    for entry in model_dir.iterdir():
        if entry.name != "card.json":
            (target / entry.name).symlink_to(entry)
    card = target / "card.json"
    if kind == "fifo":
        os.mkfifo(card)
    else:
        card.mkdir()
    with pytest.raises(ArtifactError, match=r"card\.json is not a regular file"):
        CalibratedConfidenceScorer.from_dir(target)
    with pytest.raises(ArtifactError, match="is not a regular file"):
        ConfidenceModel.load(card)
    with pytest.raises(OSError, match="is not a regular file"):
        sha256_file(card)


def test_an_output_path_that_is_a_directory_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: ``calibrate scores --out DIR`` ended in an IsADirectoryError traceback."""
    data = _write(tmp_path / "s.jsonl", b'{"scores": [0.9, 0.2], "labels": [true, false]}\n')
    out = tmp_path / "already-a-directory"
    out.mkdir()
    code = main(["calibrate", "scores", "--data", str(data), "--out", str(out), "--allow-vacuous"])
    assert code == 1
    assert capsys.readouterr().err == f"guardrail: {out}: Is a directory\n"
    assert (
        list(out.iterdir()) == []
        and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    )
