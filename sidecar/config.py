"""The sidecar's configuration: one frozen pydantic-settings model.

Built once at the entry point (``Settings.load()``) and passed in; nothing else
reads the environment. Every variable has the prefix ``GUARDRAIL_`` and nested
sections use ``__``: ``GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS=broker:9092``.
Units are in the names (``ttl_ms``, ``max_message_bytes``).
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from sidecar.contracts.common import LabelName
from sidecar.environment import check_environment, explain
from sidecar.exceptions import ConfigError
from sidecar.redact import redact_text, redact_url

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_INT32_MAX = 2**31 - 1  # Kafka protocol fields (timeouts, fetch sizes) are int32
# host[:port] (aiokafka defaults the port to 9092); an IPv6 address in brackets
_HOST_PORT_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?$")
NonBlank = Annotated[str, StringConstraints(strip_whitespace=False, min_length=1, pattern=r"\S")]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    """How to reach the cluster. SASL/SSL options are for real clusters."""

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: NonBlank = "guardrail-sidecar"
    group_id: NonBlank = "guardrail-sidecar"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_username_file: NonBlank | None = Field(
        default=None,
        description="a file holding the SASL username instead of sasl_username (a key of the "
        "Secret that holds the password): read again with the password file, so that a user "
        "rotated with its password (Vault's dynamic Kafka credentials) is used by new "
        "connections without a restart",
    )
    sasl_password: SecretStr | None = None
    sasl_password_file: NonBlank | None = Field(
        default=None,
        description="a file holding the SASL password instead of sasl_password (a mounted "
        "Secret): read again every 30 s, and a changed password is used by new connections "
        "without a restart",
    )
    # a path, or unset: an empty value was read as unset (the system CAs, no client cert)
    ssl_cafile: NonBlank | None = None
    ssl_certfile: NonBlank | None = None
    ssl_keyfile: NonBlank | None = None
    ssl_key_password: SecretStr | None = Field(
        default=None,
        description="the passphrase of an encrypted client key (Kafka's ssl.key.password); "
        "needs ssl_certfile",
    )
    ssl_key_password_file: NonBlank | None = Field(
        default=None,
        description="a file holding the client key's passphrase instead of ssl_key_password: "
        "read with the TLS files, at start and whenever they change on disk (a key "
        "re-encrypted with a new passphrase)",
    )
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        default="read_committed",
        description="which input records the sidecar reads: read_committed skips the events "
        "of aborted Kafka transactions (they never happened) and reads an open transaction's "
        "only once it commits; read_uncommitted reads everything as soon as it is written. "
        "The same for producers that do not use transactions",
    )
    # the broker's group.max.session.timeout.ms defaults to 1,800,000 (30 min)
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=1_800_000)
    rebalance_timeout_ms: int = Field(
        default=300_000,
        ge=1_000,
        le=_INT32_MAX,
        description="how long the group waits for a member to rejoin when it rebalances. A "
        "member rejoins once the part of a batch in its processor is through (part_budget_ms; "
        "one record's claims can still take seconds on a throttled CPU), so that its "
        "verdicts are committed, not decided again by the next owner. aiokafka's default, "
        "session_timeout_ms, dropped a member busy longer than that from every rebalance: two "
        "replicas over a backlog of 15 s batches took the partitions from each other for good "
        "and decided nothing (Java's consumer uses max.poll.interval.ms, 300000). At least "
        "session_timeout_ms (unset, it follows a "
        "longer session_timeout_ms)",
    )
    max_poll_records: int = Field(default=500, ge=1)
    max_queued_records: int = Field(
        default=1_000,
        ge=1,
        le=1_000_000,
        description="consumed records that may wait for the processor (the claim verifier, "
        "the decision) before the consumer pauses its partitions; it resumes at half. Must be "
        "in [max_poll_records, 1000000]: at least one poll. The queue holds at most this plus "
        "one poll; the join TTL does not run while the sidecar is behind",
    )
    max_queued_bytes: int = Field(
        default=67_108_864,
        ge=1_048_576,
        le=17_179_869_184,
        description="bytes of consumed records (value, key and headers) that may wait for the "
        "processor before the consumer pauses its partitions, beside max_queued_records: 1,000 "
        "records of 1 MiB would otherwise wait in memory; it resumes at half. The queue holds "
        "at most this plus one poll",
    )
    max_poll_bytes: int = Field(
        default=4_194_304,
        ge=65_536,
        le=1_073_741_824,
        description="bytes of records (value, key and headers) one poll takes, beside "
        "max_poll_records (at least one record): the fetch limits count compressed bytes, so "
        "one fetch of small compressed batches can hold gigabytes; the rest wait in the "
        "fetcher, compressed, and are inflated by later polls",
    )
    batch: bool = Field(
        default=True,
        description="consume in batches and pipeline the publishes (false: one message and "
        "one confirmed publish at a time, the benchmark's baseline)",
    )
    batch_timeout_ms: int = Field(default=5, ge=0, le=10_000)
    part_budget_ms: int = Field(
        default=100,
        ge=0,
        le=600_000,
        description="processor time a consumed batch is worked on before what it has decided "
        "is published and the rest of the batch waits for the next part (with claims on, an "
        "answer's verdict also goes out as soon as it is decided). Bounds how long a verdict "
        "waits for the rest of its batch, how long a stop or a rebalance waits for the "
        "processor, and what the next owner of a killed replica's partitions decides again "
        "(with claims on, a backlog's poll of 100 answers took 11-19 s of verification on 2 "
        "cores, bench/batch_parts.py). 0: a batch is one part",
    )
    processing_thread: bool = Field(
        default=True,
        description="run the processor (segmentation, verifier, lookback) on a worker thread "
        "so that the event loop keeps the group's heartbeats and the health probes answering",
    )
    fetch_max_wait_ms: int = Field(
        default=100,
        ge=0,
        le=10_000,
        description="how long the broker may hold a fetch that finds no data. A fetch returns "
        "as soon as data arrives, so this does not delay records; it is how often an idle "
        "sidecar polls (10 ms: ~5 % of a core idle, 100 ms: ~2 %), and how long a partition "
        "resumed while a fetch is held waits for the next one",
    )
    request_timeout_ms: int = Field(default=30_000, ge=1_000, le=_INT32_MAX)
    wait_at_start: bool = Field(
        default=False,
        description="when Kafka cannot be reached at start, keep trying (backing off to 30 s, "
        "health endpoints up: live, not ready) instead of exiting 1; for a sidecar injected "
        "into an LLM pod, whose start must not wait for Kafka (a wrong topic layout still "
        "stops it)",
    )
    batches_in_flight: int = Field(
        default=4,
        ge=0,
        le=64,
        description="parts of consumed batches (part_budget_ms) whose outputs may still await "
        "the broker's confirmation while the next part is worked on (their inputs are "
        "committed only once confirmed); 0: each part's outputs are confirmed before the next "
        "part is worked on. Pays where the "
        "broker is a network hop away (drain medians, 4 vs 0: 1.21x at 4 ms round trip, "
        "1.37x at 10 ms; bench/remote_broker.py)",
    )
    producer_batch_bytes: int = Field(
        default=262_144,
        ge=1_024,
        le=16_777_216,
        description="bytes of outputs the producer gathers per partition into one request. A "
        "partition takes one request at a time, and a send that finds its batch full waits "
        "for the broker's answer to the one before: too small a batch makes a consumed "
        "batch's verdicts wait several round trips (aiokafka's default, 16 KiB, held about "
        "ten verdicts)",
    )
    max_partition_fetch_bytes: int = Field(
        default=131_072,
        ge=1_024,
        le=_INT32_MAX,
        description="bytes one fetch may return per partition: small enough that a catch-up "
        "drains the partitions in turns rather than one whole partition after another "
        "(a half-request must not wait behind another partition's backlog)",
    )
    max_batch_inflated_bytes: int = Field(
        default=33_554_432,
        ge=1_048_576,
        le=_INT32_MAX,
        description="bytes a compressed record batch may inflate to in the consumer (a topic's "
        "max.message.bytes and the fetch sizes count compressed bytes: 600 KB of gzip inflated "
        "to 600 MiB). The records of a batch past it that came out whole are read, and the "
        "rest are dead-lettered (batch-too-large) by one record naming their offsets. At least "
        "GUARDRAIL_LIMITS__MAX_MESSAGE_BYTES, so that any record the sidecar accepts is read",
    )
    align_inputs: bool = Field(
        default=True,
        description="while catching up on a backlog, pause the input partition whose record "
        "timestamps lead its co-partition's, so the join store holds whole requests rather "
        "than half-requests it must evict (sidecar/pipeline/flow.py)",
    )
    align_slack_ms: int = Field(
        default=0, ge=0, description="lead in event time tolerated before pausing (0: level)"
    )
    group_instance_id: str | None = Field(
        default=None,
        description="static group membership (KIP-345): a stable id per instance, e.g. the pod "
        "name (the chart sets it from metadata.name when kafka.staticMembership is on). A "
        "restart within session_timeout_ms then keeps the partitions without a rebalance; an "
        "instance that is gone for good holds them until the session times out",
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap_list(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",")]
        for server in servers:
            m = _HOST_PORT_RE.match(server)
            if m is None or (m.group(1) is not None and not 1 <= int(m.group(1)) <= 65535):
                raise ValueError(
                    "bootstrap_servers must be host[:port][,host[:port]...] with ports in "
                    "[1, 65535]"
                )
        return ",".join(servers)

    @property
    def servers(self) -> list[str]:
        """``bootstrap_servers`` as a list, one ``host[:port]`` each. FastStream takes a
        string for one server only (it wraps it in a list, which aiokafka does not split on
        commas): a cluster's list given as one string failed every start with "Unable to
        bootstrap from [('b-1:9092,b-2:9092,b-3', 9092)]"."""
        return self.bootstrap_servers.split(",")

    @model_validator(mode="before")
    @classmethod
    def _rebalance_follows_a_long_session(cls, data: Any) -> Any:
        """Left unset, ``rebalance_timeout_ms`` is at least ``session_timeout_ms``: before it
        existed aiokafka waited the session timeout, and a session above 300 s started."""
        if not isinstance(data, dict) or data.get("rebalance_timeout_ms") is not None:
            return data
        try:
            session = int(data.get("session_timeout_ms", 0))
        except (TypeError, ValueError):
            return data  # the field's own check says what is wrong
        if session > cls.model_fields["rebalance_timeout_ms"].default:
            return {**data, "rebalance_timeout_ms": session}
        return data

    @model_validator(mode="after")
    def _rebalance_outlasts_session(self) -> Self:
        if self.rebalance_timeout_ms < self.session_timeout_ms:
            raise ValueError(
                f"rebalance_timeout_ms must be at least session_timeout_ms="
                f"{self.session_timeout_ms}, got {self.rebalance_timeout_ms}"
            )
        return self

    @model_validator(mode="after")
    def _queue_holds_a_poll(self) -> Self:
        if self.max_queued_records < self.max_poll_records:
            raise ValueError(
                f"max_queued_records must be in [max_poll_records={self.max_poll_records}, "
                f"1000000] (the queue holds at least one poll), got {self.max_queued_records}"
            )
        return self

    @model_validator(mode="after")
    def _instance_id_legal(self) -> Self:
        if self.group_instance_id is not None and not _TOPIC_RE.match(self.group_instance_id):
            raise ValueError(
                f"group_instance_id {self.group_instance_id!r} is not a legal Kafka id "
                "(1-249 characters of A-Z a-z 0-9 . _ -); unset it for dynamic membership"
            )
        return self

    @model_validator(mode="after")
    def _sasl_complete(self) -> Self:
        if self.security_protocol.startswith("SASL"):
            missing = [
                name
                for name, value in (
                    ("sasl_mechanism", self.sasl_mechanism),
                    ("sasl_username", self.sasl_username_file or self.sasl_username),
                    ("sasl_password", self.sasl_password_file or self.sasl_password),
                )
                if value is None
                or not str(
                    value.get_secret_value() if isinstance(value, SecretStr) else value
                ).strip()
            ]
            if missing:
                raise ValueError(
                    f"security_protocol={self.security_protocol} needs "
                    f"{', '.join(missing)} (GUARDRAIL_KAFKA__SASL_MECHANISM, "
                    "GUARDRAIL_KAFKA__SASL_USERNAME or GUARDRAIL_KAFKA__SASL_USERNAME_FILE, "
                    "GUARDRAIL_KAFKA__SASL_PASSWORD or GUARDRAIL_KAFKA__SASL_PASSWORD_FILE)"
                )
        return self

    @model_validator(mode="after")
    def _password_once(self) -> Self:
        for variable, value, file in (
            ("GUARDRAIL_KAFKA__SASL_USERNAME", self.sasl_username, self.sasl_username_file),
            ("GUARDRAIL_KAFKA__SASL_PASSWORD", self.sasl_password, self.sasl_password_file),
            (
                "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD",
                self.ssl_key_password,
                self.ssl_key_password_file,
            ),
        ):
            if value is not None and file is not None:
                raise ValueError(_both_set(variable))
        return self

    @model_validator(mode="after")
    def _no_settings_the_protocol_ignores(self) -> Self:
        # as the chart refuses kafka.ssl.* without TLS: credentials set for a protocol that
        # does not use them were ignored without a word, and the start then failed to connect
        ignored = []
        if not self.security_protocol.startswith("SASL"):
            ignored += [
                name
                for name in (
                    "sasl_mechanism",
                    "sasl_username",
                    "sasl_username_file",
                    "sasl_password",
                    "sasl_password_file",
                )
                if getattr(self, name) is not None
            ]
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            ignored += [
                name
                for name in (
                    "ssl_cafile",
                    "ssl_certfile",
                    "ssl_keyfile",
                    "ssl_key_password",
                    "ssl_key_password_file",
                )
                if getattr(self, name) is not None
            ]
        if ignored:
            raise ValueError(
                f"{', '.join(ignored)} set, but security_protocol={self.security_protocol} "
                "does not use them: set GUARDRAIL_KAFKA__SECURITY_PROTOCOL to "
                + (
                    "SASL_SSL or SASL_PLAINTEXT"
                    if ignored[0].startswith("sasl")
                    else "SSL or SASL_SSL"
                )
                + ", or unset them"
            )
        for name in ("ssl_key_password", "ssl_key_password_file"):
            if getattr(self, name) is not None and self.ssl_certfile is None:
                raise ValueError(
                    f"{name} set without ssl_certfile: the passphrase is for the client key; "
                    "set GUARDRAIL_KAFKA__SSL_CERTFILE (and GUARDRAIL_KAFKA__SSL_KEYFILE if "
                    f"the key is in its own file), or unset GUARDRAIL_KAFKA__{name.upper()}"
                )
        return self


