"""Explicit topic creation, and the check ``guardrail run`` makes before consuming.

The broker never auto-creates topics. ``rag.retrieval``, ``rag.generation``
and ``rag.feedback`` get the same partition count (they are co-partitioned by
request_id so one consumer sees both halves of a request and its feedback).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from guardrail_client.authorised import grant
from sidecar.config import KafkaSettings, Settings
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.permissions import hidden_topics_refusal, principal_hint, topic_operations
from sidecar.kafka.security import aiokafka_client_args

log = logging.getLogger(__name__)

DLQ_RETENTION_MS = 14 * 24 * 3600 * 1000
SETTLE_S = 5.0  # how long a freshly created topic may take to show its partitions


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(settings: Settings) -> list[TopicSpec]:
    t = settings.topics
    big = str(settings.topics.max_message_bytes)
    # A producer's compressed batch is checked against max.message.bytes as compressed
    # bytes: 600 KB of gzip on the wire decompressed to 600 MiB in the consumer and
    # OOM-killed the sidecar on every restart (a memory audit against a real broker).
    # With compression.type=uncompressed the broker decompresses each batch and refuses
    # one whose records exceed max.message.bytes (RecordTooLarge to that producer).
    inputs = {"max.message.bytes": big, "compression.type": "uncompressed"}
    return [
        TopicSpec(t.retrieval, t.partitions, inputs),
        TopicSpec(t.generation, t.partitions, inputs),
        TopicSpec(t.claims, t.partitions, {}),
        TopicSpec(t.verdicts, t.partitions, {}),
        TopicSpec(t.feedback, t.partitions, {"compression.type": "uncompressed"}),
        TopicSpec(t.reports, 1, {}),
        # one record per calibration key (the latest: a withdrawal or a tombstone); every
        # replica reads it from its start, so it must never lose a key to retention
        TopicSpec(t.certificates, 1, {"cleanup.policy": "compact", "retention.ms": "-1"}),
        TopicSpec(t.dlq, 1, {"max.message.bytes": big, "retention.ms": str(DLQ_RETENTION_MS)}),
    ]


async def create_topics(settings: Settings) -> dict[str, str]:
    """Create the sidecar's topics; returns name -> "created" | "exists"."""
    admin = await started_admin(settings.kafka)
    try:
        specs = topic_specs(settings)
        existing = set(await admin.list_topics())
        result = {s.name: "exists" for s in specs if s.name in existing}
        missing = [s for s in specs if s.name not in existing]
        if missing:
            try:
                response = await admin.create_topics(
                    [
                        NewTopic(
                            name=s.name,
                            num_partitions=s.partitions,
                            replication_factor=settings.topics.replication_factor,
                            topic_configs=s.config,
                        )
                        for s in missing
                    ]
                )
            except TopicAlreadyExistsError:
                response = None
            result.update(_created(settings, missing, response))
        await _check_copartitioned(admin, settings)
        return result
    finally:
        await admin.close()


_TOPIC_ALREADY_EXISTS: Final = 36
_AUTHORIZATION: Final = (29, 31)  # TOPIC_ / CLUSTER_AUTHORIZATION_FAILED
_INVALID_REPLICATION_FACTOR: Final = 38


