"""SASL/SCRAM against a real broker configured for it; credentials never leak, and a
password rotated on the broker and in GUARDRAIL_KAFKA__SASL_PASSWORD_FILE reaches the
connections opened after it without a restart."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from sidecar.config import TOPIC_ROLES, Settings
from sidecar.exceptions import SidecarNotReadyError
from sidecar.kafka.security import aiokafka_client_args
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from sidecar.lab.replay import Record, send
from sidecar.secretfile import check_secret_files
from tests.conftest import EventFactory, dumps, kafka_lib

pytestmark = pytest.mark.connected

USER, PASSWORD = "guardrail", "s3cret-Scram-Pa55word"
# a user of its own for the rotation test: the others keep their password
ROTATED_USER, OLD_PASSWORD, NEW_PASSWORD = "rotated", "0ld-Rotating-Pa55", "n3w-Rotated-Pa55"


@pytest.fixture(scope="module")
def scram_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    instance = tmp_path_factory.mktemp("kafka-scram")
    broker = LocalKafka(
        instance,
        kafka_lib(),
        port=free_port(),
        controller_port=free_port(),
        sasl_port=free_port(),
        scram_users={USER: PASSWORD, ROTATED_USER: OLD_PASSWORD},
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(instance, ignore_errors=True)


def sasl_env(broker: LocalKafka, topics: dict[str, str], password: str) -> dict[str, str]:
    assert broker.sasl_bootstrap_servers is not None
    return {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": broker.sasl_bootstrap_servers,
        "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GUARDRAIL_KAFKA__SASL_MECHANISM": "SCRAM-SHA-256",
        "GUARDRAIL_KAFKA__SASL_USERNAME": USER,
        "GUARDRAIL_KAFKA__SASL_PASSWORD": password,
        "GUARDRAIL_KAFKA__GROUP_ID": topics["group"],
        "GUARDRAIL_LOG_LEVEL": "DEBUG",
        **{f"GUARDRAIL_TOPICS__{n.upper()}": topics[n] for n in TOPIC_ROLES},
    }


def as_files(env: dict[str, str], where: Path) -> dict[str, str]:
    """``env`` with the SASL username and password in files (a mounted Secret's)."""
    out = dict(env)
    for name in ("USERNAME", "PASSWORD"):
        path = where / f"sasl-{name.lower()}"
        path.write_text(out.pop(f"GUARDRAIL_KAFKA__SASL_{name}") + "\n")
        out[f"GUARDRAIL_KAFKA__SASL_{name}_FILE"] = str(path)
    return out


@pytest.mark.parametrize("given_as", ["variable", "file"])
async def test_scram_sidecar_decides_and_never_logs_the_password(
    scram_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    given_as: str,
) -> None:
    env = sasl_env(scram_broker, unique_topics, PASSWORD)
    if given_as == "file":  # GUARDRAIL_KAFKA__SASL_*_FILE through FastStream's clients
        env = as_files(env, tmp_path)
    topics = {n: unique_topics[n] for n in TOPIC_ROLES}
    settings = Settings.load(
        kafka={
            "bootstrap_servers": scram_broker.sasl_bootstrap_servers,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": USER,
            "sasl_password": PASSWORD,
        },
        topics=topics,
    )
    await create_topics(settings)  # the admin client authenticates too
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    await asyncio.to_thread(sidecar.start)
    await send(
        settings,
        [
            Record(topics["retrieval"], b"req-s", dumps(retrieval_event("req-s"))),
            Record(topics["generation"], b"req-s", dumps(final_event("req-s"))),
        ],
    )
    consumer = AIOKafkaConsumer(
        topics["verdicts"],
        bootstrap_servers=scram_broker.bootstrap_servers,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        got = await asyncio.wait_for(consumer.getone(), timeout=30)
    finally:
        await consumer.stop()
    assert got.key == b"req-s"
    assert sidecar.signal(signal.SIGTERM) == 0
    log = (tmp_path / "sidecar.log").read_text()
    assert "DEBUG" in log and PASSWORD not in log


def test_wrong_password_fails_at_start_without_leaking_it(
    scram_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    wrong = "not-the-Pa55word-xyz"
    sidecar = SidecarProcess(sasl_env(scram_broker, unique_topics, wrong), tmp_path / "bad.log")
    with pytest.raises(SidecarNotReadyError):
        sidecar.start(timeout_s=45)
    if sidecar.pid is not None:
        sidecar.signal(signal.SIGKILL)
    log = (tmp_path / "bad.log").read_text()
    assert wrong not in log
    # audit: said "cannot reach Kafka", naming the bootstrap servers and the timeout
    assert "refused this client's authentication (SaslAuthenticationFailed" in log, log
    assert "__SASL_USERNAME and __SASL_PASSWORD" in log and "cannot reach Kafka" not in log
    assert sidecar.proc is not None and sidecar.proc.returncode == 2  # a configuration error


async def _reconnects(producer: AIOKafkaProducer) -> bool:
    """Whether the producer's client, its connections closed, opens and authenticates a
    new one (as after a broker's restart or an idle connection's close)."""
    client = producer.client
    node = next(iter(client.cluster.brokers())).nodeId
    for conn in list(client._conns.values()):
        conn.close()
    return bool(await client.ready(node))


async def test_a_password_rotated_in_its_file_authenticates_new_connections(
    scram_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    """The operator changes the user's SCRAM password on the broker, then the mounted
    Secret: a client made before both opens its next connection with the new password
    once the file was read again. Before, the password was an environment variable read
    at start, and every connection after the broker's change was refused until a restart."""
    secret = tmp_path / "sasl-password"
    secret.write_text(OLD_PASSWORD + "\n")  # as `kubectl create secret --from-file` often holds
    settings = Settings.load(
        kafka={
            "bootstrap_servers": scram_broker.sasl_bootstrap_servers,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": ROTATED_USER,
            "sasl_password_file": str(secret),
        },
        topics={n: unique_topics[n] for n in TOPIC_ROLES},
    )
    await create_topics(settings)
    producer = AIOKafkaProducer(**aiokafka_client_args(settings.kafka))
    await producer.start()  # authenticated with the old password
    try:
        await asyncio.to_thread(scram_broker.set_scram_password, ROTATED_USER, NEW_PASSWORD)
        refused = False
        for _ in range(50):  # the broker applies the change through its metadata log
            if not await _reconnects(producer):
                refused = True
                break
            await asyncio.sleep(0.2)
        assert refused, "the broker still accepts the old password"
        secret.write_text(NEW_PASSWORD + "\n")
        assert not await _reconnects(producer)  # the file is not read between looks
        said = check_secret_files()  # the sidecar's 30 s look
        assert any("the secret changed on disk" in line for _, line in said), said
        assert all(NEW_PASSWORD not in line and OLD_PASSWORD not in line for _, line in said)
        assert await _reconnects(producer)
        await producer.send_and_wait(unique_topics["verdicts"], b"after the rotation")
    finally:
        await producer.stop()
    fresh = AIOKafkaProducer(**aiokafka_client_args(settings.kafka))
    await fresh.start()  # a client made after the look authenticates too
    await fresh.stop()


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "create"],
        ["dlq", "inspect", "--json"],
        ["dlq", "redrive", "--yes", "--reason", "internal-error"],
        ["certificates", "list"],
        ["certificates", "reinstate", "acme/wiki/dense"],
        ["verdicts", "--claims"],
    ],
    ids=[
        "topics",
        "dlq-inspect",
        "dlq-redrive",
        "certificates-list",
        "certificates-reinstate",
        "verdicts",
    ],
)
def test_the_commands_authenticate_with_the_credential_files(
    scram_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path, argv: list[str]
) -> None:
    """The commands read the settings ``run`` reads, the ..._FILE ones too."""
    env = as_files(sasl_env(scram_broker, unique_topics, PASSWORD), tmp_path)
    outside = {k: v for k, v in os.environ.items() if not k.startswith("GUARDRAIL_")}
    if argv[0] != "topics":
        create = subprocess.run(
            [sys.executable, "-m", "sidecar", "topics", "create"],
            env=outside | env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert create.returncode == 0, create.stderr[-3000:]
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", *argv],
        env=outside | env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if argv[1] == "reinstate":  # read the topic as it authenticated: nothing withdrawn
        assert done.returncode == 2, done.stderr[-3000:]
        assert "acme/wiki/dense is not withdrawn" in done.stderr
    else:
        assert done.returncode == 0, done.stderr[-3000:]
    assert PASSWORD not in done.stdout + done.stderr
    wrong = tmp_path / "sasl-password"
    wrong.write_text("not-the-Pa55word\n")
    refused = subprocess.run(
        [sys.executable, "-m", "sidecar", *argv],
        env=outside | env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # the file is what the command authenticates with; dlq inspect said "cannot read
    # rag.dlq ... within 30 s: Unable to bootstrap" (exit 1), certificates list a traceback
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "refused this client's authentication (SaslAuthenticationFailed" in refused.stderr
    assert "__SASL_PASSWORD_FILE" in refused.stderr
    assert "not-the-Pa55word" not in refused.stdout + refused.stderr


async def test_a_user_rotated_with_its_password_in_their_files_authenticates(
    scram_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    """Vault's dynamic credentials: a new SCRAM user with its own password replaces the
    old; the Secret's two keys change together. A client made before connects as the new
    user once the files were read again."""
    user, password = tmp_path / "username", tmp_path / "password"
    user.write_text(USER + "\n")
    password.write_text(PASSWORD + "\n")
    settings = Settings.load(
        kafka={
            "bootstrap_servers": scram_broker.sasl_bootstrap_servers,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username_file": str(user),
            "sasl_password_file": str(password),
        },
        topics={n: unique_topics[n] for n in TOPIC_ROLES},
    )
    await create_topics(settings)
    producer = AIOKafkaProducer(**aiokafka_client_args(settings.kafka))
    await producer.start()
    try:
        new_user, new_password = f"v-{unique_topics['group'][-8:]}", "dyn4mic-Pa55word"
        await asyncio.to_thread(scram_broker.set_scram_password, new_user, new_password)
        user.write_text(new_user + "\n")
        password.write_text(new_password + "\n")
        said = check_secret_files()
        assert sum("the secret changed on disk" in line for _, line in said) >= 2, said
        assert all(new_password not in line for _, line in said)
        for _ in range(50):  # the broker applies the new user through its metadata log
            if await _reconnects(producer):
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the new user was never accepted")
        await producer.send_and_wait(unique_topics["verdicts"], b"as the new user")
    finally:
        await producer.stop()
