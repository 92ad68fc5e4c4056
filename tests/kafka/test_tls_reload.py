"""A renewed client certificate, or a CA bundle with a new CA, reaches new connections.

The process read its TLS files once: a pod that outlived its client certificate (renewed
by cert-manager, updated in the mounted Secret by the kubelet) lost the brokers at its
next reconnection once the old one expired. A local TLS server that asks for a client
certificate stands in for a broker: it sees what the shared context presents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sidecar import runtime
from sidecar.config import HttpSettings, KafkaSettings, Settings
from sidecar.exceptions import ConfigError
from sidecar.kafka.security import (
    KEY_PASSWORD_WAIT_S,
    MAX_TLS_FILE_BYTES,
    TlsFilesWatch,
    aiokafka_client_args,
    faststream_security,
    shared_ssl_context,
    ssl_context,
)
from sidecar.pipeline.processor import Processor
from sidecar.runtime import _watch_tls
from tests.kafka.test_tls import _ca, _openssl, _signed


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls-reload")
    for ca in ("ca", "ca2"):
        _ca(d, ca)
    _signed(d, "server", "IP:127.0.0.1")
    _signed(d, "server2", "IP:127.0.0.1", ca="ca2")
    for client in ("client1", "client2"):
        _signed(d, client, "DNS:client")
    return d


@contextmanager
def tls_server(certs: Path, server: str = "server") -> Iterator[tuple[int, list[str]]]:
    """A server asking for a client certificate signed by "ca"; yields its port and the
    common names of the client certificates it was shown."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs / f"{server}.pem", certs / f"{server}.key")
    context.load_verify_locations(certs / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    seen: list[str] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    peer: Any = tls.getpeercert()
                    seen.append(str(dict(x[0] for x in peer["subject"])["commonName"]))
            except (ssl.SSLError, OSError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def connect(context: ssl.SSLContext, port: int) -> None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.recv(1)  # the server closes after the handshake


def put(certs: Path, live: Path, client: str, ca: str = "ca.pem") -> None:
    """Write the files as the kubelet does: whole, then swapped in."""
    for source, name in (
        (ca, "ca.pem"),
        (f"{client}.pem", "tls.crt"),
        (f"{client}.key", "tls.key"),
    ):
        tmp = live / f".{name}.tmp"
        tmp.write_bytes((certs / source).read_bytes())
        tmp.replace(live / name)


def settings(live: Path) -> KafkaSettings:
    return KafkaSettings(
        security_protocol="SSL",
        ssl_cafile=str(live / "ca.pem"),
        ssl_certfile=str(live / "tls.crt"),
        ssl_keyfile=str(live / "tls.key"),
    )


def watched(certs: Path, live: Path) -> tuple[ssl.SSLContext, TlsFilesWatch]:
    """The first client certificate in ``live``: the shared context, and its watch."""
    put(certs, live, "client1")
    kafka = settings(live)
    context = shared_ssl_context(kafka)
    assert context is not None
    return context, TlsFilesWatch(kafka)


def test_every_client_shares_one_context(certs: Path, tmp_path: Path) -> None:
    put(certs, tmp_path, "client1")
    kafka = settings(tmp_path)
    context = shared_ssl_context(kafka)
    security = faststream_security(kafka)
    assert security is not None and security.ssl_context is context
    assert aiokafka_client_args(kafka)["ssl_context"] is context


def test_a_renewed_client_certificate_is_presented_by_new_connections(
    certs: Path, tmp_path: Path
) -> None:
    context, watch = watched(certs, tmp_path)
    with tls_server(certs) as (port, seen):
        connect(context, port)
        assert watch.changed() is None and watch.apply() is None  # nothing changed
        put(certs, tmp_path, "client2")
        connect(context, port)  # read once at start: the old certificate, until the watch
        assert watch.changed() is None  # they load
        level, said = watch.apply() or (0, "")
        assert level == logging.INFO and "reloaded the Kafka TLS files" in said
        assert str(tmp_path / "tls.crt") in said and "ca.pem" not in said
        connect(context, port)
    assert seen == ["client1", "client1", "client2"]


def test_files_that_do_not_load_are_said_once_and_the_context_keeps_its_own(
    certs: Path, tmp_path: Path
) -> None:
    context, watch = watched(certs, tmp_path)
    # a renewal caught half-way: the new certificate, the old key
    (tmp_path / "tls.crt").write_bytes((certs / "client2.pem").read_bytes())
    level, said = watch.changed() or (0, "")
    assert level == logging.ERROR and "do not load" in said and "tls.crt" in said
    assert watch.apply() is None and watch.changed() is None  # said once
    (tmp_path / "tls.key").write_bytes((certs / "client2.key").read_bytes())
    assert watch.changed() is None
    with tls_server(certs) as (port, seen):
        connect(context, port)  # the old pair until the watch loads the new one
        assert watch.apply() is not None
        connect(context, port)
    assert seen == ["client1", "client2"]


def test_a_ca_bundle_with_a_new_ca_is_trusted_after_the_reload(certs: Path, tmp_path: Path) -> None:
    context, watch = watched(certs, tmp_path)
    with tls_server(certs, "server2") as (port, seen):  # the brokers moved to a new CA
        with pytest.raises(ssl.SSLCertVerificationError):
            connect(context, port)
        bundle = (certs / "ca.pem").read_bytes() + (certs / "ca2.pem").read_bytes()
        (certs / "bundle.pem").write_bytes(bundle)
        put(certs, tmp_path, "client1", ca="bundle.pem")
        assert watch.changed() is None
        assert watch.apply() is not None
        connect(context, port)
    assert seen == ["client1"]


def test_a_ca_removed_from_the_bundle_is_said_to_stay_trusted_until_a_restart(
    certs: Path, tmp_path: Path
) -> None:
    """OpenSSL adds trust anchors to a context in use and never removes them: a CA taken
    out of the bundle (one compromised, or retired) stayed trusted, and the reload said
    only INFO "reloaded", as if it were not. The reload now says which CAs stay trusted
    and that a restart ends it, at WARNING; a bundle that only grew stays INFO."""
    (certs / "both.pem").write_bytes(
        (certs / "ca.pem").read_bytes() + (certs / "ca2.pem").read_bytes()
    )
    put(certs, tmp_path, "client1", ca="both.pem")
    kafka = settings(tmp_path)
    context = shared_ssl_context(kafka)
    assert context is not None
    watch = TlsFilesWatch(kafka)
    put(certs, tmp_path, "client2", ca="ca.pem")  # ca2 taken out of the bundle
    assert watch.changed() is None
    level, said = watch.apply() or (0, "")
    assert level == logging.WARNING and "reloaded the Kafka TLS files" in said, said
    assert "1 CA certificate(s) no longer in GUARDRAIL_KAFKA__SSL_CAFILE (commonName=ca2)" in said
    assert "until it restarts" in said
    with tls_server(certs, "server2") as (port, seen):
        connect(context, port)  # what the line says: ca2 is trusted still
    assert seen == ["client2"]
    put(certs, tmp_path, "client1", ca="both.pem")  # ca2 back in: nothing kept out
    assert watch.changed() is None
    level, said = watch.apply() or (0, "")
    assert level == logging.INFO and "CA certificate" not in said, said


async def test_the_running_sidecar_looks_at_its_tls_files_now_and_then(
    certs: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, watch = watched(certs, tmp_path)
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="sidecar"):
        watching = asyncio.create_task(_watch_tls(watch, stop, interval_s=0.05))
        put(certs, tmp_path, "client2")
        for _ in range(100):
            await asyncio.sleep(0.05)
            if "reloaded the Kafka TLS files" in caplog.text:
                break
        stop.set()
        await asyncio.wait_for(watching, 5)
    assert caplog.text.count("reloaded the Kafka TLS files") == 1


def test_a_renewal_before_the_watch_starts_is_loaded_by_it(certs: Path, tmp_path: Path) -> None:
    # the clients' context is made as Kafka is first reached; the watch starts once the
    # service runs, minutes later when the brokers were slow to answer: a certificate
    # renewed meanwhile was taken for the one loaded, and never loaded
    put(certs, tmp_path, "client1")
    context = shared_ssl_context(settings(tmp_path))
    assert context is not None
    put(certs, tmp_path, "client2")
    watch = TlsFilesWatch(settings(tmp_path))
    assert watch.changed() is None
    level, said = watch.apply() or (0, "")
    assert level == logging.INFO and "reloaded the Kafka TLS files" in said
    with tls_server(certs) as (port, seen):
        connect(context, port)
    assert seen == ["client2"]


async def test_a_start_waiting_for_the_brokers_retries_with_a_renewed_certificate(
    certs: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a start that waits for Kafka (wait_at_start) tries again with the shared context:
    # before the watch ran from the start, a certificate renewed meanwhile never reached
    # those tries (one that expired while the brokers were away ended the start)
    put(certs, tmp_path, "client1")
    kafka = settings(tmp_path).model_copy(update={"wait_at_start": True})
    monkeypatch.setattr(runtime, "TLS_CHECK_INTERVAL_S", 0.05)
    with tls_server(certs) as (port, seen):

        async def reaching(
            settings: Settings, stop: asyncio.Event, processor: Processor | None
        ) -> None:
            del processor
            context = aiokafka_client_args(settings.kafka)["ssl_context"]
            await asyncio.to_thread(connect, context, port)
            put(certs, tmp_path, "client2")
            for _ in range(100):
                await asyncio.sleep(0.05)
                if "reloaded the Kafka TLS files" in caplog.text:
                    break
            await asyncio.to_thread(connect, context, port)  # the next try
            stop.set()  # the test ends here: no broker to reach

        monkeypatch.setattr(runtime, "_load_while_reaching_kafka", reaching)
        with caplog.at_level(logging.INFO, logger="sidecar"):
            await runtime.serve(Settings(kafka=kafka, http=HttpSettings(enabled=False)))
    assert seen == ["client1", "client2"]


def test_a_key_re_encrypted_with_a_new_passphrase_in_its_file_is_loaded(
    certs: Path, tmp_path: Path
) -> None:
    """GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE is read with the TLS files: at start, and
    when the client key is renewed and encrypted with another passphrase (the Secret's
    keys updated together). The passphrase was a variable read at start: the renewed key
    did not load until a restart."""
    for client, passphrase in (("client1", "first-Pa55"), ("client2", "second-Pa55")):
        _openssl("pkey", "-in", f"{client}.key", "-aes256", "-passout", f"pass:{passphrase}",
                 "-out", f"{client}.enc.key", cwd=certs)  # fmt: skip
    live = tmp_path

    def put_encrypted(client: str, passphrase: str) -> None:
        for data, name in (
            ((certs / "ca.pem").read_bytes(), "ca.pem"),
            ((certs / f"{client}.pem").read_bytes(), "tls.crt"),
            ((certs / f"{client}.enc.key").read_bytes(), "tls.key"),
            (passphrase.encode() + b"\n", "key-password"),
        ):
            tmp = live / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.replace(live / name)

    put_encrypted("client1", "first-Pa55")
    kafka = KafkaSettings(
        security_protocol="SSL",
        ssl_cafile=str(live / "ca.pem"),
        ssl_certfile=str(live / "tls.crt"),
        ssl_keyfile=str(live / "tls.key"),
        ssl_key_password_file=str(live / "key-password"),
    )
    context = shared_ssl_context(kafka)
    assert context is not None
    clock = [1000.0]
    watch = TlsFilesWatch(kafka, clock=lambda: clock[0])
    with tls_server(certs) as (port, seen):
        connect(context, port)
        put_encrypted("client2", "second-Pa55")
        assert watch.changed() is None  # they load, with the new passphrase
        level, said = watch.apply() or (0, "")
        assert level == logging.INFO and "key-password" in said and "Pa55" not in said
        connect(context, port)
        (live / "key-password").write_text("wrong-Pa55\n")
        level, said = watch.changed() or (0, "")  # a key may follow it (two Secrets)
        assert level == logging.INFO and "for the key to follow" in said
        clock[0] += KEY_PASSWORD_WAIT_S
        level, said = watch.changed() or (0, "")  # none did: the passphrase is wrong
        assert level == logging.ERROR and "does not decrypt the private key" in said
        assert "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE" in said and "Pa55" not in said
        connect(context, port)  # the key loaded before stays
    assert seen == ["client1", "client2", "client2"]


def _within(seconds: float, call: Callable[[], object]) -> tuple[bool, object]:
    """Run ``call`` on a daemon thread: whether it returned within ``seconds``, and what it
    returned or raised (a hang shows as a failure, not as a test run that never ends)."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), out[0] if out else None


def _release(fifo: Path) -> None:
    """End a read blocked on ``fifo`` (the old code's), so its thread does not outlive the test."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("name", ["tls.crt", "tls.key", "ca.pem"])
def test_a_tls_file_that_becomes_a_pipe_is_said_once_and_the_watch_returns(
    certs: Path, tmp_path: Path, name: str
) -> None:
    """The watch loaded changed files with OpenSSL, which opens the path and reads it: a
    FIFO put where a file was (a path set wrong, a sidecar writing the file through a pipe)
    blocked the watch thread until a writer came, for ever, and the exit waited on it."""
    context, watch = watched(certs, tmp_path)
    path = tmp_path / name
    path.unlink()
    os.mkfifo(path)
    try:
        returned, said = _within(10, watch.changed)
    finally:
        _release(path)
    assert returned, "the watch thread blocked on the pipe"
    assert isinstance(said, tuple) and said[0] == logging.ERROR, said
    assert f"={path}: the file is a pipe (FIFO), not a regular file" in said[1]
    assert "keep using the files loaded before" in said[1]
    assert watch.apply() is None and _within(10, watch.changed) == (True, None)  # said once
    path.unlink()
    put(certs, tmp_path, "client2")
    with tls_server(certs) as (port, seen):
        assert watch.changed() is None and watch.apply() is not None  # a file again: loaded
        connect(context, port)
    assert seen == ["client2"]


@pytest.mark.parametrize(
    ("name", "setting"),
    [("ca.pem", "SSL_CAFILE"), ("tls.crt", "SSL_CERTFILE"), ("tls.key", "SSL_KEYFILE")],
)
def test_a_start_with_a_tls_file_that_is_a_pipe_stops_naming_the_setting(
    tmp_path: Path, certs: Path, name: str, setting: str
) -> None:
    put(certs, tmp_path, "client1")
    path = tmp_path / name
    path.unlink()
    os.mkfifo(path)
    try:
        returned, raised = _within(10, lambda: ssl_context(settings(tmp_path)))
    finally:
        _release(path)
    assert returned, "the start blocked on the pipe"
    assert isinstance(raised, ConfigError), raised
    assert f"GUARDRAIL_KAFKA__{setting}={path}: the file is a pipe (FIFO)" in str(raised)


def test_a_tls_file_larger_than_any_pem_bundle_is_refused(certs: Path, tmp_path: Path) -> None:
    """A path set to a large file (a log, an image) was read whole into memory every 30 s."""
    put(certs, tmp_path, "client1")
    with (tmp_path / "ca.pem").open("ab") as bundle:
        bundle.truncate(MAX_TLS_FILE_BYTES + 1)
    with pytest.raises(ConfigError, match=r"SSL_CAFILE=.*: the file is larger than 4 MiB"):
        ssl_context(settings(tmp_path))


def swap_in(path: Path, data: bytes) -> None:
    """Write ``path`` whole, then swap it in (the kubelet's atomic update of a Secret)."""
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_bytes(data)
    tmp.replace(path)


@pytest.fixture
def two_secrets(certs: Path, tmp_path: Path) -> tuple[KafkaSettings, Callable[..., None]]:
    """The client certificate and its encrypted key mounted from one Secret, the key's
    passphrase (GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE) from another, "client1" in place;
    and ``rotate(client, passphrase=..., key=...)``: update the key's Secret (``key``)
    or the passphrase's (``passphrase``)."""
    tls, secret = tmp_path / "tls", tmp_path / "key-password"
    tls.mkdir()
    secret.mkdir()
    for client in ("client1", "client2"):
        _openssl("pkey", "-in", f"{client}.key", "-aes256", "-passout",
                 f"pass:{client}-Pa55", "-out", f"{client}.two.key", cwd=certs)  # fmt: skip

    def rotate(client: str, *, key: bool = False, passphrase: bool = False) -> None:
        if key:
            swap_in(tls / "ca.pem", (certs / "ca.pem").read_bytes())
            swap_in(tls / "tls.crt", (certs / f"{client}.pem").read_bytes())
            swap_in(tls / "tls.key", (certs / f"{client}.two.key").read_bytes())
        if passphrase:
            swap_in(secret / "password", f"{client}-Pa55\n".encode())

    rotate("client1", key=True, passphrase=True)
    kafka = KafkaSettings(
        security_protocol="SSL",
        ssl_cafile=str(tls / "ca.pem"),
        ssl_certfile=str(tls / "tls.crt"),
        ssl_keyfile=str(tls / "tls.key"),
        ssl_key_password_file=str(secret / "password"),
    )
    return kafka, rotate


@pytest.mark.parametrize(
    ("first", "then"),
    [("key", "passphrase"), ("passphrase", "key")],
    ids=["key-first", "passphrase-first"],
)
async def test_a_key_and_its_passphrase_from_two_secrets_rotate_without_an_error(
    certs: Path,
    two_secrets: tuple[KafkaSettings, Callable[..., None]],
    caplog: pytest.LogCaptureFixture,
    first: str,
    then: str,
) -> None:
    """The kubelet updates the two Secrets at moments of their own: the watch saw the new
    key with the old passphrase (or the new passphrase with the old key) and logged an
    ERROR (the key "does not decrypt") at every rotation, although the other followed a
    moment later. It now waits for it (up to ``KEY_PASSWORD_WAIT_S``), the old credentials
    in use meanwhile, in either order."""
    kafka, rotate = two_secrets
    context = shared_ssl_context(kafka)
    assert context is not None
    stop = asyncio.Event()
    with tls_server(certs) as (port, seen), caplog.at_level(logging.INFO, logger="sidecar"):
        connect(context, port)
        watching = asyncio.create_task(_watch_tls(TlsFilesWatch(kafka), stop, interval_s=0.05))
        rotate("client2", **{first: True})  # one Secret first
        await asyncio.sleep(0.5)  # ten looks meanwhile
        await asyncio.to_thread(connect, context, port)  # the old pair, still in use
        rotate("client2", **{then: True})  # the other Secret a moment later
        for _ in range(100):
            await asyncio.sleep(0.05)
            if "reloaded the Kafka TLS files" in caplog.text:
                break
        stop.set()
        await asyncio.wait_for(watching, 5)
        await asyncio.to_thread(connect, context, port)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == []
    assert caplog.text.count("reloaded the Kafka TLS files") == 1
    assert caplog.text.count(f"for the {then} to follow") == 1  # said once, not at every look
    assert "Pa55" not in caplog.text
    assert seen == ["client1", "client1", "client2"]


def test_a_key_that_never_follows_its_passphrase_is_an_error_after_the_wait(
    certs: Path, two_secrets: tuple[KafkaSettings, Callable[..., None]]
) -> None:
    """The wait for the key is bounded as the wait for the passphrase is: a passphrase file
    changed to one that never decrypts the key is said as an ERROR once
    ``KEY_PASSWORD_WAIT_S`` passed, once, and the old pair stays."""
    kafka, rotate = two_secrets
    context = shared_ssl_context(kafka)
    assert context is not None
    clock = [1000.0]
    watch = TlsFilesWatch(kafka, clock=lambda: clock[0])
    rotate("client2", passphrase=True)
    level, said = watch.changed() or (0, "")
    assert level == logging.INFO and f"waiting up to {KEY_PASSWORD_WAIT_S:.0f} s" in said
    assert "for the key to follow" in said and "Pa55" not in said
    clock[0] += KEY_PASSWORD_WAIT_S - 1
    assert watch.changed() is None and watch.apply() is None
    clock[0] += 1
    level, said = watch.changed() or (0, "")
    assert level == logging.ERROR and "does not decrypt the private key" in said
    assert "keep using the files loaded before" in said and "Pa55" not in said
    assert watch.changed() is None and watch.apply() is None  # said once
    with tls_server(certs) as (port, seen):
        connect(context, port)  # the old pair
        rotate("client2", key=True)  # late, but it came: loaded
        assert watch.changed() is None
        level, said = watch.apply() or (0, "")
        assert level == logging.INFO and "reloaded the Kafka TLS files" in said
        connect(context, port)
    assert seen == ["client1", "client2"]


def test_a_passphrase_that_never_follows_its_key_is_an_error_after_the_wait(
    certs: Path, two_secrets: tuple[KafkaSettings, Callable[..., None]]
) -> None:
    """The wait is bounded: a key rotated without its passphrase's Secret (forgotten) is
    said as an ERROR once ``KEY_PASSWORD_WAIT_S`` passed, and the old pair stays."""
    kafka, rotate = two_secrets
    context = shared_ssl_context(kafka)
    assert context is not None
    clock = [1000.0]
    watch = TlsFilesWatch(kafka, clock=lambda: clock[0])
    rotate("client2", key=True)
    level, said = watch.changed() or (0, "")
    assert level == logging.INFO and f"waiting up to {KEY_PASSWORD_WAIT_S:.0f} s" in said
    assert "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE" in said and "Pa55" not in said
    assert watch.apply() is None
    clock[0] += KEY_PASSWORD_WAIT_S - 1
    assert watch.changed() is None and watch.apply() is None
    clock[0] += 1
    level, said = watch.changed() or (0, "")
    assert level == logging.ERROR and "does not decrypt the private key" in said
    assert "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE" in said and "Pa55" not in said
    assert "keep using the files loaded before" in said
    assert watch.changed() is None and watch.apply() is None  # said once
    with tls_server(certs) as (port, seen):
        connect(context, port)  # the old pair
        rotate("client2", passphrase=True)  # late, but it came: loaded
        assert watch.changed() is None
        level, said = watch.apply() or (0, "")
        assert level == logging.INFO and "reloaded the Kafka TLS files" in said
        connect(context, port)
    assert seen == ["client1", "client2"]


def test_an_encrypted_key_that_does_not_match_its_certificate_is_said_so(
    certs: Path, two_secrets: tuple[KafkaSettings, Callable[..., None]]
) -> None:
    """A certificate that does not match its encrypted key (renewed for another key, the
    right passphrase given) was said as a passphrase that "does not decrypt the private
    key", and the watch waited for a passphrase that was not the fault. It is said as what
    it is, at once."""
    kafka, rotate = two_secrets
    assert kafka.ssl_certfile is not None and kafka.ssl_key_password_file is not None
    context = shared_ssl_context(kafka)
    assert context is not None
    watch = TlsFilesWatch(kafka)
    swap_in(Path(kafka.ssl_certfile), (certs / "client2.pem").read_bytes())  # client1's key
    with pytest.raises(ConfigError, match="key values mismatch") as refused:
        ssl_context(kafka)
    assert "does not decrypt" not in str(refused.value)
    assert "must be readable PEM files that match" in str(refused.value)
    rotate("client1", key=True)  # back to the pair loaded
    rotate("client2", key=True)  # client2's certificate and key, client1's passphrase
    swap_in(Path(kafka.ssl_certfile), (certs / "client1.pem").read_bytes())
    swap_in(Path(kafka.ssl_key_password_file), b"client2-Pa55\n")
    level, said = watch.changed() or (0, "")  # both halves changed: no wait
    assert level == logging.ERROR and "key values mismatch" in said, said
    assert "does not decrypt" not in said and "Pa55" not in said