class TopicSettings(_Section):
    """Topic names. Retrieval and generation must be co-partitioned (same count, same key)."""

    retrieval: str = "rag.retrieval"
    generation: str = "rag.generation"
    claims: str = "rag.claims"
    verdicts: str = "rag.verdicts"
    dlq: str = "rag.dlq"
    feedback: str = Field(
        default="rag.feedback",
        description="labelled outcomes (consumed); co-partitioned with the inputs by request_id",
    )
    reports: str = Field(default="rag.reports", description="periodic coverage-bound reports")
    certificates: str = Field(
        default="rag.certificates",
        description="the fleet's allow-certificate withdrawals (compacted, read from its start "
        "by every replica whose policy certifies an allow)",
    )
    partitions: int = Field(default=3, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1, le=32_767)  # an int16 in CreateTopics
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        le=_INT32_MAX - 65_536,  # the producer's request size adds 64 KiB to it
        description="max.message.bytes of the input and DLQ topics (and the producer's "
        "request size): an oversize input must still fit into the DLQ untouched",
    )

    @model_validator(mode="after")
    def _names(self) -> Self:
        names = [
            self.retrieval,
            self.generation,
            self.claims,
            self.verdicts,
            self.dlq,
            self.feedback,
            self.reports,
            self.certificates,
        ]
        for name in names:
            if not _TOPIC_RE.match(name) or name in (".", ".."):
                raise ValueError(
                    f"topic name {name!r} is not a legal Kafka topic name "
                    "(1-249 characters of A-Z a-z 0-9 . _ -, not '.' or '..')"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"topic names must be distinct, got {names}")
        return self


