"""Co-partitioning group assignment: partition p of every input topic to one member.

A request's retrieval event, its generation events and its feedback are keyed
by request_id, so they land on the same partition *number* of their topics
(same count, murmur2 on the same key). The join only works if one consumer
holds that number on every topic. aiokafka's default round-robin assignor
lays all topic-partitions out in one list and deals them to members in turn:
with an odd partition count, ``retrieval[p]`` and ``generation[p]`` go to
different members and every request is torn in half.

This assignor deals partition *numbers* instead of topic-partitions: each
number goes to one member together with that number of every topic the member
subscribes to. Members are sorted by id and the numbers spread evenly (counts
differ by at most one). It is sticky: each member reports in its join metadata
the numbers it held last, and keeps them as far as the balance allows, so a
rebalance moves only what it must. With static membership (a
``group_instance_id``) the broker's member ids start with the instance id, so
the order, and with it the assignment, also survives restarts.

One group is one deployment. A shadow sidecar (another policy, its own verdict
topic) started with production's group id joins production's group and takes its
share of the partitions: their requests get their verdicts on the shadow's topic
only (audit: 95 of 300, every member ready, nothing logged). So each member says in
its join metadata where it publishes (``deployment``), and the leader names a group
whose members disagree, in its log and in every member's assignment, so that each
member says it too. It does not refuse the assignment: the partitions would go
unread.

``co_partition`` and ``split_pairs`` are pure (no Kafka); ``CoPartitionAssignor``
is the aiokafka adapter.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import ClassVar

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from sidecar.config import TopicSettings

log = logging.getLogger("sidecar.kafka.assignor")

# member -> topic -> partitions
Plan = dict[str, dict[str, list[int]]]


def balanced_owners(
    members: Sequence[str], numbers: int, previous: Mapping[str, Collection[int]]
) -> dict[int, str]:
    """Partition number -> member: every number once, counts within one of each other.

    ``members`` in the order that breaks ties (sorted ids). A member keeps the
    numbers it held before (``previous``) up to its share; a number claimed by
    two members goes to the first. The members that already hold more than the
    even share get the extra numbers first, so a balanced ``previous`` for the
    same members comes back unchanged.
    """
    if not members or numbers <= 0:
        return {}
    base, extra = divmod(numbers, len(members))
    taken: set[int] = set()
    claims: dict[str, list[int]] = {}
    for member in members:
        mine = sorted({p for p in previous.get(member, ()) if 0 <= p < numbers} - taken)
        claims[member] = mine
        taken.update(mine)
    rank = {member: i for i, member in enumerate(members)}
    holding_more = sorted(
        (m for m in members if len(claims[m]) > base), key=lambda m: (-len(claims[m]), rank[m])
    )
    order = holding_more + [m for m in members if len(claims[m]) <= base]
    cap = {member: base + (1 if i < extra else 0) for i, member in enumerate(order)}
    owner: dict[int, str] = {}
    count = dict.fromkeys(members, 0)
    for member in members:
        for p in claims[member][: cap[member]]:
            owner[p] = member
            count[member] += 1
    for p in range(numbers):
        if p in owner:
            continue
        member = min((m for m in members if count[m] < cap[m]), key=lambda m: (count[m], rank[m]))
        owner[p] = member
        count[member] += 1
    return owner


def co_partition(
    subscriptions: Mapping[str, Collection[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Collection[int]] | None = None,
) -> Plan:
    """The assignment: member -> topic -> partitions.

    ``subscriptions``: member id -> topics it subscribes to; ``partition_counts``:
    topic -> partition count (topics without metadata are left out and assigned
    to nobody); ``previous``: member id -> partition numbers it held last.
    Partition p of every topic goes to the owner of number p; should the owner
    not subscribe to a topic (members on different versions), that topic's
    partition goes to one of its subscribers instead (no co-partitioning is
    possible for it then).
    """
    members = sorted(subscriptions)
    numbers = max(
        (partition_counts.get(t, 0) for topics in subscriptions.values() for t in topics),
        default=0,
    )
    owner = balanced_owners(members, numbers, previous or {})
    plan: Plan = {member: {} for member in members}
    topics = sorted({t for topics in subscriptions.values() for t in topics})
    for topic in topics:
        subscribers = [m for m in members if topic in subscriptions[m]]
        for p in range(partition_counts.get(topic, 0)):
            member = owner[p]
            if topic not in subscriptions[member]:
                member = subscribers[p % len(subscribers)]
            plan[member].setdefault(topic, []).append(p)
    return plan


def split_pairs(
    assigned: Iterable[tuple[str, int]],
    topics: Sequence[str],
    partition_counts: Mapping[str, int] | None = None,
) -> list[str]:
    """What is wrong with an assignment for the join: one line per torn partition number.

    For every partition number held on any of ``topics`` (the co-partitioned
    inputs), the same number must be held on all of them (on those that have
    it, when ``partition_counts`` is known). Empty: the assignment is whole.
    """
    held: dict[int, set[str]] = {}
    wanted = set(topics)
    for topic, partition in assigned:
        if topic in wanted:
            held.setdefault(partition, set()).add(topic)
    problems = []
    for p in sorted(held):
        expected = [
            t for t in topics if partition_counts is None or p < partition_counts.get(t, p + 1)
        ]
        missing = [t for t in expected if t not in held[p]]
        if missing:
            have = ", ".join(f"{t}[{p}]" for t in topics if t in held[p])
            lacks = ", ".join(f"{t}[{p}]" for t in missing)
            problems.append(f"holds {have} but not {lacks}")
    return problems


def encode_owned(numbers: Iterable[int], deployment: str = "") -> bytes:
    data: dict[str, object] = {"owned": sorted(set(numbers))}
    if deployment:
        data["deployment"] = deployment
    return json.dumps(data).encode("ascii")


def _field(user_data: bytes, name: str) -> object:
    try:
        data = json.loads(user_data)
    except ValueError:
        return None
    return data.get(name) if isinstance(data, dict) else None


def decode_owned(user_data: bytes) -> list[int]:
    """The numbers a member reports holding; anything unreadable counts as none."""
    owned = _field(user_data, "owned")
    if not isinstance(owned, list):
        return []
    return [p for p in owned if isinstance(p, int) and not isinstance(p, bool)]


def decode_deployment(user_data: bytes) -> str | None:
    """Where a member says it publishes (``None``: it does not say, an older build)."""
    deployment = _field(user_data, "deployment")
    return deployment if isinstance(deployment, str) and deployment else None


def mixed_deployments(deployments: Mapping[str, str | None]) -> dict[str, list[str]]:
    """Deployment -> its members, when the members that say one do not all say the same
    (else empty)."""
    by: dict[str, list[str]] = {}
    for member, deployment in sorted(deployments.items()):
        if deployment is not None:
            by.setdefault(deployment, []).append(member)
    return by if len(by) > 1 else {}


def deployment_of(topics: TopicSettings) -> str:
    """Where a sidecar publishes: what one group's members must agree on."""
    return (
        f"verdicts={topics.verdicts} claims={topics.claims} dlq={topics.dlq} "
        f"reports={topics.reports} certificates={topics.certificates}"
    )