def _created(settings: Settings, asked: list[TopicSpec], response: Any) -> dict[str, str]:
    """Each asked topic -> "created" | "exists", from the broker's answer per topic.

    Every topic was said "created" whatever the answer: a replication factor above the
    brokers' count, a topic the principal may not create (Kafka ACLs), a configuration a
    managed cluster's policy refuses: nothing was created, the command said so for all
    eight and exited 0, and the sidecar then refused to start on missing topics.
    ``ConfigError`` naming each refusal and the setting or ACL to change.
    """
    if response is None:  # the whole request refused: they exist already
        return {s.name: "exists" for s in asked}
    out: dict[str, str] = {}
    refused: dict[str, str] = {}
    codes: set[int] = set()
    for row in response.to_object()["topic_errors"]:
        code, name = row["error_code"], row["topic"]
        if code == 0:
            out[name] = "created"
        elif code == _TOPIC_ALREADY_EXISTS:
            out[name] = "exists"
        else:
            codes.add(code)
            kind = for_code(code).__name__
            refused[name] = f"{kind}: {row.get('error_message') or for_code(code).description}"
    if not refused:
        return out
    hint = ""
    if codes & set(_AUTHORIZATION):
        hint = (
            "; the cluster's ACLs do not let this client create topics: run it as a principal "
            "that may (Create on the cluster, or on each topic), e.g. "
            + grant(
                settings.kafka.bootstrap_servers, principal_hint(settings), "Create", "--cluster"
            )
        )
    elif _INVALID_REPLICATION_FACTOR in codes:
        hint = (
            f"; GUARDRAIL_TOPICS__REPLICATION_FACTOR={settings.topics.replication_factor} "
            "must be at most the number of brokers"
        )
    done = ", ".join(f"{n} {what}" for n, what in out.items())
    by_reason: dict[str, list[str]] = {}
    for name, why in refused.items():
        by_reason.setdefault(why, []).append(name)
    raise ConfigError(
        f"the broker refused to create {len(refused)} topic(s): "
        + "; ".join(f"{', '.join(names)} ({why})" for why, names in by_reason.items())
        + hint
        + (f" ({done})" if done else "")
    )


async def _check_copartitioned(admin: AIOKafkaAdminClient, settings: Settings) -> None:
    problem = partition_count_problem(input_topics(settings), await _counts_of(admin, settings))
    if problem is not None:
        raise ConfigError(f"{problem} (one sidecar must see a request's events and its feedback)")


def input_topics(settings: Settings) -> tuple[str, ...]:
    """The topics the sidecar reads, co-partitioned by request_id."""
    t = settings.topics
    return (t.retrieval, t.generation, t.feedback)


def output_topics(settings: Settings) -> tuple[str, ...]:
    t = settings.topics
    return (t.verdicts, t.claims, t.dlq, t.reports, t.certificates)


def format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{topic} has {n}" for topic, n in counts.items())


def partition_count_problem(topics: tuple[str, ...], counts: dict[str, int]) -> str | None:
    """What is wrong with the input topics' partition counts, in one line (None: nothing)."""
    missing = [t for t in topics if t not in counts]
    if missing:
        return f"input topic(s) {', '.join(missing)} missing"
    if len(set(counts.values())) > 1:
        return (
            f"the input topics' partition counts differ ({format_counts(counts)}); they must be "
            "equal: keys are hashed to partition numbers and partition p of every input topic "
            "goes to one member"
        )
    return None


async def _counts_of(
    admin: AIOKafkaAdminClient, settings: Settings, existing: set[str] | None = None
) -> dict[str, int]:
    """Partition counts of the input topics (of those in ``existing``, when given).

    A topic created moments ago may answer without its partitions yet (leader
    not available): asked again for up to ``SETTLE_S``.
    """
    names = [t for t in input_topics(settings) if existing is None or t in existing]
    if not names:
        return {}
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while True:
        described = await admin.describe_topics(names)
        settled = all(d.get("error_code", 0) == 0 and d["partitions"] for d in described)
        if settled or asyncio.get_running_loop().time() > deadline:
            return {d["topic"]: len(d["partitions"]) for d in described}
        await asyncio.sleep(0.2)


# what aiokafka logs (and does not raise) when the broker answers but refuses the client:
# bad credentials, a mechanism it does not offer, a SASL client on a plain listener
_REFUSALS = ("SaslAuthenticationFailed", "IllegalSaslStateError", "UnsupportedSaslMechanism")
# ... when this client refuses the broker's TLS certificate (a CA that did not sign it, a
# name the certificate does not hold, an expired one): in aiokafka's error line
_CERT_REFUSALS = ("CERTIFICATE_VERIFY_FAILED",)
# ... when the broker refuses this client's certificate (mutual TLS: none sent, or one from
# a CA it does not trust): the TLS alert is logged only at DEBUG ("Closing connection"), and
# the error line says "Connection ... closed" as for a broker that went away
_CLIENT_CERT_REFUSALS = (
    "ALERT_BAD_CERTIFICATE",
    "ALERT_CERTIFICATE_REQUIRED",
    "ALERT_CERTIFICATE_UNKNOWN",
    "ALERT_UNKNOWN_CA",
    "ALERT_CERTIFICATE_EXPIRED",
    "ALERT_CERTIFICATE_REVOKED",
)
_CONN_LOGGER = "aiokafka.conn"
_SSL_SOURCE = re.compile(r" ?\(_ssl\.c:\d+\)\)*")