TOPIC_ROLES = tuple(
    name
    for name in TopicSettings.model_fields
    if name not in ("partitions", "replication_factor", "max_message_bytes")
)
"""The sidecar's topics by role (the fields of :class:`TopicSettings` that name one)."""


class JoinSettings(_Section):
    """The bounded store that joins the two halves of a request by request_id."""

    max_entries: int = Field(default=10_000, ge=1)
    ttl_ms: int = Field(default=30_000, ge=1)
    sweep_interval_ms: int = Field(default=500, ge=10)
    max_bytes: int = Field(
        default=268_435_456,
        ge=65_536,
        description="bytes all open requests may hold together (raw inputs, the decoded "
        "attention summaries of final events, the trace headers they keep and 160 bytes per "
        "held event); the oldest request is evicted (block / incomplete, counted) to stay "
        "under it. Each open request also costs about 5 KB of heap besides, bounded by "
        "max_entries",
    )
    decided_memory_ms: int = Field(
        default=600_000,
        ge=1,
        description="how long a decided request id is remembered, so that a late or re-sent "
        "event is dead-lettered (after-final) instead of opening the request again; keep it "
        "well above ttl_ms",
    )
    decided_max_entries: int = Field(
        default=3_000_000,
        ge=1,
        le=100_000_000,
        description="decided request keys remembered at most (12 bytes each: 36 MB at the "
        "default, 10 minutes of decided_memory_ms at 5,000 answers/s); past it the oldest "
        "are forgotten, and a late event of one of them opens its request again",
    )
    reroute: bool = Field(
        default=True,
        description="send an input record that is not on the partition murmur2 puts its "
        "request id on (a producer with another partitioner: librdkafka's default, "
        "round-robin, FNV-1a), when another replica reads that partition, to it, with its "
        "bytes, key and headers and an x-guardrail-rerouted-from header, so that a request's "
        "halves meet on one replica (a partition this replica reads too: joined here); needs "
        "WRITE on the input topics (refused: the record is dead-lettered reroute-refused). "
        "false: such a record is joined where it was read, and with several replicas its "
        "request may be decided incomplete by two of them",
    )
    max_records_behind: int = Field(
        default=500_000,
        ge=1_000,
        description="input records that may be read after the oldest open request's first "
        "event before it is evicted (block / incomplete), whatever the join clock says. An "
        "open request holds its partitions' commit back, and every record read after it is "
        "remembered (offset and key, ~155 bytes each) until that commit moves: while the "
        "sidecar is behind the join clock stands still, so without this bound a single "
        "half-request held them for as long as a catch-up lasted",
    )


