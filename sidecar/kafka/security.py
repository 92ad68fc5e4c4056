"""Client security (SASL / SSL) from settings, for FastStream and plain aiokafka.

Every client of the process (the FastStream consumer and producer, the admin and
plain aiokafka clients) gets one shared TLS context (:func:`shared_ssl_context`),
which :class:`TlsFilesWatch` keeps in step with the files on disk: cert-manager
renews a client certificate, and the kubelet updates the mounted Secret, long
before it expires, but the process read it once at start, so a pod older than
the certificate lost the brokers at its next reconnection (a broker's rolling
restart) after the old certificate expired. A renewed certificate and key, or a
CA bundle with a new CA, are loaded into the shared context when they change and
load; new connections use them, open ones keep theirs. A CA dropped from the
bundle stays trusted until a restart (OpenSSL adds trust anchors, never removes): the
reload says so at WARNING, naming it.

A SASL password given as a file (``sasl_password_file``) rotates the same way, and
so does a username given as a file (``sasl_username_file``, a user rotated with its
password): the clients are handed a :class:`RotatingSecret`, and each aiokafka
client reads the file's current secret when it authenticates a new connection (see
:func:`_follow_rotations`); open connections stay authenticated as they were. The
client key's passphrase given as a file (``ssl_key_password_file``) is one of the
TLS files: read when they are loaded, at start and when any of them changes. Mounted from
a Secret of its own, it changes apart from the key, in either order: a new key that the
passphrase file does not decrypt yet, or a new passphrase that does not decrypt the key on
disk yet, is waited on (:data:`KEY_PASSWORD_WAIT_S`) before it is said not to load.
"""

from __future__ import annotations

import logging
import re
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka.client import AIOKafkaClient
from faststream.security import (
    BaseSecurity,
    SASLPlaintext,
    SASLScram256,
    SASLScram512,
)

from sidecar.config import KafkaSettings
from sidecar.exceptions import ConfigError
from sidecar.secretfile import (
    SecretFile,
    capped_bytes,
    secret_digest,
    secret_file,
    secret_files,
    unfit_file,
)

__all__ = [
    "KEY_PASSWORD_WAIT_S",
    "MAX_TLS_FILE_BYTES",
    "TLS_CHECK_INTERVAL_S",
    "RotatingSecret",
    "TlsFilesWatch",
    "aiokafka_client_args",
    "faststream_security",
    "sasl_password",
    "sasl_username",
    "shared_ssl_context",
    "ssl_context",
]

TLS_CHECK_INTERVAL_S = 30.0
"""How often the running sidecar hashes its Kafka TLS files (a few KB) for a renewal."""

KEY_PASSWORD_WAIT_S = 120.0
"""How long :class:`TlsFilesWatch` waits, once one of the client key and its passphrase
file (``ssl_key_password_file``) changed on disk and the other did not, and the passphrase
does not decrypt the key, for the other to follow before it says the key does not load:
the two come from two Secrets, and the kubelet updates each mounted Secret at a sync of
the pod of its own (every minute by default, with jitter), so a rotation shows either one
a sync before the other."""

MAX_TLS_FILE_BYTES = 4 * 1024 * 1024
"""A larger CA bundle, certificate or key is none (a path set wrong): refused unread. A
system CA bundle is about 200 KiB."""

_TlsKey = tuple[str | None, str | None, str | None, str | None]
# each context with the digests of the files it was made from (read before them)
_SHARED: dict[_TlsKey, tuple[ssl.SSLContext, dict[str, str]]] = {}
_SHARED_LOCK = threading.Lock()


class _EncryptedKeyError(Exception):
    """The client key asks for a passphrase."""


class _WrongPassphrase(ConfigError):
    """The passphrase given does not decrypt the client key."""


def _no_password() -> str:
    raise _EncryptedKeyError


def _is_encrypted(path: str) -> bool:
    """Whether the PEM file at ``path`` holds an encrypted private key (PKCS#8 or legacy)."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return "BEGIN ENCRYPTED PRIVATE KEY" in text or "Proc-Type: 4,ENCRYPTED" in text


def _key_password(kafka: KafkaSettings) -> str | None:
    """The client key's passphrase: ``ssl_key_password``, or what ``ssl_key_password_file``
    holds now (``ConfigError`` when it holds none); ``None``: neither is set."""
    if kafka.ssl_key_password_file is not None:
        return SecretFile(
            kafka.ssl_key_password_file,
            "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE",
            "new Kafka connections",
        ).value()
    password = kafka.ssl_key_password
    return None if password is None else password.get_secret_value()


def _password_setting(kafka: KafkaSettings) -> str:
    return "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD" + ("_FILE" if kafka.ssl_key_password_file else "")


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS context of ``*SSL`` protocols; ``ConfigError`` naming the file it cannot use."""
    if not kafka.security_protocol.endswith("SSL"):
        return None
    return _context(kafka, _key_password(kafka))