def _protocol_hint(kafka: KafkaSettings) -> str:
    """Which protocol was spoken: a listener of another one closes the connection without a
    word (TLS audit: "Connection ... closed", or an error line with an empty message)."""
    return (
        f"__SECURITY_PROTOCOL={kafka.security_protocol}: the listener at that address must speak it"
    )


class _ConnWatch:
    """The one DEBUG watch on ``aiokafka.conn`` that every :class:`AuthRefusals` inside
    ``watching()`` shares: its lines below the level the log shows go to the watchers
    only. Each watch used to save the logger's level, set DEBUG and put the saved level
    back: two overlapping ones (the verdicts' and the labels' reads on an assignment, side
    by side) left it at DEBUG for good, and every fetch's request and response went to the
    log (CI: the lines a test looked for pushed out of a replica's log tail)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: list[AuthRefusals] = []
        self._own_level = logging.NOTSET
        self._shown_from = logging.WARNING

    def _seen_then_shown(self, record: logging.LogRecord) -> bool:
        if record.levelno < self._shown_from:
            for watcher in list(self._watchers):
                watcher.emit(record)  # the handlers on "aiokafka" will not see it
            return False
        return True

    def add(self, watcher: AuthRefusals) -> None:
        conn = logging.getLogger(_CONN_LOGGER)
        with self._lock:
            if not self._watchers:
                self._own_level, self._shown_from = conn.level, conn.getEffectiveLevel()
                conn.setLevel(min(self._shown_from, logging.DEBUG))
                conn.addFilter(self._seen_then_shown)
            self._watchers.append(watcher)

    def remove(self, watcher: AuthRefusals) -> None:
        conn = logging.getLogger(_CONN_LOGGER)
        with self._lock:
            self._watchers.remove(watcher)
            if not self._watchers:
                conn.removeFilter(self._seen_then_shown)
                conn.setLevel(self._own_level)


class AuthRefusals(logging.Handler):
    """Collects aiokafka's log lines that say the broker refused the client's authentication
    (SASL, or its TLS certificate) or the client refused the broker's certificate: the
    bootstrap error it raises says only "Unable to bootstrap" (audit: reported as "cannot
    reach Kafka", naming the bootstrap servers and the timeout to check, and retried for
    ever under GUARDRAIL_KAFKA__WAIT_AT_START)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []  # SASL
        self.server_cert: list[str] = []  # this client refused the broker's certificate
        self.client_cert: list[str] = []  # the broker refused this client's certificate

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for names, found in (
            (_REFUSALS, self.seen),
            (_CERT_REFUSALS, self.server_cert),
            (_CLIENT_CERT_REFUSALS, self.client_cert),
        ):
            for name in names:
                if name in message:
                    at = message.index(name)
                    if names is not _REFUSALS:  # from "[SSL: ...", without "(_ssl.c:1006))"
                        ssl_at = message.rfind("[SSL: ", 0, at)
                        at = at if ssl_at < 0 else ssl_at
                    found.append(_SSL_SOURCE.sub("", message[at:])[:300])
                    return

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Collect while inside: the lines at the "aiokafka" logger's levels by a handler
        there, and those below them on ``aiokafka.conn`` (the TLS alert of a refused
        client certificate comes at DEBUG) through :data:`_CONN_WATCH`, without passing
        on what the log would not have shown."""
        logger = logging.getLogger("aiokafka")
        logger.addHandler(self)
        _CONN_WATCH.add(self)
        try:
            yield
        finally:
            _CONN_WATCH.remove(self)
            logger.removeHandler(self)

    def refusal(self, kafka: KafkaSettings) -> ConfigError | None:
        """The configuration error its lines show (None: no refusal seen)."""
        servers = kafka.bootstrap_servers
        if self.seen:  # it answered, and refused this client: retrying cannot help
            return ConfigError(
                f"Kafka at {servers} refused this client's authentication "
                f"({self.seen[-1]}): check GUARDRAIL_KAFKA__SECURITY_PROTOCOL, "
                "__SASL_MECHANISM, __SASL_USERNAME and __SASL_PASSWORD (or the files named by "
                "__SASL_USERNAME_FILE and __SASL_PASSWORD_FILE)"
            )
        if self.server_cert:
            return ConfigError(
                f"the TLS certificate of Kafka at {servers} was not accepted "
                f"({self.server_cert[-1]}): GUARDRAIL_KAFKA__SSL_CAFILE="
                f"{kafka.ssl_cafile or '(unset: the system CAs)'} must hold the CA that signed "
                "it, and it must name the host given in GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS"
            )
        if self.client_cert:
            return ConfigError(
                f"Kafka at {servers} refused this client's TLS certificate "
                f"({self.client_cert[-1]}): its listener requires one signed by a CA it trusts; "
                f"check GUARDRAIL_KAFKA__SSL_CERTFILE={kafka.ssl_certfile or '(unset)'} and "
                f"__SSL_KEYFILE={kafka.ssl_keyfile or '(unset)'}"
            )
        return None


_CONN_WATCH: Final = _ConnWatch()


@contextlib.contextmanager
def refusals_said(kafka: KafkaSettings) -> Iterator[None]:
    """Inside it, a Kafka client's failure to connect whose log lines show a refusal (the
    broker refused the credentials or the client's certificate, or the client the
    broker's certificate) is raised as the ``ConfigError`` that says which settings to
    check: aiokafka's own error says only "Unable to bootstrap"."""
    refusals = AuthRefusals()
    try:
        with refusals.watching():
            yield
    except (KafkaError, OSError, TimeoutError):
        refused = refusals.refusal(kafka)
        if refused is not None:
            raise refused from None
        raise


