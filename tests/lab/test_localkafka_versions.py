"""The lab broker's release is selectable (KAFKA_LOCAL_VERSION): 3.x brokers get
their own jar directory, log4j 1, and a static KRaft voter set instead of --standalone."""

from __future__ import annotations

import shutil
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
