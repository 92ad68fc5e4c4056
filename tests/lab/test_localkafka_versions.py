"""The lab broker's release is selectable (KAFKA_LOCAL_VERSION): 3.x brokers get
their own jar directory, log4j 1, and a static KRaft voter set instead of --standalone."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sidecar.exceptions import ConfigError, LocalKafkaError
from sidecar.lab.localkafka.broker import (
    KAFKA_VERSION,
    VERSION_ENV,
    LocalKafka,
    ensure_jars,
    jars_version,
    kafka_version,
    lib_for,
)


def _lib(tmp_path: Path, version: str) -> Path:
    lib = tmp_path / f"lib-{version}"
    lib.mkdir()
    (lib / f"kafka_2.13-{version}.jar").touch()
    return lib


def test_the_version_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VERSION_ENV, raising=False)
    assert kafka_version() == KAFKA_VERSION == "4.3.1"
    monkeypatch.setenv(VERSION_ENV, " ")
    assert kafka_version() == KAFKA_VERSION
    monkeypatch.setenv(VERSION_ENV, "3.7.2")
    assert kafka_version() == "3.7.2"


@pytest.mark.parametrize(("value", "message"), [("latest", "MAJOR.MINOR.PATCH"), ("3.4.1", "3.5")])
def test_a_version_the_lab_cannot_run_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv(VERSION_ENV, value)
    with pytest.raises(ConfigError, match=message):
        kafka_version()


def test_each_release_has_its_own_jar_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VERSION_ENV, raising=False)
    assert lib_for(tmp_path) == tmp_path / "lib"  # the default's directory is unchanged
    assert lib_for(tmp_path, "3.9.2") == tmp_path / "lib-3.9.2"
    monkeypatch.setenv(VERSION_ENV, "3.7.2")
    assert lib_for(tmp_path) == tmp_path / "lib-3.7.2"


def test_the_jars_name_their_release(tmp_path: Path) -> None:
    assert jars_version(tmp_path) is None
    (tmp_path / "kafka_2.13-3.9.2-test.jar").touch()  # not the broker's jar
    (tmp_path / "kafka-clients-3.9.2.jar").touch()
    assert jars_version(tmp_path) is None
    (tmp_path / "kafka_2.13-3.9.2.jar").touch()
    assert jars_version(tmp_path) == "3.9.2"
    (tmp_path / "kafka_2.13-4.3.1.jar").touch()
    with pytest.raises(LocalKafkaError, match="several Kafka releases"):
        jars_version(tmp_path)


def test_ensure_jars_never_mixes_two_releases(tmp_path: Path) -> None:
    lib = _lib(tmp_path, KAFKA_VERSION)
    assert ensure_jars(lib, KAFKA_VERSION) == lib.resolve()  # there: nothing fetched
    with pytest.raises(LocalKafkaError, match=r"holds Kafka 4\.3\.1's jars, not 3\.9\.2's"):
        ensure_jars(lib, "3.9.2")


@pytest.mark.parametrize(("version", "kafka3"), [("3.7.2", True), ("4.3.1", False)])
def test_ensure_jars_asks_maven_for_the_release_and_its_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, kafka3: bool
) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        (tmp_path / "lib" / f"kafka_2.13-{version}.jar").touch()
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(subprocess, "run", run)
    assert ensure_jars(tmp_path / "lib", version) == (tmp_path / "lib").resolve()
    (cmd,) = calls
    assert f"-Dkafka.version={version}" in cmd
    assert ("-Dkafka3" in cmd) is kafka3


def _format_command(broker: LocalKafka, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(subprocess, "run", run)
    broker._format(broker._write_config())
    (cmd,) = calls
    return cmd


def test_a_3x_broker_gets_static_voters_and_log4j_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = LocalKafka(
        tmp_path / "instance", _lib(tmp_path, "3.7.2"), port=19092, controller_port=19093
    )
    assert broker.version == "3.7.2"
    props = broker._write_config().read_text()
    assert "\ncontroller.quorum.voters=1@127.0.0.1:19093\n" in props
    assert "controller.quorum.bootstrap.servers" not in props
    assert "\nlisteners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093\n" in props
    assert "\nadvertised.listeners=PLAINTEXT://127.0.0.1:19092\n" in props
    cmd = _format_command(broker, monkeypatch)
    assert "--standalone" not in cmd  # never with controller.quorum.voters
    assert f"-Dlog4j.configuration=file:{tmp_path / 'instance' / 'log4j.properties'}" in cmd
    assert (
        "kafka.server.KafkaRaftServer=INFO"
        in (tmp_path / "instance" / "log4j.properties").read_text()
    )
    assert broker.status()["kafka_version"] == "3.7.2"


def test_a_4x_broker_is_configured_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = LocalKafka(
        tmp_path / "instance", _lib(tmp_path, KAFKA_VERSION), port=19092, controller_port=19093
    )
    props = broker._write_config().read_text()
    assert "\ncontroller.quorum.bootstrap.servers=127.0.0.1:19093\n" in props
    assert "controller.quorum.voters" not in props
    listeners = "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert f"\nadvertised.listeners={listeners}\n" in props
    cmd = _format_command(broker, monkeypatch)
    assert "--standalone" in cmd
    assert f"-Dlog4j2.configurationFile={tmp_path / 'instance' / 'log4j2.properties'}" in cmd


def _running_from(instance: Path, port: int, version: str) -> None:
    """``instance`` as a start of a ``version`` broker on ``port`` left it, its pid alive
    (this process stands in for the broker's)."""
    instance.mkdir(parents=True, exist_ok=True)
    (instance / "broker.pid").write_text(str(os.getpid()))
    ports = {"port": port, "controller_port": port + 1, "kafka_version": version}
    (instance / "ports.json").write_text(json.dumps(ports))


def test_a_start_of_another_release_is_refused_while_one_runs_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`KAFKA_LOCAL_VERSION=3.7.2 guardrail kafka start` while the 4.3.1 broker ran from the
    same home said "ready" (the 4.3.1 one answered on the port) and `status` said 3.7.2."""
    with socket.socket() as serving:
        serving.bind(("127.0.0.1", 0))
        serving.listen()
        port = serving.getsockname()[1]
        _running_from(tmp_path / "broker", port, KAFKA_VERSION)
        broker = LocalKafka(tmp_path / "broker", _lib(tmp_path, "3.7.2"), port=port)
        assert broker.status()["kafka_version"] == KAFKA_VERSION  # the one running
        with pytest.raises(LocalKafkaError, match=f"a Kafka {KAFKA_VERSION} broker .* already"):
            broker.start()
        again = LocalKafka(tmp_path / "broker", _lib(tmp_path, KAFKA_VERSION), port=port)
        again.start()  # the same broker asked for again: it is there


def test_a_start_on_another_port_names_the_broker_that_runs(tmp_path: Path) -> None:
    """`guardrail kafka start` (port 9092) beside a broker started with --port 19092 said
    "a broker process is running … but port 9092 is closed", not which one, nor what to do."""
    _running_from(tmp_path / "broker", 19092, KAFKA_VERSION)
    broker = LocalKafka(tmp_path / "broker", _lib(tmp_path, KAFKA_VERSION), port=19094)
    with pytest.raises(LocalKafkaError, match=r"127.0.0.1:19092: stop it first"):
        broker.start()


def test_data_another_release_formatted_is_refused_before_java_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home whose broker was 4.3.1, stopped and started again as 3.7.2: Kafka 3.7.2 died on
    4.3.1's metadata with a Java stack trace ("No MetadataVersion with metadata version 30")."""
    instance = tmp_path / "broker"
    (instance / "data").mkdir(parents=True)
    (instance / "data" / "meta.properties").touch()
    (instance / "formatted-by").write_text(KAFKA_VERSION)

    def no_java(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"java ran: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_java)
    monkeypatch.setattr(subprocess, "run", no_java)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    broker = LocalKafka(instance, _lib(tmp_path, "3.7.2"), port=19092, controller_port=19093)
    with pytest.raises(LocalKafkaError, match=f"Kafka {KAFKA_VERSION} broker, which Kafka 3.7.2"):
        broker.start()


def test_formatting_records_the_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = LocalKafka(
        tmp_path / "instance", _lib(tmp_path, "3.7.2"), port=19092, controller_port=19093
    )
    _format_command(broker, monkeypatch)
    assert (tmp_path / "instance" / "formatted-by").read_text() == "3.7.2"
    assert json.loads((tmp_path / "instance" / "ports.json").read_text())["kafka_version"] == (
        "3.7.2"
    )


def test_a_home_whose_data_was_removed_starts_any_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the refusal says to do (remove the data) is enough: the next start formats."""
    instance = tmp_path / "broker"
    instance.mkdir()
    (instance / "formatted-by").write_text(KAFKA_VERSION)  # its data/ removed since
    broker = LocalKafka(instance, _lib(tmp_path, "3.7.2"), port=19092, controller_port=19093)
    started: list[list[str]] = []

    def popen(cmd: list[str], **_: Any) -> Any:
        started.append(cmd)
        raise OSError("stop here")

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(
        subprocess, "run", lambda cmd, **_: subprocess.CompletedProcess(cmd, 0, "", "")
    )
    with pytest.raises(OSError, match="stop here"):
        broker.start()
    assert started and (instance / "formatted-by").read_text() == "3.7.2"