async def started_admin(kafka: KafkaSettings) -> AIOKafkaAdminClient:
    """An admin client connected to the brokers within the request timeout, or the reason
    it is not: ``BrokerError`` (unreachable), or the ``ConfigError`` of a refusal (TLS or
    SASL: retrying cannot help). Closed again when the start fails or is cancelled."""
    timeout_s = kafka.request_timeout_ms / 1000.0
    admin = AIOKafkaAdminClient(**aiokafka_client_args(kafka))
    started = time.monotonic()
    refusals = AuthRefusals()
    try:
        with refusals.watching():
            async with asyncio.timeout(timeout_s):
                await admin.start()
    except (KafkaError, OSError, TimeoutError) as exc:
        await admin.close()
        refused = refusals.refusal(kafka)
        if refused is not None:  # it answered, and one side refused the other: retrying
            raise refused from None  # cannot help
        detail = (str(exc).splitlines() or [""])[0] or type(exc).__name__
        took = (  # a refused connection or an unknown host fails long before the timeout
            f"within {timeout_s:g} s"
            if isinstance(exc, TimeoutError)
            else f"(gave up after {time.monotonic() - started:.1f} s)"
        )
        raise BrokerError(
            f"cannot reach Kafka at {kafka.bootstrap_servers} {took} "
            f"(GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS, __REQUEST_TIMEOUT_MS; "
            f"{_protocol_hint(kafka)}): {detail}"
        ) from None
    except asyncio.CancelledError:  # SIGTERM while connecting: close what was opened
        await admin.close()
        raise
    return admin


