"""Fetch, format, start, wait for, and stop a KRaft Kafka broker: a single combined node,
or one node of a cluster (``sidecar.lab.localkafka.cluster``)."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.exceptions import ConfigError, LocalKafkaError

KAFKA_VERSION = "4.3.1"  # the default broker, and the one `make test` runs against
# another Apache Kafka release, e.g. 3.7.2; beside KAFKA_LOCAL_HOME, not GUARDRAIL_*: the
# sidecar refuses GUARDRAIL_* names that are no setting, and the tests pass the environment on
VERSION_ENV = "KAFKA_LOCAL_VERSION"
OLDEST_VERSION = (3, 5)  # KRaft formats with SCRAM users (--add-scram) since 3.5
POM = Path(__file__).with_name("pom.xml")
READY_LINE = "Kafka Server started"
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_BROKER_JAR = re.compile(r"kafka_2\.13-(\d+\.\d+\.\d+)\.jar")

LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = INFO
"""

# Kafka 3.x logs through log4j 1 (reload4j): the same console, level and ready line.
LOG4J1 = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
"""


def _parse_version(version: str) -> tuple[int, int, int]:
    match = _VERSION.fullmatch(version)
    if match is None:
        raise ConfigError(
            f"{VERSION_ENV}={version!r} is not an Apache Kafka release (MAJOR.MINOR.PATCH, "
            f"e.g. 3.9.2)"
        )
    parsed = (int(match[1]), int(match[2]), int(match[3]))
    if parsed[:2] < OLDEST_VERSION:
        oldest = ".".join(map(str, OLDEST_VERSION))
        raise ConfigError(
            f"{VERSION_ENV}={version}: the lab broker runs KRaft with SCRAM users formatted in, "
            f"which needs Kafka {oldest} or later"
        )
    return parsed


def major_version(version: str) -> int:
    """3 for ``3.7.2``: the 3.x brokers configure KRaft and log differently from 4.x."""
    return _parse_version(version)[0]


def kafka_version() -> str:
    """The broker release to run: ``$KAFKA_LOCAL_VERSION`` or :data:`KAFKA_VERSION`."""
    version = os.environ.get(VERSION_ENV, "").strip() or KAFKA_VERSION
    _parse_version(version)
    return version


def lib_for(home: Path, version: str | None = None) -> Path:
    """Where a release's jars live under ``home``: ``lib`` for the default, else ``lib-V``.

    Each release has its own directory, so switching versions never mixes two brokers'
    jars on one classpath nor re-fetches the default's.
    """
    version = version or kafka_version()
    return home / ("lib" if version == KAFKA_VERSION else f"lib-{version}")


def jars_version(lib_dir: Path) -> str | None:
    """The release whose ``kafka_2.13-V.jar`` is in ``lib_dir`` (None: no broker jar)."""
    found = sorted(
        match[1]
        for jar in lib_dir.glob("kafka_2.13-*.jar")
        if (match := _BROKER_JAR.fullmatch(jar.name)) is not None
    )
    if len(found) > 1:
        raise LocalKafkaError(
            f"{lib_dir} holds the jars of several Kafka releases ({', '.join(found)}); "
            "each release needs a directory of its own (lib_for)"
        )
    return found[0] if found else None


def default_home() -> Path:
    """``$KAFKA_LOCAL_HOME`` or ``./.kafka`` (git-ignored)."""
    return Path(os.environ.get("KAFKA_LOCAL_HOME", ".kafka")).resolve()


def ensure_jars(lib_dir: Path | None = None, version: str | None = None) -> Path:
    """Fetch the jars of ``version`` (default :func:`kafka_version`) unless they are there."""
    version = version or kafka_version()
    major = major_version(version)
    lib = (lib_dir or lib_for(default_home(), version)).resolve()
    present = jars_version(lib) if lib.is_dir() else None
    if present == version:
        return lib
    if present is not None:
        raise LocalKafkaError(
            f"{lib} holds Kafka {present}'s jars, not {version}'s: give each release its own "
            f"directory (lib_for(home, version) is {lib_for(lib.parent, version)})"
        )
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalKafkaError("Maven (mvn) is not on PATH; it is needed to fetch the Kafka jars")
    lib.mkdir(parents=True, exist_ok=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-Dkafka.lib.dir={lib}",
        f"-Dkafka.version={version}",
    ]
    if major < 4:
        cmd.append("-Dkafka3")  # the pom's log4j 1 (reload4j) binding
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not (lib / f"kafka_2.13-{version}.jar").exists():
        raise LocalKafkaError(
            f"fetching Kafka {version} jars failed (exit {result.returncode}):\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    return lib


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_BELOW_EPHEMERAL = (10_000, 32_767)  # where the kernel never picks a connection's own port
_PORTS = random.Random()  # noqa: S311 - a port number, not a secret


def free_port() -> int:
    """A port free to listen on now, outside the kernel's ephemeral range when it can be.

    A port the kernel picked (bind to 0) is in the ephemeral range: until the caller's
    process listens on it, any outgoing connection (the tests' Kafka clients, the
    broker's own) may take it as its local port, and the listen fails with "address
    already in use" (a sidecar's health port, once in a full test run).
    """
    low, high = _BELOW_EPHEMERAL
    try:
        first = int(_EPHEMERAL.read_text().split()[0])
        high = min(high, first - 1)
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(50):
        port = _PORTS.randint(low, high) if high > low else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_cluster_id() -> str:
    """A KRaft cluster id (16 random bytes, URL-safe base64 without padding; never starting
    with ``-``, which the format tool would read as an option)."""
    cluster_id = "-"
    while cluster_id.startswith("-"):
        raw = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii")
        cluster_id = raw.rstrip("=")
    return cluster_id


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as dead
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return waited == 0


@dataclass
class LocalKafka:
    """One broker instance living in ``instance_dir`` (data, logs, config, pid)."""

    instance_dir: Path
    lib_dir: Path
    port: int = 9092
    controller_port: int = 9093
    heap_mb: int = 768
    extra_properties: str = ""
    sasl_port: int | None = None  # a SASL_PLAINTEXT listener with SCRAM users, for auth tests
    scram_users: dict[str, str] = field(default_factory=dict)
    # A PROXIED listener (plaintext) bound on ``proxied_port`` but advertised at
    # ``proxied_advertised_port``, where a proxy forwards to it: clients that bootstrap
    # there are sent back to the proxy by the metadata, so all their traffic crosses it.
    # PLAINTEXT (clients that must not be slowed, inter-broker) and CONTROLLER are unchanged.
    proxied_port: int | None = None
    proxied_advertised_port: int | None = None
    # One node of a cluster: its id, the static voter set (``1@127.0.0.1:port,...``) and the
    # cluster id every node formats with (a lone node: 1, its own voter, a fresh id).
    node_id: int = 1
    voters: str | None = None
    cluster_id: str | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.proxied_port is None) != (self.proxied_advertised_port is None):
            raise ConfigError(
                "proxied_port and proxied_advertised_port go together (the listener's own port "
                f"and the proxy's), got {self.proxied_port} and {self.proxied_advertised_port}"
            )

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def version(self) -> str:
        """The release whose jars are in ``lib_dir`` (:data:`KAFKA_VERSION` when none are)."""
        return jars_version(self.lib_dir) or KAFKA_VERSION

    @property
    def _kafka3(self) -> bool:
        """A 3.x broker: static ``controller.quorum.voters``, no ``--standalone``, log4j 1.

        3.9 has dynamic quorums (``--standalone``) too, but a static voter set formats
        and starts on every 3.x that runs KRaft, so the lab uses it throughout 3.x.
        """
        return major_version(self.version) < 4

    @property
    def _static_quorum(self) -> bool:
        """A static voter set (``controller.quorum.voters``, formatted without
        ``--standalone``): on 3.x, and for a node of a cluster."""
        return self._kafka3 or self.voters is not None

    @property
    def _pid_file(self) -> Path:
        return self.instance_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.instance_dir / "logs" / "broker.out"

    def pid(self) -> int | None:
        try:
            pid = int(self._pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _alive(pid) else None

    @property
    def sasl_bootstrap_servers(self) -> str | None:
        return f"127.0.0.1:{self.sasl_port}" if self.sasl_port else None

    @property
    def proxied_bootstrap_servers(self) -> str | None:
        """The proxy's address: clients bootstrapping here stay behind the proxy."""
        port = self.proxied_advertised_port
        return f"127.0.0.1:{port}" if port else None

    def _write_config(self) -> Path:
        (self.instance_dir / "logs").mkdir(parents=True, exist_ok=True)
        data = self.instance_dir / "data"
        listeners = (
            f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
        )
        protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        advertised = listeners
        quorum = f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}"
        if self._kafka3:
            # 3.7 refuses a controller listener among a broker's advertised listeners (3.9 not)
            advertised = f"PLAINTEXT://127.0.0.1:{self.port}"
        if self._static_quorum:
            voters = self.voters or f"1@127.0.0.1:{self.controller_port}"
            quorum = f"controller.quorum.voters={voters}"
        if self.proxied_port is not None:
            listeners += f",PROXIED://127.0.0.1:{self.proxied_port}"
            advertised += f",PROXIED://127.0.0.1:{self.proxied_advertised_port}"
            protocols += ",PROXIED:PLAINTEXT"
        sasl = ""
        if self.sasl_port:
            listeners += f",SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
            advertised += f",SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
            protocols += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
            module = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            sasl = (
                "sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512\n"
                f"listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config={module}\n"
                f"listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config={module}\n"
            )
        props = f"""\
process.roles=broker,controller
node.id={self.node_id}
{quorum}
listeners={listeners}
advertised.listeners={advertised}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map={protocols}
{sasl}log.dirs={data}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
message.max.bytes=16777216
{self.extra_properties}
"""
        server = self.instance_dir / "server.properties"
        server.write_text(props)
        (self.instance_dir / "log4j2.properties").write_text(LOG4J2)
        (self.instance_dir / "log4j.properties").write_text(LOG4J1)
        ports: dict[str, int | str] = {
            "port": self.port,
            "controller_port": self.controller_port,
            "kafka_version": self.version,
        }
        if self.proxied_port is not None and self.proxied_advertised_port is not None:
            ports["proxied_port"] = self.proxied_port
            ports["proxied_advertised_port"] = self.proxied_advertised_port
        (self.instance_dir / "ports.json").write_text(json.dumps(ports))
        return server

    def _java(self, *args: str, heap_mb: int) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise LocalKafkaError("java is not on PATH; Kafka needs a Java 17+ runtime")
        logging = (
            f"-Dlog4j.configuration=file:{self.instance_dir / 'log4j.properties'}"
            if self._kafka3
            else f"-Dlog4j2.configurationFile={self.instance_dir / 'log4j2.properties'}"
        )
        return [
            java,
            f"-Xmx{heap_mb}m",
            logging,
            f"-Dkafka.logs.dir={self.instance_dir / 'logs'}",
            "-cp",
            f"{self.lib_dir}/*",
            *args,
        ]

    def _format(self, server: Path) -> None:
        if (self.instance_dir / "data" / "meta.properties").exists():
            return  # formatted before: a restart keeps its data
        cluster_id = self.cluster_id or new_cluster_id()
        scram: list[str] = []
        for user, password in self.scram_users.items():
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                scram += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
        # a static voter set in server.properties is the quorum (never both)
        standalone = [] if self._static_quorum else ["--standalone"]
        cmd = self._java(
            "kafka.tools.StorageTool",
            "format",
            *standalone,
            "-t",
            cluster_id,
            "-c",
            str(server),
            *scram,
            heap_mb=256,
        )
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise LocalKafkaError(
                f"formatting the KRaft storage failed:\n{result.stdout}{result.stderr}"
            )
        self._formatted_by_file.write_text(self.version)

    def set_scram_password(self, user: str, password: str, timeout_s: float = 60.0) -> None:
        """Give the SCRAM user ``user`` the password ``password`` on the running broker (both
        mechanisms; a new user is made), as an operator rotating it does with kafka-configs."""
        if not self.sasl_port:
            raise LocalKafkaError("set_scram_password needs a broker with sasl_port set")
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):  # one per request, or refused
            cmd = self._java(
                "kafka.admin.ConfigCommand",
                "--bootstrap-server",
                self.bootstrap_servers,
                "--alter",
                "--add-config",
                f"{mechanism}=[password={password}]",
                "--entity-type",
                "users",
                "--entity-name",
                user,
                heap_mb=256,
            )
            result = subprocess.run(
                cmd, capture_output=True, text=True, check=False, timeout=timeout_s
            )
            if result.returncode != 0:
                raise LocalKafkaError(  # not its output: its errors repeat the password
                    f"altering the {mechanism} credentials of {user} failed "
                    f"(exit {result.returncode})"
                )

    def _recorded(self) -> dict[str, Any]:
        """What the last start wrote to ``ports.json`` (ports, release); empty when none."""
        try:
            recorded = json.loads((self.instance_dir / "ports.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return recorded if isinstance(recorded, dict) else {}

    @property
    def _formatted_by_file(self) -> Path:
        return self.instance_dir / "formatted-by"

    def start(self, timeout_s: float = 90.0) -> None:
        """Start the broker (formatting on first use) and wait until it serves."""
        launched = self.launch()
        if launched is not None:
            self.await_ready(launched, timeout_s)

    def launch(self) -> int | None:
        """Start the broker's process (formatting on first use) without waiting for it: the
        offset in its log where this start's lines begin, for :meth:`await_ready` (None: it
        was running already). A cluster's nodes are launched together, since none of them
        serves before a majority of the voters is up."""
        running = self.pid()
        if running is not None:
            recorded = self._recorded()
            port, version = recorded.get("port", self.port), recorded.get("kafka_version")
            if port != self.port or version not in (None, self.version):
                which = f"a Kafka {version} broker" if version else "a broker"
                raise LocalKafkaError(
                    f"{which} (pid {running}) is already running from {self.instance_dir} "
                    f"on 127.0.0.1:{port}: stop it first (`guardrail kafka stop`), or start "
                    "this one in another home (--home or KAFKA_LOCAL_HOME)"
                )
            if _port_open(self.port):
                return None
            raise LocalKafkaError(
                f"a broker process is running from {self.instance_dir} "
                f"but port {self.port} is closed"
            )
        formatted = (self.instance_dir / "data" / "meta.properties").exists()
        formatted_by = (
            self._formatted_by_file.read_text().strip()
            if formatted and self._formatted_by_file.exists()
            else None
        )
        if formatted_by not in (None, self.version):
            data = self.instance_dir / "data"
            raise LocalKafkaError(
                f"{data} holds the data of a Kafka {formatted_by} broker, which Kafka "
                f"{self.version} cannot start on: remove it (rm -r {data}) to start afresh, "
                "or give each release a home of its own (--home or KAFKA_LOCAL_HOME)"
            )
        for port in (self.port, self.controller_port, self.proxied_port):
            if port is not None and _port_open(port):
                raise LocalKafkaError(
                    f"port {port} on 127.0.0.1 is already in use by something else"
                )
        server = self._write_config()
        self._format(server)
        cmd = self._java(
            "-server",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Xms256m",
            "kafka.Kafka",
            str(server),
            heap_mb=self.heap_mb,
        )
        before = self.log_file.stat().st_size if self.log_file.exists() else 0
        with self.log_file.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._proc = proc
        self._pid_file.write_text(str(proc.pid))
        return before

    def await_ready(self, before: int, timeout_s: float = 90.0) -> None:
        """Wait until the launched broker serves (its log from ``before`` says it started and
        its port accepts); stop it and raise when it exits or ``timeout_s`` passes."""
        proc = self._proc
        if proc is None:
            raise LocalKafkaError("await_ready() waits for a broker this object launched")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LocalKafkaError(
                    f"the broker exited with code {proc.returncode} during start:\n"
                    f"{self._log_tail(before)}"
                )
            if READY_LINE in self._log_tail(before, 1_000_000) and _port_open(self.port):
                return
            time.sleep(0.25)
        self.stop()
        raise LocalKafkaError(
            f"the broker was not ready within {timeout_s:.0f}s:\n{self._log_tail(before)}"
        )

    def _log_tail(self, start: int = 0, limit: int = 3000) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(start)
                text = f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return text[-limit:]

    def stop(self, timeout_s: float = 30.0, *, kill: bool = False) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout_s``); True if one ran."""
        pid = self.pid()
        if pid is None:
            self._pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.1)
        if self._proc is not None:
            self._proc.wait()
            self._proc = None
        self._pid_file.unlink(missing_ok=True)
        return True

    def status(self) -> dict[str, object]:
        pid = self.pid()
        return {
            "running": pid is not None,
            "pid": pid,
            "bootstrap_servers": self.bootstrap_servers,
            "serving": pid is not None and _port_open(self.port),
            "instance_dir": str(self.instance_dir),
            # the running broker's release, not the one $KAFKA_LOCAL_VERSION names now
            "kafka_version": self._recorded().get("kafka_version", self.version),
        }

    @classmethod
    def from_instance_dir(cls, instance_dir: Path, lib_dir: Path) -> LocalKafka:
        """Re-attach to an instance started earlier (its ports are on disk)."""
        ports = json.loads((instance_dir / "ports.json").read_text())
        return cls(
            instance_dir,
            lib_dir,
            port=ports["port"],
            controller_port=ports["controller_port"],
            proxied_port=ports.get("proxied_port"),
            proxied_advertised_port=ports.get("proxied_advertised_port"),
        )