class LimitSettings(_Section):
    """Input limits: anything beyond them is dead-lettered, not processed."""

    max_message_bytes: int = Field(default=1_048_576, ge=1024)
    max_json_depth: int = Field(default=32, ge=4, le=512)
    max_hits: int = Field(default=256, ge=1)
    max_answer_chars: int = Field(default=200_000, ge=1)
    max_request_bytes: int = Field(
        default=4_194_304,
        ge=1024,
        description="bytes one request's events may hold (its retrieval, deltas and final, "
        "raw or as their texts take in memory when that is more, the final's decoded "
        "attention summary, the trace headers kept, 160 bytes per event); the event that "
        "would cross it is dead-lettered (request-too-large). With claims on, the evidence "
        "index is bounded by the same number on its own: a request whose index would "
        "cross it is decided with claims unavailable",
    )


class HttpSettings(_Section):
    """Liveness and readiness endpoints."""

    enabled: bool = True
    host: str = Field(
        default="0.0.0.0",  # noqa: S104 - a pod's probes come from the kubelet, not loopback
        min_length=1,
        description="address /livez and /readyz bind: 0.0.0.0 (IPv4), :: for an IPv6-only "
        "cluster (the kubelet probes the pod's IPv6 address)",
    )
    port: int = Field(default=8080, ge=0, le=65535)
    ready_requires_assignment: bool = Field(
        default=True,
        description="readiness also needs this member to have joined the consumer group and "
        "received its assignment, which may be empty: with more members than partitions (a "
        "rolling update's surge pod, an LLM pod with the sidecar injected) an idle member is "
        "ready; turn off to be ready before the first join",
    )
    processing_stall_s: float = Field(
        default=60.0,
        allow_inf_nan=False,
        gt=0.0,
        le=3600.0,
        description="seconds a call may hold the processor thread (a batch, a tick) without "
        "progress (a record admitted, a request scored) before the sidecar is not ready and "
        "says so in the log: a hung call decides nothing while the consumer and the probes "
        "look fine; a long batch with claims keeps progressing",
    )
    processing_fatal_s: float = Field(
        default=300.0,
        allow_inf_nan=False,
        gt=0.0,
        le=86_400.0,
        description="... and before it is not live either, so the pod restarts (its inputs "
        "stay uncommitted and are read again); at least processing_stall_s",
    )

    @model_validator(mode="after")
    def _fatal_after_stall(self) -> Self:
        if self.processing_fatal_s < self.processing_stall_s:
            raise ValueError(
                f"GUARDRAIL_HTTP__PROCESSING_FATAL_S ({self.processing_fatal_s:g}) must be at "
                f"least GUARDRAIL_HTTP__PROCESSING_STALL_S ({self.processing_stall_s:g})"
            )
        return self


