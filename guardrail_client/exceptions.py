"""The client's errors and warnings, under the project's one root exception."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from sidecar.exceptions import BrokerError, GuardrailError


class ClientError(GuardrailError):
    """Root of every error the guardrail client raises on purpose."""


class ClientBrokerError(ClientError, BrokerError):
    """Kafka could not be reached, or lacks a topic the client needs, at ``start()``.

    A :class:`ClientError` (as everything the client raises on purpose) and still the
    :class:`~sidecar.exceptions.BrokerError` it always was."""


def require_topics(topics: Sequence[str], known: Collection[str], servers: str) -> None:
    """``ClientBrokerError`` naming ``topics`` that are not among ``known`` (the broker's),
    and how to create them: what the publisher and the verdict client check at start."""
    missing = [t for t in topics if t not in known]
    if missing:
        raise ClientBrokerError(
            f"topics {missing} do not exist at {servers}: nothing creates them on its own "
            "(the sidecar never does); create them with: guardrail topics create "
            "--bootstrap-servers H:P"
        )


MTLS_PRINCIPAL: Final = (
    "; PRINCIPAL: with mutual TLS, the subject of the client certificate as the cluster names "
    "it (without ssl.principal.mapping.rules: RFC 2253, the last RDN first, e.g. "
    "CN=llm-service,O=Acme; `openssl x509 -noout -subject -nameopt RFC2253 -in CERT` prints "
    "it in that order), quoted for the shell"
)


def require_authorised(
    wanted: Mapping[str, int],
    known: Collection[str],
    operations: Mapping[str, int | None],
    client_options: Mapping[str, Any],
) -> None:
    """``ClientBrokerError`` when the cluster's ACLs refuse this client an operation of
    ``wanted`` (topic -> the operation it needs), naming each and its grant; a topic that
    is missing, :func:`require_topics`'s error. ``known``: the topics in the cluster's
    metadata; ``operations``: ``guardrail_client.authorised.topic_operations``."""
    from guardrail_client.authorised import OPERATION_NAMES, grant  # noqa: PLC0415

    servers = str(client_options["bootstrap_servers"])
    user = client_options.get("sasl_plain_username")
    principal = f"User:{user}" if isinstance(user, str) and user else "User:PRINCIPAL"
    # mutual TLS: an ssl_context does not say which certificate it holds; say where to look
    mtls = principal == "User:PRINCIPAL" and client_options.get("security_protocol") == "SSL"
    said, lines = [], []
    for topic, operation in wanted.items():
        field = operations.get(topic)
        if field is None or field >> operation & 1:
            continue  # granted, or the cluster did not say
        name = OPERATION_NAMES[operation]
        said.append(f"{name} on topic {topic}" + (" (not even Describe now)" if not field else ""))
        lines.append(grant(servers, principal, name, f"--topic {topic}"))
    if said:
        raise ClientBrokerError(
            f"the Kafka cluster at {servers} does not allow this client's principal "
            f"({principal}) {'; '.join(said)} (Kafka ACLs). Grant it, e.g. {' && '.join(lines)}"
            + (MTLS_PRINCIPAL if mtls else "")
            + (
                "; a topic it may not even describe may also not exist: it cannot tell"
                if any(x.endswith("(not even Describe now)") for x in said)
                else ""
            )
        )
    require_topics(list(wanted), known, servers)


class InvalidEventError(ClientError):
    """An event the caller asked to publish breaks the contract or the sidecar's input
    limits (:class:`~guardrail_client.events.SidecarLimits`); it was not sent.

    A caller's bug, not the sidecar's input: it is raised at the call site so
    that it never reaches Kafka (where the sidecar would dead-letter it).
    """

    def __init__(self, event_type: str, detail: str) -> None:
        super().__init__(
            f"{event_type} event breaks the contract or the sidecar's limits: {detail}"
        )
        self.event_type = event_type
        self.detail = detail


class InvalidArgumentError(ClientError, ValueError):
    """An argument of a client call or constructor is out of its allowed range (a timeout
    of ``nan``, a negative bound). A caller's bug; the message names the argument and what
    is allowed. Also a :class:`ValueError`, as these checks always raised."""


class ClientNotStartedError(ClientError):
    """A publisher or verdict client was used before ``start()``, once ``stop()`` began, or
    after the event loop it was started on ended (the loop closed, its thread died, or the
    process forked): an event it accepted then could never be sent, so it refuses it."""


class ClientAlreadyStartedError(ClientError):
    """``start()`` was called on a publisher or verdict client that is already started (or
    starting); call ``stop()`` first. A second producer or consumer is never created."""


class VerdictTimeoutError(ClientError):
    """No verdict came within the timeout and ``on_timeout="raise"`` was chosen.

    ``source`` says why: ``timeout`` (nothing arrived in time: the sidecar is
    down, lagging, or the events never reached Kafka) or ``unavailable`` (this
    client's own consumer is not running).
    """

    retriable = True

    def __init__(self, request_id: str, source: str, waited_s: float) -> None:
        super().__init__(
            f"no verdict for request {request_id!r} after {waited_s:.3f}s ({source}); "
            "on_timeout='raise' was chosen (allowed: 'allow', 'block', 'raise')"
        )
        self.request_id = request_id
        self.source = source
        self.waited_s = waited_s


class PartitionerWarning(UserWarning):
    """The producer was given a partitioner other than Kafka's murmur2 default.

    The sidecar needs a request's retrieval and generation events on the same
    partition number of the two (co-partitioned) topics, as every Kafka client
    that hashes the key with murmur2 puts them.
    """
