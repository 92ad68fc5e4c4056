"""One root exception for the project, with flags callers branch on.

Callers never parse message text: they look at the class and its flags.
``retriable`` says whether the same operation may succeed when tried again
(a broker that is briefly away); ``dead_letter`` says whether the input that
caused it belongs in the dead-letter topic (bad data, not a bug of ours).
"""

from __future__ import annotations


class GuardrailError(Exception):
    """Root of every error this package raises on purpose."""

    retriable: bool = False
    dead_letter: bool = False


class ConfigError(GuardrailError):
    """The configuration is wrong; raised at start, never while serving."""


class InputError(GuardrailError):
    """An input event is unusable. It goes to the dead-letter topic with ``reason``.

    ``reason`` is a short machine-readable slug (``malformed-json``,
    ``schema-violation``, ``unknown-schema-version`` ...) put in the DLQ headers;
    the message is the human-readable detail.
    """

    dead_letter = True

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class ArtifactError(GuardrailError):
    """A model or calibration artifact is missing, corrupt or does not match its events."""


class LifecycleError(GuardrailError):
    """A method was called out of order (``predict`` before ``fit`` / ``calibrate``)."""


class BrokerError(GuardrailError):
    """The Kafka broker could not be reached or refused an operation."""

    retriable = True


class LocalKafkaError(GuardrailError):
    """The project's local Kafka broker could not be fetched, formatted or started."""