class ModelSettings(_Section):
    """Where model and calibration artifacts are mounted (read-only)."""

    dir: str = "models"


class TenancySettings(_Section):
    """Where a request's tenant comes from; it selects calibration and policy.

    ``event``: the retrieval event's ``tenant`` field (trust every producer);
    ``header``: a header set by a trusted producer or proxy (``header``), and the
    event's field must agree; ``fixed``: this sidecar serves one tenant (e.g. per-
    tenant topics), and events naming another are dead-lettered.
    """

    source: Literal["event", "header", "fixed"] = "event"
    header: NonBlank = "x-tenant"
    tenant: LabelName | None = None  # as an event's tenant

    @model_validator(mode="after")
    def _fixed_needs_tenant(self) -> Self:
        if self.source == "fixed" and not self.tenant:
            raise ValueError("source=fixed needs GUARDRAIL_TENANCY__TENANT")
        return self


class SignalSettings(_Section):
    """Which signals run, and their artifacts (paths relative to ``models.dir``)."""

    retrieval: bool = True
    calibration: str = "conformal/nq-open-minilm.json"
    unknown_collection: Literal["fallback-global", "reject"] = "fallback-global"
    monitor_window: int = Field(default=500, ge=10)
    monitor_confidence: float = Field(default=0.99, gt=0.5, lt=1.0)
    warm_start: int = Field(
        default=20_000,
        ge=0,
        le=200_000,  # ~1 KB each while read: 200 MB at most
        description="records of the verdicts topic's tail read back at start (over its "
        "partitions), and on a partition newly assigned (its requests): the exchangeability "
        "monitor's windows are refilled, so that a restart does not clear an alarm, and the "
        "coverage monitor keeps the requests for their labels; needs Read on the verdicts "
        "topic (0: both start empty)",
    )
    lookback: bool = True
    lookback_model: str = "lookback/smollm2-135m-nq-cw"
    # a summary the lookback model cannot score (another generator or shape, e.g. while a
    # new model or generator rolls out): unavailable scores the answer without the signal
    # (warned once a minute, counted); dead-letter sends the final event to the DLQ, and
    # the request ends incomplete at the join TTL
    lookback_mismatch: Literal["dead-letter", "unavailable"] = "unavailable"
    # off by default: the shipped verifier costs ~23 ms per (claim, window) pair on one core,
    # against issue #15's 5 ms (models/verifier/MODEL_CARD.md); enable it to stream claims
    claims: bool = False
    verifier: str = "verifier"
    verifier_threads: int = Field(
        default=1, ge=1, le=64, description="onnxruntime intra-op threads for the claim verifier"
    )
    claim_pairs_per_answer: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="verifier work one answer may use, in (claim, evidence window) pairs "
        "(~25 ms each on one core): claims after it is spent are counted unchecked "
        "(reason claims-over-limit). Work, not time, so a replay repeats its verdicts",
    )
    claim_seconds_per_answer: float | None = Field(
        default=None,
        gt=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="also stop verifying an answer's claims after this much verifier time "
        "(unset: no time limit). Bounds latency on a slow or busy CPU, but the same answer "
        "is then checked further or less far with the load, and a replay may differ",
    )
    verifier_target_precision: float | None = Field(
        default=None,
        ge=0.5,
        lt=1.0,
        description="serve the verifier's uncertain band fitted for this precision of "
        "'supported' and 'unsupported' on its validation pairs (one its verifier.json lists "
        "under bands; a wider band asks the LLM judge about more claims). Unset: its own band",
    )
    confidence: bool = True
    confidence_model: str = "confidence/smollm2-135m-nq"
    retrieve_again_tau: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="advise retrieve_again when the best chunk forecast is below this "
        "(unset: the threshold chosen when the chunk forecaster was fitted)",
    )