def _refuse_unfit_files(kafka: KafkaSettings) -> None:
    """``ConfigError`` naming a TLS file OpenSSL must not open: a FIFO blocked the start,
    or the watch thread for ever (OpenSSL opens and reads the path itself), a device
    never ended, and no PEM file is larger than ``MAX_TLS_FILE_BYTES``."""
    for name, path in (
        ("SSL_CAFILE", kafka.ssl_cafile),
        ("SSL_CERTFILE", kafka.ssl_certfile),
        ("SSL_KEYFILE", kafka.ssl_keyfile),
    ):
        why = unfit_file(path, MAX_TLS_FILE_BYTES) if path else None
        if why is not None:
            raise ConfigError(
                f"GUARDRAIL_KAFKA__{name}={path}: the file {why}; it must be a readable PEM "
                f"file of at most {MAX_TLS_FILE_BYTES >> 20} MiB"
            )


def _context(kafka: KafkaSettings, passphrase: str | None) -> ssl.SSLContext:
    """:func:`ssl_context` with the client key's ``passphrase`` read already."""
    _refuse_unfit_files(kafka)
    try:
        context = ssl.create_default_context(cafile=kafka.ssl_cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"GUARDRAIL_KAFKA__SSL_CAFILE={kafka.ssl_cafile}: cannot load CA certificates "
            f"({exc}); it must be a readable PEM file"
        ) from None
    if kafka.ssl_certfile:
        key_names = (
            f"GUARDRAIL_KAFKA__SSL_KEYFILE={kafka.ssl_keyfile}"
            if kafka.ssl_keyfile
            else f"GUARDRAIL_KAFKA__SSL_CERTFILE={kafka.ssl_certfile} (its key)"
        )
        try:
            # an encrypted key and no passphrase: OpenSSL's own fallback prompts for it on
            # the terminal (audit: `guardrail run` under a TTY waited there for ever)
            context.load_cert_chain(
                kafka.ssl_certfile,
                kafka.ssl_keyfile,
                password=_no_password if passphrase is None else passphrase,
            )
        except _EncryptedKeyError:
            raise ConfigError(
                f"{key_names}: the private key is encrypted; set its passphrase in "
                "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD or GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE "
                "(from a Secret), or give the key unencrypted (openssl pkey -in KEY -out "
                "KEY.pem)"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            # a certificate of another key: the key decrypted, and OpenSSL compared them
            mismatch = getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH"
            encrypted = _is_encrypted(kafka.ssl_keyfile or kafka.ssl_certfile)
            if passphrase is not None and encrypted and not mismatch:
                raise _WrongPassphrase(
                    f"{key_names}: {_password_setting(kafka)} does not decrypt the "
                    f"private key ({exc}); it must be the key's passphrase"
                ) from None
            raise ConfigError(
                f"GUARDRAIL_KAFKA__SSL_CERTFILE={kafka.ssl_certfile} / "
                f"GUARDRAIL_KAFKA__SSL_KEYFILE={kafka.ssl_keyfile}: cannot load the client "
                f"certificate and key ({exc}); they must be readable PEM files that match"
            ) from None
    return context


def _tls_key(kafka: KafkaSettings) -> _TlsKey:
    password = kafka.ssl_key_password
    return (
        kafka.ssl_cafile,
        kafka.ssl_certfile,
        kafka.ssl_keyfile,
        password.get_secret_value() if password is not None else kafka.ssl_key_password_file,
    )


def shared_ssl_context(kafka: KafkaSettings) -> ssl.SSLContext | None:
    """The process's one TLS context for these settings (made by :func:`ssl_context` the
    first time): the context every client gets, and :class:`TlsFilesWatch` reloads."""
    if not kafka.security_protocol.endswith("SSL"):
        return None
    return _shared(kafka)[0]


def _shared(kafka: KafkaSettings) -> tuple[ssl.SSLContext, dict[str, str]]:
    """The shared context of an ``*SSL`` protocol, and the digests of the files it holds."""
    key = _tls_key(kafka)
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            digests = _digests(_tls_files(kafka), kafka)  # first: a change after it is seen
            made = ssl_context(kafka)
            assert made is not None  # noqa: S101 - an *SSL protocol
            shared = _SHARED[key] = (made, digests)
    return shared


def _tls_files(kafka: KafkaSettings) -> list[str]:
    files = (kafka.ssl_cafile, kafka.ssl_certfile, kafka.ssl_keyfile, kafka.ssl_key_password_file)
    return [p for p in files if p]


def _digests(files: list[str], kafka: KafkaSettings) -> dict[str, str]:
    # read as the secrets are: a regular file only, never a pipe, and never read past a cap
    secret = kafka.ssl_key_password_file
    return {
        path: secret_digest(path) if path == secret else secret_digest(path, MAX_TLS_FILE_BYTES)
        for path in files
    }


class TlsFilesWatch:
    """Loads the Kafka TLS files into the shared context again when they change on disk.

    :meth:`changed` (file reads: run it off the event loop) hashes the CA bundle, the
    client certificate and its key, and when their bytes changed, loads them into a new
    context as a start would; :meth:`apply` (on the event loop, where the clients make
    their connections) then loads them into the shared one. Files that changed but do
    not load (a renewal caught half-written, a key that does not match) are said once
    per change, and the context keeps what it holds. A changed key that the passphrase file,
    unchanged, does not decrypt (or a changed passphrase that does not decrypt the key,
    unchanged) is said once ``passphrase_wait_s`` passed without the other following (it
    comes from another Secret, updated apart).
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        passphrase_wait_s: float = KEY_PASSWORD_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not kafka.security_protocol.endswith("SSL"):
            raise ConfigError("TlsFilesWatch needs an SSL or SASL_SSL security protocol")
        self._kafka = kafka
        self._passphrase_wait_s = passphrase_wait_s
        self._clock = clock
        # waiting for the passphrase of a changed key (or the key of a changed passphrase):
        # until when, and the line to say then
        self._waiting: tuple[float, str] | None = None
        # what the context was made from, not what the files hold now: a watch started after
        # the clients first reached Kafka took a renewal made meanwhile for the one loaded
        self._context, self._loaded = _shared(kafka)
        self._seen = self._loaded
        self._files = _tls_files(kafka)
        self._pending: tuple[dict[str, str], str | None] | None = None

    def _differing(self, digests: dict[str, str]) -> str:
        """The files whose ``digests`` differ from those of the files loaded."""
        return ", ".join(path for path in self._files if digests[path] != self._loaded[path])

    def changed(self) -> tuple[int, str] | None:
        """A log level and line when the files changed since the last look; the files are
        then ready for :meth:`apply` if they load."""
        now = _digests(self._files, self._kafka)
        if now == self._seen:
            return self._waited_out()
        self._seen, self._pending = now, None
        if now == self._loaded:  # back to what the context holds
            self._waiting = None
            return None
        names = self._differing(now)
        try:
            password = _key_password(self._kafka)
            _context(self._kafka, password)  # loads as a start would, or says which does not
        except ConfigError as exc:
            error = self._not_loading(names, exc)
            awaited = self._may_follow(now) if isinstance(exc, _WrongPassphrase) else None
            if awaited is not None:
                return self._wait_for(awaited, error)
            self._waiting = None
            return logging.ERROR, error
        self._waiting = None
        self._pending = now, password
        return None

    @staticmethod
    def _not_loading(names: str, exc: ConfigError) -> str:
        return (
            f"the Kafka TLS files changed on disk ({names}) and do not load: "
            f"{exc}; new connections keep using the files loaded before"
        )

    def _may_follow(self, digests: dict[str, str]) -> str | None:
        """What may not have been updated yet: "passphrase" when the client key changed and
        the passphrase file did not, "key" when the passphrase file changed and the key did
        not (each from a Secret of its own); None when both changed, or neither."""
        secret = self._kafka.ssl_key_password_file
        key = self._kafka.ssl_keyfile or self._kafka.ssl_certfile
        if secret is None or key is None:
            return None
        new_secret = digests[secret] != self._loaded[secret]
        new_key = digests[key] != self._loaded[key]
        if new_key == new_secret:
            return None
        return "passphrase" if new_key else "key"

    def _wait_for(self, awaited: str, error: str) -> tuple[int, str] | None:
        """Wait for the ``awaited`` half ("passphrase" or "key"; ``error`` said when the wait
        is over): an INFO line when the wait begins; a file changed again meanwhile does not
        restart it."""
        if self._waiting is not None:
            self._waiting = self._waiting[0], error
            return self._waited_out()
        self._waiting = self._clock() + self._passphrase_wait_s, error
        wait = f"waiting up to {self._passphrase_wait_s:.0f} s"
        if awaited == "passphrase":
            said = (
                "the Kafka client key changed on disk and GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE "
                f"does not decrypt it yet: {wait} for the passphrase to follow (its Secret is "
                "updated apart from the key's)"
            )
        else:
            said = (
                "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE changed on disk and does not decrypt "
                f"the client key there yet: {wait} for the key to follow (its Secret is "
                "updated apart from the passphrase's)"
            )
        return logging.INFO, f"{said}; new connections keep using the files loaded before"

    def _waited_out(self) -> tuple[int, str] | None:
        """The ERROR line of a key whose passphrase did not follow within the wait, once."""
        if self._waiting is None or self._clock() < self._waiting[0]:
            return None
        error, self._waiting = self._waiting[1], None
        return logging.ERROR, error

    def apply(self) -> tuple[int, str] | None:
        """Load the files :meth:`changed` found ready into the shared context; a log level
        and line when it did, or tried."""
        if self._pending is None:
            return None
        kafka, context, (ready, password) = self._kafka, self._context, self._pending
        self._pending = None
        if _digests(self._files, kafka) != ready:  # changed again since: the next look loads them
            return None
        names = self._differing(ready)
        try:
            if kafka.ssl_cafile:
                context.load_verify_locations(cafile=kafka.ssl_cafile)
            if kafka.ssl_certfile:
                context.load_cert_chain(
                    kafka.ssl_certfile,
                    kafka.ssl_keyfile,
                    password=_no_password if password is None else password,
                )
        except (OSError, ssl.SSLError, _EncryptedKeyError) as exc:
            # rewritten between the hash and the load (a writer that replaces the certificate
            # and the key one after the other): OpenSSL may have dropped the old key with
            # the new certificate, so new connections can fail until the next look loads
            # the files as they end up (they differ from those seen, so it does)
            return logging.ERROR, (
                f"loading the Kafka TLS files changed on disk ({names}) failed: {exc}; new "
                f"connections may fail until the next look in {TLS_CHECK_INTERVAL_S:.0f} s"
            )
        self._loaded = ready
        said = f"reloaded the Kafka TLS files changed on disk ({names}): new connections use them"
        kept = _kept_cas(context, kafka.ssl_cafile) if kafka.ssl_cafile else []
        if not kept:
            return logging.INFO, said
        return logging.WARNING, (
            f"{said}; {len(kept)} CA certificate(s) no longer in GUARDRAIL_KAFKA__SSL_CAFILE "
            f"({'; '.join(kept)}) stay trusted by this process until it restarts (OpenSSL "
            "adds trust anchors to a context in use, never removes them): restart the pod "
            "to stop trusting them"
        )


_PEM_CERTIFICATE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.DOTALL
)


def _kept_cas(context: ssl.SSLContext, cafile: str) -> list[str]:
    """The subjects of the CAs ``context`` trusts that the bundle at ``cafile`` no longer
    holds (a CA removed from it), as ``key=value`` lists; [] when the file cannot be read."""
    text = capped_bytes(cafile, MAX_TLS_FILE_BYTES)
    if text is None:  # rewritten meanwhile: the next look reads it again
        return []
    try:
        held = {ssl.PEM_cert_to_DER_cert(m.group().decode("ascii"))
                for m in _PEM_CERTIFICATE.finditer(text)}  # fmt: skip
    except ValueError:  # not ASCII, or not base64: OpenSSL loaded what it could read
        return []
    trusted = zip(context.get_ca_certs(binary_form=True), context.get_ca_certs(), strict=True)
    return [_subject(info) for der, info in trusted if der not in held]


def _subject(info: dict[str, Any]) -> str:
    """``commonName=..., organizationName=...``: a certificate's subject as
    ``SSLContext.get_ca_certs`` describes it."""
    rdns = info.get("subject", ())
    return ", ".join(f"{k}={v}" for rdn in rdns for k, v in rdn) or "(no subject)"


class RotatingSecret(str):
    """A SASL credential read from a file (``sasl_password_file``, ``sasl_username_file``):
    its text is the credential at start, :attr:`source` the file read again while running.
    FastStream and aiokafka keep the object as they were given it; an aiokafka client turns
    it into the file's current text when it opens a connection (:func:`_follow_rotations`)."""

    source: SecretFile

    def __new__(cls, source: SecretFile) -> RotatingSecret:
        made = super().__new__(cls, source.value())
        made.source = source
        return made

    def __repr__(self) -> str:
        return f"RotatingSecret({self.source.path!r})"  # never the secret

    def __copy__(self) -> RotatingSecret:
        return self  # a copy of the arguments (or a deep one) still follows the file

    def __deepcopy__(self, memo: dict[int, object]) -> RotatingSecret:
        return self


class _Current:
    """A data descriptor for ``AIOKafkaClient._sasl_plain_password`` (and ``..._username``).

    aiokafka copies ``sasl_plain_password`` and ``sasl_plain_username`` into its client at
    construction and passes those attributes to ``create_conn`` for every connection it
    opens (the bootstrap, and each broker's first connection or reconnection); the
    connection then authenticates with the strings it was given. A client made before a
    rotation would authenticate with the old credentials for good. Read through this
    descriptor, a :class:`RotatingSecret` yields its file's current text each time; any
    other value (a credential given as a variable, None) is returned as it was set.
    """

    def __init__(self, slot: str) -> None:
        # the instance's own entry: a data descriptor is looked up before it, and a client
        # made before the descriptor was installed is read as it stored its credentials
        self._slot = slot

    def __get__(self, client: object, owner: type | None = None) -> object:
        if client is None:
            return self
        value = client.__dict__.get(self._slot)
        return value.source.value() if isinstance(value, RotatingSecret) else value

    def __set__(self, client: object, value: object) -> None:
        client.__dict__[self._slot] = value


_FOLLOW_LOCK = threading.Lock()
_ROTATING_SLOTS = ("_sasl_plain_username", "_sasl_plain_password")


def _follow_rotations() -> None:
    """Make every aiokafka client read a :class:`RotatingSecret` anew for each connection
    it opens (idempotent; a client made before reads as it did)."""
    with _FOLLOW_LOCK:
        for slot in _ROTATING_SLOTS:
            if not isinstance(AIOKafkaClient.__dict__.get(slot), _Current):
                setattr(AIOKafkaClient, slot, _Current(slot))


def _rotating(kafka: KafkaSettings, path: str, setting: str) -> RotatingSecret:
    _follow_rotations()
    # the username and password files are opened together (one moment of the Secret)
    secret_files(
        [
            (file, name, "new Kafka connections")
            for file, name in (
                (kafka.sasl_username_file, "GUARDRAIL_KAFKA__SASL_USERNAME_FILE"),
                (kafka.sasl_password_file, "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE"),
            )
            if file is not None
        ]
    )
    return RotatingSecret(secret_file(path, setting, "new Kafka connections"))


def sasl_password(kafka: KafkaSettings) -> str:
    """The SASL password to give the clients: ``sasl_password``, or a
    :class:`RotatingSecret` of ``sasl_password_file`` (read the first time:
    ``ConfigError`` when the file holds none)."""
    if kafka.sasl_password_file is not None:
        return _rotating(kafka, kafka.sasl_password_file, "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE")
    assert kafka.sasl_password is not None  # noqa: S101 - checked by KafkaSettings
    return kafka.sasl_password.get_secret_value()


def sasl_username(kafka: KafkaSettings) -> str:
    """The SASL username to give the clients: ``sasl_username``, or a
    :class:`RotatingSecret` of ``sasl_username_file`` (read the first time:
    ``ConfigError`` when the file holds none)."""
    if kafka.sasl_username_file is not None:
        return _rotating(kafka, kafka.sasl_username_file, "GUARDRAIL_KAFKA__SASL_USERNAME_FILE")
    assert kafka.sasl_username is not None  # noqa: S101 - checked by KafkaSettings
    return kafka.sasl_username


def faststream_security(kafka: KafkaSettings) -> BaseSecurity | None:
    """FastStream's security object for the configured protocol (None: plaintext)."""
    context = shared_ssl_context(kafka)
    if not kafka.security_protocol.startswith("SASL"):
        return BaseSecurity(ssl_context=context, use_ssl=True) if context else None
    cls = {
        "PLAIN": SASLPlaintext,
        "SCRAM-SHA-256": SASLScram256,
        "SCRAM-SHA-512": SASLScram512,
    }[kafka.sasl_mechanism or "PLAIN"]
    return cls(
        username=sasl_username(kafka),
        password=sasl_password(kafka),
        use_ssl=context is not None,
        ssl_context=context,
    )


def aiokafka_client_args(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments for aiokafka clients (admin, plain producers and consumers)."""
    args: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "security_protocol": kafka.security_protocol,
        "request_timeout_ms": kafka.request_timeout_ms,
    }
    context = shared_ssl_context(kafka)
    if context is not None:
        args["ssl_context"] = context
    if kafka.security_protocol.startswith("SASL"):
        args["sasl_mechanism"] = kafka.sasl_mechanism
        args["sasl_plain_username"] = sasl_username(kafka)
        args["sasl_plain_password"] = sasl_password(kafka)
    return args
