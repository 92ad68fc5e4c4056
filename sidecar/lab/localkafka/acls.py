"""Kafka ACLs on the lab broker, as an operator grants and revokes them with kafka-acls.

The broker's jars carry no ``AclCommand`` (it moved to the tools jar in 4.0), and aiokafka's
admin client has no ACL calls and knows only CreateAcls / DeleteAcls v0-v1, which Kafka 4
no longer accepts (KIP-896). So this module speaks v2, the first flexible version (every
release since 2.6), through aiokafka's protocol types. The connection must be a super user's
(the lab broker's PLAINTEXT listener, ``super.users=User:ANONYMOUS``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, Final

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

__all__ = [
    "AUTHORIZER_PROPERTIES",
    "Acl",
    "Operation",
    "Pattern",
    "Resource",
    "create_acls",
    "delete_acls",
]

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


class Pattern(IntEnum):  # Kafka's PatternType codes
    LITERAL = 3  # the resource named exactly
    PREFIXED = 4  # every resource whose name starts with it (Strimzi's `patternType: prefix`)


_ALLOW = 3  # AclPermissionType.ALLOW
_CLUSTER_NAME = "kafka-cluster"
_APPLY_TIMEOUT_S = 30.0
_TYPES = frozenset(r.value for r in Resource)
_OPERATIONS = frozenset(o.value for o in Operation)
_PATTERNS = frozenset(p.value for p in Pattern)


@dataclass(frozen=True)
class Acl:
    """ALLOW ``operation`` on the resource named ``name`` (or, ``PREFIXED``, on every one
    whose name starts with ``name``) to ``principal``."""

    principal: str  # "User:guardrail"
    resource: Resource
    name: str
    operation: Operation
    pattern: Pattern = Pattern.LITERAL

    def __post_init__(self) -> None:
        if self.resource is Resource.CLUSTER and self.name != _CLUSTER_NAME:
            raise LocalKafkaError(f"the cluster resource is named {_CLUSTER_NAME!r}")

    def row(self) -> tuple[Any, ...]:
        return (
            int(self.resource),
            self.name,
            int(self.pattern),
            self.principal,
            "*",
            int(self.operation),
            _ALLOW,
            {},
        )


# one ACL as CreateAcls v2 sends it, and as DeleteAcls v2 filters on it (same wire layout)
_ENTRY: Final = (
    ("resource_type", Int8),
    ("resource_name", CompactString("utf-8")),
    ("pattern_type", Int8),
    ("principal", CompactString("utf-8")),
    ("host", CompactString("utf-8")),
    ("operation", Int8),
    ("permission_type", Int8),
    ("tags", TaggedFields),
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
    SCHEMA = Schema(("creations", CompactArray(*_ENTRY)), ("tags", TaggedFields))


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
    SCHEMA = Schema(("filters", CompactArray(*_ENTRY)), ("tags", TaggedFields))


class _DescribeAclsResponseV2(Response):  # type: ignore[misc]
    API_KEY = 29
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("error_message", CompactString("utf-8")),
        (
            "resources",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", CompactString("utf-8")),
                ("pattern_type", Int8),
                (
                    "acls",
                    CompactArray(
                        ("principal", CompactString("utf-8")),
                        ("host", CompactString("utf-8")),
                        ("operation", Int8),
                        ("permission_type", Int8),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DescribeAclsV2(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION: ClassVar[bool] = True
    API_KEY = 29
    API_VERSION = 2
    RESPONSE_TYPE = _DescribeAclsResponseV2
    SCHEMA = Schema(
        ("resource_type_filter", Int8),
        ("resource_name_filter", CompactString("utf-8")),
        ("pattern_type_filter", Int8),
        ("principal_filter", CompactString("utf-8")),
        ("host_filter", CompactString("utf-8")),
        ("operation", Int8),
        ("permission_type", Int8),
        ("tags", TaggedFields),
    )


class _DescribeAcls(Request[_DescribeAclsV2]):  # type: ignore[misc]
    """Every ACL of every principal (the filters: any)."""

    API_KEY = 29

    def build(self, request_struct_class: type[_DescribeAclsV2]) -> _DescribeAclsV2:
        return request_struct_class(1, None, 1, None, None, 1, 1, {})


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


async def _in_force(bootstrap_servers: str) -> set[Acl]:
    """The ALLOW ACLs (literal or prefixed) the broker's authoriser holds now."""
    response = await _send(bootstrap_servers, _DescribeAcls())
    found = set()
    for resource in response.to_object()["resources"]:
        if resource["pattern_type"] not in _PATTERNS or resource["resource_type"] not in _TYPES:
            continue
        for acl in resource["acls"]:
            if acl["permission_type"] == _ALLOW and acl["operation"] in _OPERATIONS:
                found.add(
                    Acl(
                        acl["principal"],
                        Resource(resource["resource_type"]),
                        resource["resource_name"],
                        Operation(acl["operation"]),
                        Pattern(resource["pattern_type"]),
                    )
                )
    return found


async def _until(bootstrap_servers: str, done: Callable[[set[Acl]], bool], what: str) -> None:
    """CreateAcls / DeleteAcls answer once the controller committed the change; a broker
    applies it when it replays the metadata log, moments later (a client started at once
    was refused a topic it had just been granted). Wait until it does."""
    deadline = time.monotonic() + _APPLY_TIMEOUT_S
    while not done(await _in_force(bootstrap_servers)):
        if time.monotonic() > deadline:
            raise LocalKafkaError(f"the broker did not apply the {what} within {_APPLY_TIMEOUT_S}s")
        await asyncio.sleep(0.05)


async def create_acls(bootstrap_servers: str, acls: Iterable[Acl]) -> None:
    """Grant ``acls`` (ALLOW, any host), in force when it returns; raises
    when the broker refuses one."""
    wanted = list(acls)
    if not wanted:
        return
    response = await _send(bootstrap_servers, _CreateAcls([acl.row() for acl in wanted]))
    errors = _errors(response.results)
    if errors:
        raise LocalKafkaError(f"CreateAcls refused: {'; '.join(errors)}")
    await _until(bootstrap_servers, lambda held: set(wanted) <= held, "ACLs created")


async def delete_acls(bootstrap_servers: str, acls: Iterable[Acl]) -> int:
    """Revoke ``acls`` (each matched exactly), out of force when it returns; returns how
    many the broker removed."""
    acls = list(acls)
    rows = [acl.row() for acl in acls]
    if not rows:
        return 0
    response = await _send(bootstrap_servers, _DeleteAcls(rows))
    errors = _errors(response.filter_results)
    if errors:
        raise LocalKafkaError(f"DeleteAcls refused: {'; '.join(errors)}")
    gone = set(acls)
    await _until(bootstrap_servers, lambda held: not gone & held, "ACLs deleted")
    return sum(len(result[2]) for result in response.filter_results)