class CoverageSettings(_Section):
    """The fleet-level coverage bound per calibration key (docs/methods.md §Coverage bound)."""

    window: int = Field(
        default=10_000,
        ge=10,
        le=1_000_000,
        description="recent requests and labels of a key the bound covers, over the input "
        "partitions (each keeps ceil(window / partitions) of each: the fleet's windows sum to "
        "about this many), and the labels a certificate's re-test holds",
    )
    max_keys: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="calibration keys (a global calibration's tenants each count) whose "
        "windows are kept; a new key past it drops the least recently fed one's (counted "
        "in guardrail.coverage.evicted_keys). A full key holds ~0.35 KB per window request "
        "(~3.5 MB at window 10,000): the bound on this monitor's memory is about "
        "max_keys x window x 0.35 KB",
    )
    report_interval_s: float = Field(
        default=60.0,
        ge=1.0,
        le=86_400.0,
        allow_inf_nan=False,
        description="how often a coverage.report event is published",
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="Wilson level")
    probe_file: str | None = Field(
        default=None,
        description="leakage probe result ('guardrail probe leakage'); sets delta. Unset: "
        "delta is estimated from feedback on uncovered requests",
    )


class PolicySettings(_Section):
    """The decision policy file (YAML); unset means the built-in default."""

    file: str | None = None


class QdrantSettings(_Section):
    """Qdrant: embedded local mode unless a server URL is configured."""

    url: str | None = None
    api_key: SecretStr | None = None
    path: str | None = Field(default=None, description="local mode storage (unset: in memory)")