async def verify_topics(settings: Settings) -> dict[str, int]:
    """Refuse to serve on a topic layout the join cannot work with; returns the input counts.

    Every input topic (retrieval, generation, feedback) and output topic
    (verdicts, claims, dlq, reports, certificates) must exist, and the input topics must have
    equal partition counts. Waits at most the request timeout for the broker.
    """
    kafka = settings.kafka
    timeout_s = kafka.request_timeout_ms / 1000.0
    admin = await started_admin(kafka)
    try:
        existing, counts = await _layout(admin, settings, timeout_s)
        read = [t for t in (*input_topics(settings), settings.topics.certificates) if t in existing]
        configs = await _topic_configs(admin, read, timeout_s)
        missing = [
            t for t in (*input_topics(settings), *output_topics(settings)) if t not in existing
        ]
        hidden = await _hidden(admin, missing, timeout_s)
    finally:
        await admin.close()
    compressed = {
        t: c["compression.type"]
        for t in input_topics(settings)
        if (c := configs.get(t)) and c.get("compression.type", "uncompressed") != "uncompressed"
    }
    cleanup = configs.get(settings.topics.certificates, {}).get("cleanup.policy")
    if cleanup is not None and "compact" not in cleanup:
        log.warning(
            "%s (GUARDRAIL_TOPICS__CERTIFICATES) has cleanup.policy=%s: its withdrawals are "
            "deleted with its retention, and replicas started after that allow a withdrawn "
            "certificate again. Set cleanup.policy=compact (guardrail topics create does)",
            settings.topics.certificates, cleanup,
        )  # fmt: skip
    if compressed:
        log.warning(
            "input topic(s) %s accept compressed batches (compression.type=%s): the broker "
            "checks max.message.bytes against the compressed bytes, so a small batch can "
            "inflate far past it; the consumer stops at GUARDRAIL_KAFKA__MAX_BATCH_INFLATED_BYTES "
            "and dead-letters the rest of such a batch (batch-too-large). Set "
            "compression.type=uncompressed on them (guardrail topics create does): the broker "
            "then refuses an oversize record to its producer",
            ", ".join(sorted(compressed)),
            "/".join(sorted(set(compressed.values()))),
        )
    if hidden:
        raise hidden_topics_refusal(settings, hidden)
    if missing:
        raise ConfigError(
            f"topic(s) {', '.join(missing)} do not exist on {kafka.bootstrap_servers}; "
            "create them first (`guardrail topics create`; the sidecar never auto-creates)"
        )
    problem = partition_count_problem(input_topics(settings), counts)
    if problem is not None:
        raise ConfigError(problem)
    return counts


async def _hidden(admin: AIOKafkaAdminClient, missing: list[str], timeout_s: float) -> list[str]:
    """Those of ``missing`` (topics the cluster's list lacks) that the broker says this
    client may not describe: with Kafka ACLs a topic the principal has no ACL on is left
    out of the list, and was said not to exist."""
    if not missing:
        return []
    try:
        async with asyncio.timeout(timeout_s):
            operations = await topic_operations(admin, missing)
    except (KafkaError, TimeoutError):
        return []  # said missing, as before
    return [t for t in missing if operations.get(t) == 0]


async def _topic_configs(
    admin: AIOKafkaAdminClient, names: list[str], timeout_s: float
) -> dict[str, dict[str, str]]:
    """Each named topic's configuration ({} when it cannot be read: a warning's input,
    never a reason not to start)."""
    if not names:
        return {}
    try:
        async with asyncio.timeout(timeout_s):
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, t) for t in names]
            )
    except (KafkaError, TimeoutError) as exc:
        log.info("cannot read the topics' configuration (%s)", exc)
        return {}
    found: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.resources:
            error_code, _message, _type, topic, entries = resource[:5]
            if error_code != 0:
                continue
            found[topic] = {str(entry[0]): str(entry[1]) for entry in entries}
    return found


async def _layout(
    admin: AIOKafkaAdminClient, settings: Settings, timeout_s: float
) -> tuple[set[str], dict[str, int]]:
    """The topic names on the cluster and the input topics' partition counts."""
    try:
        async with asyncio.timeout(timeout_s):
            existing = set(await admin.list_topics())
        async with asyncio.timeout(timeout_s):
            counts = await _counts_of(admin, settings, existing)
    except (KafkaError, TimeoutError) as exc:
        raise BrokerError(
            f"could not read topic metadata from {settings.kafka.bootstrap_servers}: "
            f"{(str(exc).splitlines() or [''])[0] or type(exc).__name__}"
        ) from None
    return existing, counts
