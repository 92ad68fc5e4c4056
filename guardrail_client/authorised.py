"""What this client's principal may do on topics, as the cluster's ACLs say (Metadata v8).

Metadata v8 (Kafka 2.3 and later) answers, for each named topic, the operations the
asking principal holds on it; aiokafka's own metadata requests stop at v5. Kafka's
answer for a topic the principal holds no ACL on is ``TOPIC_AUTHORIZATION_FAILED``,
the same as for a topic that does not exist (a client may not learn that it does); a
broker without an authoriser grants everything. The publisher and the verdict client
check their topics at start with it, and the sidecar its own (``sidecar.kafka.permissions``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from aiokafka.errors import IncompatibleBrokerVersion
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

__all__ = ["DESCRIBE", "OPERATION_NAMES", "READ", "WRITE", "grant", "said", "topic_operations"]

READ: Final = 3  # Kafka's AclOperation codes: bit n of an authorised-operations field
WRITE: Final = 4
DESCRIBE: Final = 8  # implied by any other operation on the resource
OPERATION_NAMES: Final = {READ: "Read", WRITE: "Write", DESCRIBE: "Describe"}
OMITTED: Final = -(2**31)  # Integer.MIN_VALUE: the broker did not say
_TOPIC_AUTHORIZATION_FAILED: Final = 29


class _MetadataResponseV8(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            Array(
                ("node_id", Int32),
                ("host", String("utf-8")),
                ("port", Int32),
                ("rack", String("utf-8")),
            ),
        ),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("name", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", Array(Int32)),
                        ("isr_nodes", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
                ("topic_authorized_operations", Int32),
            ),
        ),
        ("cluster_authorized_operations", Int32),
    )


class _MetadataV8(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = _MetadataResponseV8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),  # one-field structs: names on the wire
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class _AuthorisedMetadata(Request[_MetadataV8]):  # type: ignore[misc]
    """Metadata of named topics with the principal's authorised operations on each."""

    API_KEY: ClassVar[int] = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[_MetadataV8]) -> _MetadataV8:
        return request_struct_class(self._topics, False, False, True)


def grant(bootstrap_servers: str, principal: str, operation: str, resource: str) -> str:
    """The ``kafka-acls.sh`` line that grants ``principal`` ``operation`` (``Read``,
    ``Create``) on ``resource`` (``--topic T``, ``--group G``, ``--cluster``), against the
    first of ``bootstrap_servers``."""
    server = bootstrap_servers.split(",", maxsplit=1)[0]
    return (  # a certificate's principal holds spaces and backslashes: quoted for the shell
        f"kafka-acls.sh --bootstrap-server {server} --add --allow-principal "
        f"{shlex.quote(principal)} --operation {operation} {resource}"
    )


def said(operations: int | None) -> int | None:
    """A described resource's authorised operations as the broker said them; ``None`` when
    it did not (omitted), or said something a broker that authorises cannot mean: a field
    without Describe for a resource it just described (every operation implies Describe).
    A service that only speaks Kafka's protocol is then not checked, rather than refused
    for ACLs it may well hold."""
    if operations is None or operations == OMITTED or not operations >> DESCRIBE & 1:
        return None
    return operations


async def topic_operations(client: Any, names: Sequence[str]) -> dict[str, int | None]:
    """Each named topic's authorised-operations bit field for ``client`` (an aiokafka
    ``AIOKafkaClient``, started): 0 where the broker refuses to describe it (no ACL, or no
    such topic: the same answer to it), ``None`` where it does not say (a topic it does
    not know, a broker before 2.3, an answer no authoriser gives)."""
    out: dict[str, int | None] = dict.fromkeys(names)
    try:
        response: Any = await client.send(
            client.get_random_node(), _AuthorisedMetadata(list(names))
        )
    except (NotImplementedError, IncompatibleBrokerVersion):  # a broker before 2.3
        return out
    for row in response.to_object()["topics"]:
        if row["error_code"] == _TOPIC_AUTHORIZATION_FAILED:
            out[row["name"]] = 0
        elif row["error_code"] == 0:
            out[row["name"]] = said(row["topic_authorized_operations"])
    return out