class JudgeSettings(_Section):
    """An optional LLM judge (OpenAI-compatible chat completions) for uncertain claims.

    Off unless ``endpoint`` is set; needs the claim check on
    (``GUARDRAIL_SIGNALS__CLAIMS=true``). The stream never waits for it beyond
    ``timeout_s`` per call (sidecar.claims.judge).
    """

    endpoint: str | None = Field(default=None, description="base URL, e.g. http://llm:8000/v1")
    model: str | None = None
    api_key: SecretStr | None = None
    api_key_file: NonBlank | None = Field(
        default=None,
        description="a file holding the API key instead of api_key (a mounted Secret): read "
        "again every 30 s, and a changed key is sent by the next calls without a restart",
    )
    prompt: Literal["three-way", "four-way"] = Field(
        default="four-way",
        description="four-way: verified / partially verified / unverified / irrelevant; "
        "three-way: supported / unsupported / uncertain",
    )
    timeout_s: float = Field(default=2.0, gt=0.0, le=60.0)
    max_calls_per_answer: int = Field(default=3, ge=0, le=100)
    failure_threshold: int = Field(default=3, ge=1)
    cooldown_s: float = Field(default=30.0, ge=0.0, le=86_400.0, allow_inf_nan=False)
    max_workers: int = Field(default=4, ge=1, le=64)

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError(_both_set("GUARDRAIL_JUDGE__API_KEY"))
        if self.endpoint is None:
            return self
        shown = repr(redact_url(self.endpoint))
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(
                f"judge endpoint must be an http(s) URL, got {shown} (GUARDRAIL_JUDGE__ENDPOINT)"
            )
        problem = _endpoint_problem(self.endpoint)
        if problem is not None:
            raise ValueError(
                f"judge endpoint {shown} {problem} (GUARDRAIL_JUDGE__ENDPOINT: a base "
                "URL such as https://llm:8000/v1, to which /chat/completions is added)"
            )
        if not self.model:
            raise ValueError(
                "a judge endpoint needs a model name (GUARDRAIL_JUDGE__MODEL), "
                "e.g. the served model's id"
            )
        return self


def _both_set(variable: str) -> str:
    return (
        f"{variable} and {variable}_FILE are both set: give the secret one way, the value "
        f"itself or a file holding it ({variable}_FILE, read again while running), and "
        "unset the other"
    )


