"""A SASL password read from a file reaches every Kafka client's next connection.

aiokafka copies ``sasl_plain_password`` into each client at construction and hands
that copy to every connection it opens; FastStream keeps the password in the
arguments it builds its producer, admin client and (per subscriber start) consumers
from. Without help a client made before a rotation authenticated with the old
password for good. Here ``create_conn`` is replaced by a recorder: what each client,
made before the rotation, gives its next connection. tests/kafka/test_sasl.py shows
the same against a real SCRAM broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from pathlib import Path
from typing import Any

import aiokafka.client
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError

from sidecar import runtime
from sidecar.config import Settings
from sidecar.kafka.app import make_broker
from sidecar.kafka.security import RotatingSecret, aiokafka_client_args, sasl_password
from sidecar.secretfile import SecretFile, check_secret_files

BEFORE, AFTER = "pa55-before-Rotation", "pa55-after-Rotation"


def _settings(path: Path) -> Settings:
    return Settings.load(
        kafka={
            "bootstrap_servers": "127.0.0.1:9",
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": "guardrail",
            "sasl_password_file": str(path),
        }
    )


async def test_clients_made_before_a_rotation_connect_with_the_new_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sasl-password"
    path.write_text(BEFORE + "\n")
    settings = _settings(path)
    given: list[str] = []

    async def create_conn(host: str, port: int, **kwargs: Any) -> None:
        given.append(kwargs["sasl_plain_password"])
        raise KafkaConnectionError("a recorder, not a broker")

    monkeypatch.setattr(aiokafka.client, "create_conn", create_conn)
    broker = make_broker(settings)  # FastStream: what its producer, admin, consumers get
    producer = AIOKafkaProducer(**broker._connection_kwargs)
    admin = AIOKafkaAdminClient(**aiokafka_client_args(settings.kafka))
    consumer = AIOKafkaConsumer(**aiokafka_client_args(settings.kafka))
    clients = [producer.client, admin._client, consumer._client]
    try:
        for client in clients:
            with pytest.raises(KafkaConnectionError):
                await client.bootstrap()
        assert given == [BEFORE] * 3
        path.write_text(AFTER + "\n")
        said = check_secret_files()
        assert any(str(path) in line for _, line in said)
        given.clear()
        for client in clients:
            with pytest.raises(KafkaConnectionError):
                await client.bootstrap()
        assert given == [AFTER] * 3
    finally:
        await producer.stop()
        await admin.close()
        await consumer.stop()
    assert all(type(p) is str for p in given)  # the connection gets the text, as before


def test_the_password_object_never_shows_the_password(tmp_path: Path) -> None:
    path = tmp_path / "sasl-password"
    path.write_text(BEFORE)
    password = sasl_password(_settings(path).kafka)
    assert isinstance(password, RotatingSecret)
    assert BEFORE not in repr(password) and str(path) in repr(password)
    assert BEFORE not in repr(make_broker(_settings(path))._connection_kwargs)


def test_a_password_given_as_a_variable_is_handed_over_as_it_is() -> None:
    settings = Settings.load(
        kafka={
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "guardrail",
            "sasl_password": BEFORE,
        }
    )
    assert type(aiokafka_client_args(settings.kafka)["sasl_plain_password"]) is str


async def test_a_client_made_before_the_first_password_file_reads_its_own_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(AIOKafkaClient, "_sasl_plain_password", raising=False)  # a fresh process
    plain = AIOKafkaClient(
        bootstrap_servers="127.0.0.1:9",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="guardrail",
        sasl_plain_password=BEFORE,
    )
    path = tmp_path / "sasl-password"
    path.write_text(AFTER)
    password = sasl_password(_settings(path).kafka)  # installs the rotation's reading
    assert plain._sasl_plain_password == BEFORE
    assert copy.deepcopy({"p": password})["p"] is password  # copied arguments follow the file
    await plain.close()


def _user_and_password_files(where: Path) -> tuple[Path, Path, Settings]:
    """A SCRAM user's name and password in their files (guardrail-v1, ``BEFORE``), and
    settings that read them (no broker answers at their address)."""
    user, password = where / "username", where / "password"
    user.write_text("guardrail-v1\n")
    password.write_text(BEFORE + "\n")
    settings = Settings.load(
        kafka={
            "bootstrap_servers": "127.0.0.1:9",
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username_file": str(user),
            "sasl_password_file": str(password),
        }
    )
    return user, password, settings


async def test_a_user_rotated_with_its_password_reaches_clients_made_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vault's dynamic Kafka credentials, a SCRAM user replaced by a new one: the username
    and the password change together, in one Secret. The username was a variable read at
    start, so a new password alone authenticated nobody."""
    user, password, settings = _user_and_password_files(tmp_path)
    given: list[tuple[str, str]] = []

    async def create_conn(host: str, port: int, **kwargs: Any) -> None:
        given.append((kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]))
        raise KafkaConnectionError("a recorder, not a broker")

    monkeypatch.setattr(aiokafka.client, "create_conn", create_conn)
    broker = make_broker(settings)
    producer = AIOKafkaProducer(**broker._connection_kwargs)
    consumer = AIOKafkaConsumer(**aiokafka_client_args(settings.kafka))
    clients = [producer.client, consumer._client]
    try:
        for client in clients:
            with pytest.raises(KafkaConnectionError):
                await client.bootstrap()
        assert given == [("guardrail-v1", BEFORE)] * 2
        user.write_text("guardrail-v2\n")
        password.write_text(AFTER + "\n")
        said = check_secret_files()
        for path in (user, password):
            assert any(f"={path}: the secret changed on disk" in line for _, line in said), said
        given.clear()
        for client in clients:
            with pytest.raises(KafkaConnectionError):
                await client.bootstrap()
        assert given == [("guardrail-v2", AFTER)] * 2
    finally:
        await producer.stop()
        await consumer.stop()
    assert all(type(u) is str and type(p) is str for u, p in given)
    assert "guardrail-v" not in repr(broker._connection_kwargs)


