"""The Kafka ACLs the sidecar needs, checked at start against what its principal holds.

On a cluster that authorises (Kafka ACLs), a sidecar missing one permission started, said
it was ready, and then:

* without Read on an input topic or its group, it consumed nothing, forever: FastStream
  logs ``Kafka error occurred`` every 5 s and goes on, so the pod stayed ready and live;
* without Write on the verdict or dead-letter topic, it turned not live at its first
  publish, and the pod restarted into the same end, each time after taking traffic.

:func:`check_permissions` asks the broker, before the first record is read, which
operations the principal holds on each topic it will use (Metadata v8's authorised
operations) and on its group (DescribeGroups v3), and ends the start (exit 2) naming every
missing ACL with the ``kafka-acls`` lines that grant it. Write on the input topics (the
sidecar's reroute of a record off its request's partition) is the exception: without
it the sidecar serves, and such records are dead-lettered ``reroute-refused``, so it is
a warning. A broker without an authoriser grants every operation; one too old to say
(before Kafka 2.3), or whose answer no authoriser gives (``guardrail_client.authorised.said``),
is not checked: the refusal, if one comes, then ends the loop as it happens.

:func:`authorisation_error` tells a consume error that no retry can help (an ACL removed
while the sidecar runs) from a passing one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypedDict

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from guardrail_client import authorised
from guardrail_client.authorised import DESCRIBE, OPERATION_NAMES, READ, WRITE
from sidecar.config import Settings
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.security import sasl_username

if TYPE_CHECKING:
    from sidecar.pipeline.processor import Processor

log = logging.getLogger(__name__)

__all__ = [
    "AUTHORISATION_ERRORS",
    "DESCRIBE",
    "OPERATION_NAMES",
    "READ",
    "WRITE",
    "Need",
    "Uses",
    "authorisation_error",
    "certificate_principal",
    "check_permissions",
    "hidden_topics_refusal",
    "lacking_needs",
    "missing",
    "needs",
    "principal_hint",
    "read_refused",
    "refusal",
    "topic_operations",
    "uses",
]

_GROUP_AUTHORIZATION_FAILED: Final = 30

AUTHORISATION_ERRORS: Final = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)


@dataclass(frozen=True, slots=True)
class Need:
    """One ACL the sidecar uses: ``operation`` (``READ`` / ``WRITE`` / ``DESCRIBE``) on a topic
    or group."""

    resource: str  # "topic" | "group"
    name: str
    operation: int
    why: str
    essential: bool = True  # False: the sidecar serves without it (a warning)
    without: str = ""  # not essential: what it does without it, and how to ask for less

    def describe(self) -> str:
        return f"{OPERATION_NAMES[self.operation]} on {self.resource} {self.name} ({self.why})"

    def same_acl(self, other: Need) -> bool:
        """The same operation on the same resource (whatever it is needed for)."""
        return (self.resource, self.name, self.operation) == (
            other.resource,
            other.name,
            other.operation,
        )

    def grant(self, principal: str, bootstrap_servers: str) -> str:
        """The kafka-acls command line that grants it (against the first server)."""
        where = f"--{self.resource} {self.name}"  # --topic T, --group G
        return authorised.grant(
            bootstrap_servers, principal, OPERATION_NAMES[self.operation], where
        )


class Uses(TypedDict):
    """What a processor does on the cluster, as :func:`needs` and :func:`check_permissions`
    take it."""

    claims: bool
    reports: bool
    certificates: bool
    warm_start: bool


def uses(processor: Processor) -> Uses:
    """What ``processor`` does on the cluster: the claim check publishes per-claim verdicts,
    the coverage monitor reports, the policy certifies allows, a monitor reads the verdicts
    back (the start's ACL check and ``guardrail topics acls`` ask the same)."""
    signals = processor.signals
    return Uses(
        claims=signals.claims is not None,
        reports=signals.coverage is not None,
        certificates=processor.certificates is not None,
        warm_start=signals.warm_starts,
    )


def needs(
    settings: Settings,
    *,
    claims: bool,
    reports: bool,
    certificates: bool,
    warm_start: bool = False,
) -> list[Need]:
    """What the sidecar does on the cluster with ``settings``: ``claims`` (the claim check
    publishes per-claim verdicts), ``reports`` (the coverage monitor publishes reports),
    ``certificates`` (the policy certifies allows: the fleet's withdrawals are read and
    written), ``warm_start`` (the exchangeability or the coverage monitor runs: the
    verdicts' tail is read back at start, ``GUARDRAIL_SIGNALS__WARM_START``)."""
    t = settings.topics
    out = [Need("group", settings.kafka.group_id, READ, "the consumer group")]
    inputs = {t.retrieval: "input", t.generation: "input", t.feedback: "input, labels"}
    out += [Need("topic", name, READ, why) for name, why in inputs.items()]
    out += [Need("topic", t.verdicts, WRITE, "verdicts"), Need("topic", t.dlq, WRITE, "DLQ")]
    if claims:
        out.append(Need("topic", t.claims, WRITE, "claim verdicts"))
    if reports:
        out.append(Need("topic", t.reports, WRITE, "coverage reports"))
    if certificates:
        out.append(Need("topic", t.certificates, READ, "the fleet's withdrawals"))
        out.append(Need("topic", t.certificates, WRITE, "withdrawals found here"))
    if settings.join.reroute:
        without = (
            "a record read off its request's partition while another replica reads that "
            "partition is dead-lettered reroute-refused instead of sent on (or set "
            "GUARDRAIL_JOIN__REROUTE=false)"
        )
        out += [
            Need("topic", name, WRITE, "reroute", essential=False, without=without)
            for name in inputs
        ]
    if warm_start and settings.signals.warm_start > 0:
        without = (
            "the exchangeability monitor's windows start empty, so a restart clears an "
            "alarm, and labels of requests decided before it go unmatched (or set "
            "GUARDRAIL_SIGNALS__WARM_START=0)"
        )
        why = "the warm start"
        out.append(Need("topic", t.verdicts, READ, why, essential=False, without=without))
    used = {n.name for n in out if n.resource == "topic"}
    out += [  # the start checks that every topic of the layout exists
        Need("topic", name, DESCRIBE, "checked to exist at start")
        for name in (t.claims, t.reports, t.certificates)
        if name not in used
    ]
    return out


def missing(
    wanted: Iterable[Need],
    topics: Mapping[str, int | None],
    groups: Mapping[str, int | None],
) -> list[Need]:
    """The needs not granted. ``topics`` / ``groups``: each resource's authorised-operations
    bit field; 0 where the principal may not even describe it; ``None`` where the broker
    did not say (not checked)."""
    out = []
    for need in wanted:
        field = (topics if need.resource == "topic" else groups).get(need.name)
        if field is not None and not field >> need.operation & 1:
            out.append(need)
    return out


async def topic_operations(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int | None]:
    """Each named topic's authorised-operations bit field for this client
    (:func:`guardrail_client.authorised.topic_operations` over the admin's connection)."""
    return await authorised.topic_operations(admin._client, names)


async def _group_operations(admin: AIOKafkaAdminClient, group: str) -> dict[str, int | None]:
    try:
        responses: list[Any] = await admin.describe_consumer_groups(
            [group], include_authorized_operations=True
        )
    except GroupAuthorizationFailedError:  # finding its coordinator was refused already
        return {group: 0}
    except (NotImplementedError, KafkaError):  # an old broker, a coordinator not ready yet
        return {group: None}
    for response in responses:  # whichever version aiokafka chose: by field name
        for row in response.to_object()["groups"]:
            error_code, operations = row["error_code"], row.get("authorized_operations")
            if error_code == _GROUP_AUTHORIZATION_FAILED:
                return {group: 0}
            if error_code == 0:
                return {group: authorised.said(operations)}
    return {group: None}  # a group not known yet (Kafka 4's coordinator): the join says


def principal_hint(settings: Settings) -> str:
    """The principal the cluster most likely knows this client by: its SASL user, or with
    mutual TLS its certificate's subject (:func:`certificate_principal`)."""
    kafka = settings.kafka
    if kafka.security_protocol.startswith("SASL"):
        try:
            return f"User:{sasl_username(kafka)}"  # the file's user, when it is given as one
        except ConfigError:
            pass
    elif kafka.security_protocol == "SSL" and kafka.ssl_certfile:
        found = certificate_principal(kafka.ssl_certfile)
        if found is not None:
            return found
    return "User:PRINCIPAL"


# the attribute names Java's X500Principal writes by keyword (RFC 2253); others as OIDs
_DN_KEYWORDS: Final = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_DN_ESCAPED: Final = frozenset(',+"\\<>;=#')


def certificate_principal(certfile: str) -> str | None:
    """The principal a Kafka cluster gives the client certificate in ``certfile`` by
    default (``ssl.principal.mapping.rules=DEFAULT``): ``User:`` and the subject as Java's
    ``X500Principal.getName()`` writes it (RFC 2253: the last RDN first, ``,`` between
    RDNs, ``+`` inside one, ``,+"\\<>;=#`` escaped with a backslash, and a leading or
    trailing space). ``None`` when the file does not read as a certificate or the
    subject holds an attribute Java writes as an OID with a hex value (emailAddress):
    the caller then names no principal. A cluster with its own mapping rules knows the
    client by what they make of this."""
    try:
        decoded = ssl._ssl._test_decode_cert(certfile)  # type: ignore[attr-defined]
    except (OSError, ssl.SSLError, ValueError):
        return None
    subject = decoded.get("subject") if isinstance(decoded, dict) else None
    if not subject:
        return None
    rdns = []
    for rdn in reversed(subject):
        parts = []
        for name, value in rdn:
            keyword = _DN_KEYWORDS.get(name)
            if keyword is None:
                return None
            parts.append(f"{keyword}={_dn_value(value)}")
        rdns.append("+".join(parts))
    return "User:" + ",".join(rdns)


def _dn_value(value: str) -> str:
    last = len(value) - 1
    return "".join(
        f"\\{c}" if c in _DN_ESCAPED or (c == " " and i in (0, last)) else c
        for i, c in enumerate(value)
    )


async def lacking_needs(
    settings: Settings, admin: AIOKafkaAdminClient, wanted: list[Need]
) -> list[Need]:
    """Those of ``wanted`` the cluster does not grant this client (``BrokerError`` when it
    does not answer within the request timeout)."""
    timeout_s = settings.kafka.request_timeout_ms / 1000.0
    topic_names = list(dict.fromkeys(n.name for n in wanted if n.resource == "topic"))
    groups_named = list(dict.fromkeys(n.name for n in wanted if n.resource == "group"))
    groups: dict[str, int | None] = {}
    try:
        async with asyncio.timeout(timeout_s):
            topics = await topic_operations(admin, topic_names)
            for group in groups_named:
                groups.update(await _group_operations(admin, group))
    except (KafkaError, TimeoutError) as exc:
        raise BrokerError(
            f"could not read this client's permissions from {settings.kafka.bootstrap_servers}: "
            f"{(str(exc).splitlines() or [''])[0] or type(exc).__name__}"
        ) from None
    return missing(wanted, topics, groups)


def refusal(settings: Settings, lacking: list[Need]) -> ConfigError:
    """The start's error for ``lacking`` (essential needs the cluster refuses)."""
    principal = principal_hint(settings)
    servers = settings.kafka.bootstrap_servers
    return ConfigError(
        f"the Kafka cluster at {settings.kafka.bootstrap_servers} does not allow this "
        f"sidecar's principal ({principal}) {len(lacking)} operation(s) it needs: "
        + "; ".join(n.describe() for n in lacking)
        + ". Grant them (Kafka ACLs), e.g. "
        + " && ".join(n.grant(principal, servers) for n in lacking)
        + "; or point GUARDRAIL_TOPICS__* / GUARDRAIL_KAFKA__GROUP_ID at the topics "
        "and group it may use"
    )


def hidden_topics_refusal(settings: Settings, hidden: list[str]) -> ConfigError:
    """The start's error for topics the principal may not even describe (no ACL on them:
    the cluster's topic list leaves them out, as it does a topic that does not exist)."""
    wanted = needs(settings, claims=settings.signals.claims, reports=True, certificates=True)
    lacking = [
        Need(n.resource, n.name, n.operation, f"{n.why}; not even Describe now")
        for n in wanted
        if n.essential and n.name in hidden
    ]
    return ConfigError(
        f"{refusal(settings, lacking)} (and create the topics if they do not exist: "
        "`guardrail topics create`)"
    )


async def check_permissions(
    settings: Settings,
    admin: AIOKafkaAdminClient,
    *,
    claims: bool,
    reports: bool,
    certificates: bool,
    warm_start: bool = False,
) -> list[Need]:
    """Raise :class:`ConfigError` naming every essential ACL the principal lacks; log a
    warning for the others, one per consequence. Returns what is missing (the
    non-essential ones)."""
    wanted = needs(
        settings, claims=claims, reports=reports, certificates=certificates, warm_start=warm_start
    )
    lacking = await lacking_needs(settings, admin, wanted)
    principal = principal_hint(settings)
    servers = settings.kafka.bootstrap_servers
    fatal = [n for n in lacking if n.essential]
    if fatal:
        raise refusal(settings, fatal)
    optional = [n for n in lacking if not n.essential]
    by_consequence: dict[str, list[Need]] = {}
    for need in optional:
        by_consequence.setdefault(need.without, []).append(need)
    for without, group in by_consequence.items():
        log.warning(
            "the Kafka cluster does not allow this sidecar's principal (%s) %s: %s. Grant it (%s)",
            principal,
            "; ".join(f"{OPERATION_NAMES[n.operation]} on topic {n.name}" for n in group),
            without,
            " && ".join(n.grant(principal, servers) for n in group),
        )
    return optional


def read_refused(settings: Settings, exc: BaseException) -> str:
    """For a reader's error message: the Read grant a topic refused to this client needs
    (``exc`` a ``TopicAuthorizationFailedError`` naming it); "" for any other error."""
    if not isinstance(exc, TopicAuthorizationFailedError):
        return ""
    topics = [str(a) for a in exc.args if isinstance(a, str) and a]
    if not topics:
        return ""
    servers = settings.kafka.bootstrap_servers
    grants = " && ".join(
        Need("topic", t, READ, "").grant(principal_hint(settings), servers) for t in topics
    )
    return f"; the cluster's ACLs do not let this client's principal read it: {grants}"


def authorisation_error(exc: BaseException) -> str | None:
    """What a consume error says when no retry can help: the cluster refused this client
    (an ACL removed while it runs); ``None`` for any other error."""
    if not isinstance(exc, AUTHORISATION_ERRORS):
        return None
    what = ", ".join(str(a) for a in exc.args if a) or "no detail"
    return (
        f"the Kafka cluster refuses this consumer ({type(exc).__name__}: {what}): an ACL "
        "the sidecar needs was removed (a restart names every one missing)"
    )