def _endpoint_problem(url: str) -> str | None:
    """What makes ``url`` unusable as the judge's base URL (every call would fail)."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:  # first: a password with
        # a space in it was said to be the problem, masked (no space to be seen)
        return "holds user info: give the key as GUARDRAIL_JUDGE__API_KEY"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "holds a space or a control character"
    if not parts.hostname:
        return "names no host"
    try:
        parts.port  # noqa: B018 - raises for a port that is no number in 0-65535
    except ValueError:
        return "has a port that is no number in 0-65535"
    if parts.query or parts.fragment:
        return "has a query or a fragment"
    return None


class MetricsSettings(_Section):
    """Metrics export. OTLP follows the standard OTEL_* variables; Prometheus is opt-in."""

    prometheus_port: int | None = Field(default=None, ge=1, le=65535)
    prometheus_host: str = Field(
        default="0.0.0.0",  # noqa: S104 - scraped from outside the pod
        min_length=1,
        description="address the metrics endpoint binds: 0.0.0.0 (IPv4), :: (IPv6 and, on "
        "dual-stack nodes, IPv4 too)",
    )
    max_key_series: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="calibration keys exported as their own series by the per-key gauges "
        "(guardrail.retrieval.*, guardrail.coverage.*): a key's tenant is producer text, so "
        "thousands of them would flood the scrape; keys past it are counted in "
        "guardrail.retrieval.monitor_keys{exported=false}, broken ones exported first",
    )


class TracingSettings(_Section):
    """Spans. The exporter, sampler and batching follow the standard OTEL_* variables."""

    stage_spans: bool = Field(
        default=True,
        description="one child span per stage of a traced verdict (join, certify, score, "
        "policy, ...); false: the stages' durations as attributes of the request span "
        "(guardrail.stage.<stage>.duration_ms), about half the cost of a recorded verdict",
    )


class Settings(BaseSettings):
    """Everything the sidecar reads from its environment."""

    model_config = SettingsConfigDict(
        env_prefix="GUARDRAIL_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    join: JoinSettings = JoinSettings()
    limits: LimitSettings = LimitSettings()
    http: HttpSettings = HttpSettings()
    metrics: MetricsSettings = MetricsSettings()
    tracing: TracingSettings = TracingSettings()
    models: ModelSettings = ModelSettings()
    signals: SignalSettings = SignalSettings()
    tenancy: TenancySettings = TenancySettings()
    policy: PolicySettings = PolicySettings()
    qdrant: QdrantSettings = QdrantSettings()
    coverage: CoverageSettings = CoverageSettings()
    judge: JudgeSettings = JudgeSettings()
    # 0 meant "no limit" (runtime.py: `... / 1000.0 or None`), the opposite of what it reads as
    shutdown_grace_ms: int = Field(default=10_000, ge=1)
    gc_freeze: bool = Field(
        default=True,
        description="move everything loaded at start (models, calibrations, imports) out of "
        "the cyclic garbage collector's reach: full collections then scan only request-time "
        "objects (about 40 ms -> under 1 ms per pause on this machine)",
    )
    gc_young_threshold: int = Field(
        default=50_000,
        ge=700,
        le=1_000_000,  # past it, cyclic garbage of ~1M objects (100s of MB) piles up between walks
        description="tracked objects allocated (net of those freed) before the cyclic "
        "garbage collector walks its youngest generation (CPython's default: 700). A consumed "
        "batch's requests hold ~25 tracked objects a record until their verdicts are out: at "
        "700, every batch set off collections that walked and promoted them all (14 us a "
        "request in batches of 50 requests, 26 us in batches of 200, of ~450 us a request); "
        "above a batch's objects, the young generation is walked only when garbage piles up",
    )
    heap_trim_interval_s: float = Field(
        default=60.0,
        ge=0.0,
        le=86_400.0,
        allow_inf_nan=False,
        description="how often the C allocator's free heap pages are handed back to the "
        "kernel (glibc malloc_trim; 0: never). Requests and the windows that outlive them "
        "fragment the heap: in-process, 400,000 requests took the RSS from 118 to 139 MB "
        "untrimmed and held 121-127 MB trimmed; each trim takes ~1 ms (sidecar/heaptrim.py)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _inflated_batch_holds_a_record(self) -> Self:
        if self.kafka.max_batch_inflated_bytes < self.limits.max_message_bytes:
            raise ValueError(
                "GUARDRAIL_KAFKA__MAX_BATCH_INFLATED_BYTES "
                f"({self.kafka.max_batch_inflated_bytes}) is below "
                f"GUARDRAIL_LIMITS__MAX_MESSAGE_BYTES ({self.limits.max_message_bytes}): a "
                "compressed batch holding one record the sidecar accepts could not be read; "
                "allowed: at least the message limit"
            )
        return self

    @model_validator(mode="after")
    def _judge_waits_within_the_stall_limit(self) -> Self:
        # an answer's claims wait for their judge calls on the processor thread, up to
        # timeout_s: a hung judge at timeout_s 60 held it for the whole (default) stall limit
        # and made the sidecar, and the pod it shares, not ready
        stall = self.http.processing_stall_s
        if self.judge.endpoint is not None and self.judge.timeout_s > stall / 2:
            raise ValueError(
                f"GUARDRAIL_JUDGE__TIMEOUT_S ({self.judge.timeout_s:g}) is over half of "
                f"GUARDRAIL_HTTP__PROCESSING_STALL_S ({stall:g}): an answer waits up to the "
                "judge's timeout on the processor thread, so a hung judge would make the "
                f"sidecar not ready; allowed: at most {stall / 2:g} (or raise the stall limit)"
            )
        return self

    @model_validator(mode="after")
    def _ports_distinct(self) -> Self:
        port = self.metrics.prometheus_port
        if port is not None and self.http.enabled and port == self.http.port:
            raise ValueError(
                f"GUARDRAIL_METRICS__PROMETHEUS_PORT and GUARDRAIL_HTTP__PORT are both {port}; "
                "the metrics and the health endpoints need two different ports"
            )
        return self

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Read the environment (plus explicit overrides) or fail with what is wrong."""
        check_environment(
            os.environ,
            list(cls.model_fields),
            scalars=[
                name
                for name, field in cls.model_fields.items()
                if not (
                    isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
                )
            ],
        )
        try:
            return cls(**overrides)
        except ValidationError as exc:  # its input values can be URLs with credentials
            raise ConfigError(redact_text(explain(exc, cls))) from None
        except SettingsError as exc:  # GUARDRAIL_KAFKA= (a section given a non-JSON value)
            raise ConfigError(
                f"{exc}: a section variable (e.g. GUARDRAIL_KAFKA) takes a JSON object; "
                "set its fields with __ instead (GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS=...)"
            ) from None

    def redacted(self) -> dict[str, Any]:
        """A JSON-ready view with every secret replaced by ``**********``: the
        ``SecretStr`` fields and the password of any URL (``https://user:pw@host``)."""
        dumped: dict[str, Any] = _redact_urls(self.model_dump(mode="json"))
        return dumped


def _redact_urls(value: Any) -> Any:
    """``value`` with every URL's password and credential query values hidden."""
    if isinstance(value, dict):
        return {k: _redact_urls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_urls(v) for v in value]
    if isinstance(value, str):
        return redact_url(value)
    return value