def _mixed_message(deployments: Iterable[str]) -> str:
    return (
        "this consumer group holds more than one deployment, publishing to: "
        + " | ".join(sorted(deployments))
        + ". Each takes a share of the partitions, and their requests are decided by it "
        "alone (a shadow or replay sidecar started with production's group id?): give "
        "every deployment its own GUARDRAIL_KAFKA__GROUP_ID"
    )


class CoPartitionAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """aiokafka's assignor protocol over ``co_partition`` (``partition_assignment_strategy``).

    aiokafka calls these as class methods; the numbers held since the last
    assignment live on the class. Use ``co_partition_assignor()`` for a class
    of one's own per consumer (several consumers in one process must not share
    it).
    """

    name = "guardrail-copartition"
    version = 0
    _owned: ClassVar[frozenset[int]] = frozenset()
    _deployment: ClassVar[str] = ""

    @classmethod
    def assign(
        cls,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        subscriptions = {m: set(meta.subscription) for m, meta in members.items()}
        counts: dict[str, int] = {}
        for topic in sorted(set().union(*subscriptions.values())):
            partitions = cluster.partitions_for_topic(topic)
            if partitions is None:
                log.warning("no partition metadata for topic %s; it is assigned to nobody", topic)
                continue
            counts[topic] = len(partitions)
        previous = {m: decode_owned(meta.user_data) for m, meta in members.items()}
        plan = co_partition(subscriptions, counts, previous)
        log.info("co-partitioned assignment: %s", plan)
        mixed = mixed_deployments(
            {m: decode_deployment(meta.user_data) for m, meta in members.items()}
        )
        told = b""
        if mixed:
            log.error(
                "%s (members: %s)",
                _mixed_message(mixed),
                "; ".join(f"{', '.join(ms)} -> {d}" for d, ms in mixed.items()),
            )
            told = json.dumps({"mixed": sorted(mixed)}).encode("utf-8")
        return {
            member: ConsumerProtocolMemberAssignment(
                cls.version, sorted(plan[member].items()), told
            )
            for member in members
        }

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(
            cls.version, sorted(topics), encode_owned(cls._owned, cls._deployment)
        )

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        cls._owned = frozenset(p for _, partitions in assignment.assignment for p in partitions)
        mixed = _field(assignment.user_data or b"", "mixed")
        if isinstance(mixed, list) and all(isinstance(d, str) for d in mixed):
            log.error("%s; this member: %s", _mixed_message(mixed), cls._deployment or "?")


def co_partition_assignor(deployment: str = "") -> type[CoPartitionAssignor]:
    """A fresh ``CoPartitionAssignor`` class whose remembered numbers belong to one consumer;
    ``deployment``: where this member publishes, compared with the group's other members."""
    return type(
        "CoPartitionAssignor",
        (CoPartitionAssignor,),
        {"_owned": frozenset(), "_deployment": deployment},
    )
