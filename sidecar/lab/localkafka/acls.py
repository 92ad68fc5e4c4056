"""Kafka ACLs on the lab broker, as an operator grants and revokes them with kafka-acls.

The broker's jars carry no ``AclCommand`` (it moved to the tools jar in 4.0), and aiokafka's
admin client has no ACL calls and knows only CreateAcls / DeleteAcls v0-v1, which Kafka 4
no longer accepts (KIP-896). So this module speaks v2, the first flexible version (every
release since 2.6), through aiokafka's protocol types. The connection must be a super user's
(the lab broker's PLAINTEXT listener, ``super.users=User:ANONYMOUS``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from sidecar.exceptions import LocalKafkaError

__all__ = ["AUTHORIZER_PROPERTIES", "Acl", "Operation", "Resource", "create_acls", "delete_acls"]

AUTHORIZER_PROPERTIES = """\
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS
allow.everyone.if.no.acl.found=false
"""
"""``LocalKafka.extra_properties`` for a broker that authorises: the PLAINTEXT and controller
listeners (inter-broker, the tests' own clients) are super users, a SASL user is granted
only what its ACLs say."""


class Resource(IntEnum):  # Kafka's ResourceType codes
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class Operation(IntEnum):  # Kafka's AclOperation codes
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10
    IDEMPOTENT_WRITE = 12


_LITERAL, _ALLOW = 3, 3  # PatternType.LITERAL, AclPermissionType.ALLOW
_CLUSTER_NAME = "kafka-cluster"


@dataclass(frozen=True)
class Acl:
    """ALLOW ``operation`` on the resource named ``name`` (literal) to ``principal``."""

    principal: str  # "User:guardrail"
    resource: Resource
    name: str
    operation: Operation

    def __post_init__(self) -> None:
        if self.resource is Resource.CLUSTER and self.name != _CLUSTER_NAME:
            raise LocalKafkaError(f"the cluster resource is named {_CLUSTER_NAME!r}")

    def row(self) -> tuple[Any, ...]:
        return (
            int(self.resource),
            self.name,
            _LITERAL,
            self.principal,
            "*",
            int(self.operation),
            _ALLOW,
            {},
        )


class _CreateAclsResponseV2(Response):  # type: ignore[misc]
    API_KEY = 30
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _CreateAclsV2(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION: ClassVar[bool] = True
    API_KEY = 30
    API_VERSION = 2
    RESPONSE_TYPE = _CreateAclsResponseV2
    SCHEMA = Schema(
        (
            "creations",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", CompactString("utf-8")),
                ("resource_pattern_type", Int8),
                ("principal", CompactString("utf-8")),
                ("host", CompactString("utf-8")),
                ("operation", Int8),
                ("permission_type", Int8),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


_MATCHING = CompactArray(
    ("error_code", Int16),
    ("error_message", CompactString("utf-8")),
    ("resource_type", Int8),
    ("resource_name", CompactString("utf-8")),
    ("pattern_type", Int8),
    ("principal", CompactString("utf-8")),
    ("host", CompactString("utf-8")),
    ("operation", Int8),
    ("permission_type", Int8),
    ("tags", TaggedFields),
)


class _DeleteAclsResponseV2(Response):  # type: ignore[misc]
    API_KEY = 31
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "filter_results",
            CompactArray(
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("matching_acls", _MATCHING),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DeleteAclsV2(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION: ClassVar[bool] = True
    API_KEY = 31
    API_VERSION = 2
    RESPONSE_TYPE = _DeleteAclsResponseV2
    SCHEMA = Schema(
        (
            "filters",
            CompactArray(
                ("resource_type_filter", Int8),
                ("resource_name_filter", CompactString("utf-8")),
                ("pattern_type_filter", Int8),
                ("principal_filter", CompactString("utf-8")),
                ("host_filter", CompactString("utf-8")),
                ("operation", Int8),
                ("permission_type", Int8),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _CreateAcls(Request[_CreateAclsV2]):  # type: ignore[misc]
    API_KEY = 30

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def build(self, request_struct_class: type[_CreateAclsV2]) -> _CreateAclsV2:
        return request_struct_class(self._rows, {})


class _DeleteAcls(Request[_DeleteAclsV2]):  # type: ignore[misc]
    API_KEY = 31

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def build(self, request_struct_class: type[_DeleteAclsV2]) -> _DeleteAclsV2:
        return request_struct_class(self._rows, {})


async def _send(bootstrap_servers: str, request: Request[Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        return await admin._send_request(request)
    finally:
        await admin.close()


def _errors(rows: Iterable[Any]) -> list[str]:
    return [f"error {row[0]}: {row[1]}" for row in rows if row[0] != 0]


async def create_acls(bootstrap_servers: str, acls: Iterable[Acl]) -> None:
    """Grant ``acls`` (ALLOW, literal names, any host); raises when the broker refuses one."""
    rows = [acl.row() for acl in acls]
    if not rows:
        return
    response = await _send(bootstrap_servers, _CreateAcls(rows))
    errors = _errors(response.results)
    if errors:
        raise LocalKafkaError(f"CreateAcls refused: {'; '.join(errors)}")


async def delete_acls(bootstrap_servers: str, acls: Iterable[Acl]) -> int:
    """Revoke ``acls`` (each matched exactly); returns how many the broker removed."""
    rows = [acl.row() for acl in acls]
    if not rows:
        return 0
    response = await _send(bootstrap_servers, _DeleteAcls(rows))
    errors = _errors(response.filter_results)
    if errors:
        raise LocalKafkaError(f"DeleteAcls refused: {'; '.join(errors)}")
    return sum(len(result[2]) for result in response.filter_results)
