"""One root exception for the project, with flags callers branch on.

Callers never parse message text: they look at the class and its flags.
``retriable`` says whether the same operation may succeed when tried again
(a broker that is briefly away); ``dead_letter`` says whether the input that
caused it belongs in the dead-letter topic (bad data, not a bug of ours);
``fatal`` says that no retry can help: the process should stop being live and be
restarted with the cause in its log (an authorisation or configuration error).
"""

from __future__ import annotations


class GuardrailError(Exception):
    """Root of every error this package raises on purpose."""

    retriable: bool = False
    dead_letter: bool = False
    fatal: bool = False


class ConfigError(GuardrailError):
    """The configuration is wrong; raised at start, never while serving."""


class InputError(GuardrailError):
    """An input event is unusable. It goes to the dead-letter topic with ``reason``.

    ``reason`` is a short machine-readable slug (``malformed-json``,
    ``schema-violation``, ``unknown-schema-version`` ...) put in the DLQ headers;
    the message is the human-readable detail.
    """

    dead_letter = True

    def __init__(self, reason: str, detail: str, request_id: str | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.request_id = request_id  # the event's own, once it was read (the DLQ header)


class DataError(GuardrailError, ValueError):
    """Probabilities, scores, labels or feature values that violate a documented contract.

    Also a :class:`ValueError` (the conventional type for "right type, wrong value"), so bad
    data is told apart from bad configuration (:class:`ConfigError`) and from broken
    artifacts (:class:`ArtifactError`).
    """


class ArtifactError(GuardrailError):
    """A model or calibration artifact is missing, corrupt or does not match its events."""


class LifecycleError(GuardrailError):
    """A method was called out of order (``predict`` before ``fit`` / ``calibrate``)."""


class BrokerError(GuardrailError):
    """The Kafka broker could not be reached or refused an operation."""

    retriable = True


class RecordTooLargeError(BrokerError):
    """One record can never be published as it is (larger than the topic or request limit).

    Retrying the same bytes cannot succeed: the record goes to the dead-letter
    topic instead, cut down to fit (``x-dlq-truncated``).
    """

    retriable = False
    dead_letter = True

    def __init__(self, topic: str, detail: str) -> None:
        super().__init__(f"a record for {topic} is too large: {detail}")
        self.topic = topic
        self.detail = detail


class BrokerAccessError(BrokerError):
    """The cluster refuses this client for good: authorisation, a missing topic, a broken producer.

    Nothing the loop can retry fixes it; readiness and liveness go false so that
    the pod restarts with the cause (``topic`` and the broker's error) in its log.
    """

    retriable = False
    fatal = True

    def __init__(self, topic: str, detail: str) -> None:
        super().__init__(f"cannot publish to {topic}: {detail}")
        self.topic = topic
        self.detail = detail


class LocalKafkaError(GuardrailError):
    """The project's local Kafka broker could not be fetched, formatted or started."""


class StopTimeoutError(GuardrailError):
    """Stopping took longer than the shutdown grace (a processor call that never returns):
    the process must end without waiting for that call's thread."""


class SidecarNotReadyError(GuardrailError):
    """A sidecar process that a lab tool started (demo, chaos, bench) exited or never got ready."""


class ProxyError(GuardrailError):
    """The fault-injection network proxy (chaos) could not start."""
