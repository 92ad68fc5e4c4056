"""Client security (SASL / SSL) from settings, for FastStream and plain aiokafka."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from faststream.security import (
    BaseSecurity,
    SASLPlaintext,
    SASLScram256,
    SASLScram512,
)

from sidecar.config import KafkaSettings
from sidecar.exceptions import ConfigError


class _EncryptedKeyError(Exception):
    """The client key asks for a passphrase."""


def _no_password() -> str:
    raise _EncryptedKeyError


def _is_encrypted(path: str) -> bool:
    """Whether the PEM file at ``path`` holds an encrypted private key (PKCS#8 or legacy)."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return "BEGIN ENCRYPTED PRIVATE KEY" in text or "Proc-Type: 4,ENCRYPTED" in text


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS context of ``*SSL`` protocols; ``ConfigError`` naming the file it cannot use."""
    if not kafka.security_protocol.endswith("SSL"):
        return None
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
        passphrase = kafka.ssl_key_password
        try:
            # an encrypted key and no passphrase: OpenSSL's own fallback prompts for it on
            # the terminal (audit: `guardrail run` under a TTY waited there for ever)
            context.load_cert_chain(
                kafka.ssl_certfile,
                kafka.ssl_keyfile,
                password=_no_password if passphrase is None else passphrase.get_secret_value(),
            )
        except _EncryptedKeyError:
            raise ConfigError(
                f"{key_names}: the private key is encrypted; set its passphrase in "
                "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD (from a Secret), or give the key "
                "unencrypted (openssl pkey -in KEY -out KEY.pem)"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            if passphrase is not None and _is_encrypted(kafka.ssl_keyfile or kafka.ssl_certfile):
                raise ConfigError(
                    f"{key_names}: GUARDRAIL_KAFKA__SSL_KEY_PASSWORD does not decrypt the "
                    f"private key ({exc}); it must be the key's passphrase"
                ) from None
            raise ConfigError(
                f"GUARDRAIL_KAFKA__SSL_CERTFILE={kafka.ssl_certfile} / "
                f"GUARDRAIL_KAFKA__SSL_KEYFILE={kafka.ssl_keyfile}: cannot load the client "
                f"certificate and key ({exc}); they must be readable PEM files that match"
            ) from None
    return context


def faststream_security(kafka: KafkaSettings) -> BaseSecurity | None:
    """FastStream's security object for the configured protocol (None: plaintext)."""
    context = ssl_context(kafka)
    if not kafka.security_protocol.startswith("SASL"):
        return BaseSecurity(ssl_context=context, use_ssl=True) if context else None
    assert kafka.sasl_username is not None  # noqa: S101 - checked by KafkaSettings
    assert kafka.sasl_password is not None  # noqa: S101
    cls = {
        "PLAIN": SASLPlaintext,
        "SCRAM-SHA-256": SASLScram256,
        "SCRAM-SHA-512": SASLScram512,
    }[kafka.sasl_mechanism or "PLAIN"]
    return cls(
        username=kafka.sasl_username,
        password=kafka.sasl_password.get_secret_value(),
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
    context = ssl_context(kafka)
    if context is not None:
        args["ssl_context"] = context
    if kafka.security_protocol.startswith("SASL"):
        assert kafka.sasl_password is not None  # noqa: S101 - checked by KafkaSettings
        args["sasl_mechanism"] = kafka.sasl_mechanism
        args["sasl_plain_username"] = kafka.sasl_username
        args["sasl_plain_password"] = kafka.sasl_password.get_secret_value()
    return args