async def test_a_connection_opened_during_a_rotation_never_pairs_the_new_user_with_the_old_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch took the username and the password one after the other on its thread; a
    connection the event loop opened in between authenticated as the new user with the old
    password (a refused authentication, then aiokafka's retry). Here a connection is opened
    right after each file is taken, and the watch thread waits for it, as a busy loop would."""
    user, password, settings = _user_and_password_files(tmp_path)
    given: list[tuple[str, str]] = []
    connected = threading.Event()

    async def create_conn(host: str, port: int, **kwargs: Any) -> None:
        given.append((kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]))
        connected.set()
        raise KafkaConnectionError("a recorder, not a broker")

    monkeypatch.setattr(aiokafka.client, "create_conn", create_conn)
    client = AIOKafkaClient(**aiokafka_client_args(settings.kafka))
    loop, on_loop = asyncio.get_running_loop(), threading.get_ident()
    opened: list[asyncio.Future[None]] = []
    take = SecretFile._take

    def taking(secret: SecretFile, read: str | tuple[None, str]) -> tuple[int, str] | None:
        said = take(secret, read)
        if secret.path in (str(user), str(password)):
            connected.clear()
            loop.call_soon_threadsafe(lambda: opened.append(asyncio.ensure_future(connect())))
            if threading.get_ident() != on_loop:
                assert connected.wait(10)  # the loop is free meanwhile: it connects
        return said

    async def connect() -> None:
        with contextlib.suppress(KafkaConnectionError):
            await client.bootstrap()

    monkeypatch.setattr(SecretFile, "_take", taking)
    user.write_text("guardrail-v2\n")
    password.write_text(AFTER + "\n")
    stop = asyncio.Event()
    watching = asyncio.create_task(runtime._watch_secrets(stop, interval_s=0.02))
    try:
        for _ in range(500):
            await asyncio.sleep(0.02)
            if len(given) >= 2:
                break
    finally:
        stop.set()
        await watching
        await asyncio.gather(*opened)
        await client.close()
    assert len(given) >= 2, given
    assert set(given) <= {("guardrail-v1", BEFORE), ("guardrail-v2", AFTER)}, given
    assert given[-1] == ("guardrail-v2", AFTER)
