"""The co-partitioning assignment: invariants (Hypothesis), stickiness, the aiokafka adapter."""

from __future__ import annotations

import logging
from collections import Counter
from unittest.mock import MagicMock

import pytest
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kafka.assignor import (
    CoPartitionAssignor,
    balanced_owners,
    co_partition,
    co_partition_assignor,
    decode_owned,
    encode_owned,
    split_pairs,
)

INPUTS = ("rag.retrieval", "rag.generation", "rag.feedback")

member_ids = st.lists(
    st.text(alphabet="abcdefghij-0123456789", min_size=1, max_size=12),
    min_size=1,
    max_size=13,
    unique=True,
)
topic_sets = st.lists(
    st.text(alphabet="abcdef.", min_size=1, max_size=8), min_size=1, max_size=4, unique=True
)


def _held(plan: dict[str, dict[str, list[int]]]) -> dict[str, set[tuple[str, int]]]:
    return {m: {(t, p) for t, ps in topics.items() for p in ps} for m, topics in plan.items()}


@settings(max_examples=300, deadline=None)
@given(
    members=member_ids,
    topics=topic_sets,
    partitions=st.integers(min_value=0, max_value=40),
    previous_seed=st.lists(st.integers(min_value=-2, max_value=45), max_size=60),
)
def test_every_partition_once_co_partitioned_and_balanced(
    members: list[str], topics: list[str], partitions: int, previous_seed: list[int]
) -> None:
    # arbitrary (even conflicting, out-of-range) previous claims must not matter to the invariants
    previous = {m: previous_seed[i :: len(members)] for i, m in enumerate(members)}
    plan = co_partition(dict.fromkeys(members, topics), dict.fromkeys(topics, partitions), previous)
    held = _held(plan)
    everything = Counter(tp for tps in held.values() for tp in tps)
    assert set(everything) == {(t, p) for t in topics for p in range(partitions)}
    assert all(n == 1 for n in everything.values())  # exactly once
    numbers: dict[str, set[int]] = {}
    for member, tps in held.items():
        numbers[member] = {p for _, p in tps}
        for p in numbers[member]:  # the member holds number p on every topic
            assert {(t, p) for t in topics} <= tps
        assert split_pairs(tps, topics) == []
    sizes = [len(numbers.get(m, set())) for m in members]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == partitions


@settings(max_examples=200, deadline=None)
@given(members=member_ids, partitions=st.integers(min_value=1, max_value=40))
def test_a_balanced_previous_assignment_comes_back_unchanged(
    members: list[str], partitions: int
) -> None:
    first = balanced_owners(sorted(members), partitions, {})
    previous: dict[str, set[int]] = {}
    for p, m in first.items():
        previous.setdefault(m, set()).add(p)
    # shuffle who is first: a balanced, sticky input in any member order stays as it is
    again = balanced_owners(sorted(members, reverse=True), partitions, previous)
    assert again == first


@settings(max_examples=200, deadline=None)
@given(
    members=member_ids,
    newcomer=st.text(alphabet="klmnop", min_size=1, max_size=6),
    partitions=st.integers(min_value=1, max_value=40),
)
def test_a_joining_member_only_takes_and_nobody_else_trades(
    members: list[str], newcomer: str, partitions: int
) -> None:
    before = balanced_owners(sorted(members), partitions, {})
    previous: dict[str, set[int]] = {}
    for p, m in before.items():
        previous.setdefault(m, set()).add(p)
    after = balanced_owners(sorted([*members, newcomer]), partitions, previous)
    moved = {p for p in range(partitions) if after[p] != before[p]}
    assert all(after[p] == newcomer for p in moved)  # old members only lose numbers
    share = -(-partitions // (len(members) + 1))  # ceil
    assert len(moved) <= share


def test_three_partitions_two_members_keep_the_pairs_where_round_robin_splits_them() -> None:
    topics = list(INPUTS)
    counts = dict.fromkeys(topics, 3)
    plan = co_partition({"a": topics, "b": topics}, counts)
    assert {m: sorted({p for ps in t.values() for p in ps}) for m, t in plan.items()} == {
        "a": [0, 2],
        "b": [1],
    }
    for tps in _held(plan).values():
        assert split_pairs(tps, topics, counts) == []

    # the control: aiokafka's default deals topic-partitions, not partition numbers
    cluster = _cluster(counts)
    members = {m: ConsumerProtocolMemberMetadata(0, topics, b"") for m in ("a", "b")}
    robin = RoundRobinPartitionAssignor.assign(cluster, members)
    problems = [split_pairs(set(a.partitions()), topics, counts) for a in robin.values()]
    assert all(problems), problems  # each member holds halves whose partners went elsewhere


def test_split_pairs_says_exactly_what_is_missing() -> None:
    topics = ["r", "g", "f"]
    problems = split_pairs({("r", 0), ("g", 0), ("f", 0), ("r", 2), ("other", 1)}, topics)
    assert problems == ["holds r[2] but not g[2], f[2]"]
    # with counts known, a number beyond a shorter topic's count is not expected there
    assert split_pairs({("r", 3), ("g", 3)}, topics, {"r": 4, "g": 4, "f": 3}) == []


def test_members_with_different_subscriptions_still_get_every_partition() -> None:
    plan = co_partition(
        {"a": ["r", "g"], "b": ["r", "g", "f"]}, {"r": 3, "g": 3, "f": 3}, previous={}
    )
    assert sorted(p for m in plan.values() for p in m.get("f", [])) == [0, 1, 2]
    assert "f" not in plan["a"]


def test_owned_numbers_round_trip_and_garbage_counts_as_none() -> None:
    assert decode_owned(encode_owned([3, 1, 1])) == [1, 3]
    for junk in (b"", b"\xff", b"[]", b'{"owned": 3}', b'{"owned": [true, "1", 2]}'):
        assert decode_owned(junk) in ([], [2])
    assert decode_owned(b'{"owned": [true, "1", 2]}') == [2]


def _cluster(counts: dict[str, int]) -> ClusterMetadata:
    cluster = MagicMock(spec_set=ClusterMetadata)
    cluster.partitions_for_topic.side_effect = lambda t: (
        set(range(counts[t])) if t in counts else None
    )
    return cluster


def test_adapter_assigns_co_partitioned_and_remembers_per_class() -> None:
    topics = list(INPUTS)
    counts = dict.fromkeys(topics, 5)
    one, two = co_partition_assignor(), co_partition_assignor()
    assert one.name == two.name == CoPartitionAssignor.name
    members = {m: one.metadata(topics) for m in ("m-1", "m-2", "m-3")}
    result = one.assign(_cluster(counts), members)
    held = {m: set(a.partitions()) for m, a in result.items()}
    assert sorted(len(tps) for tps in held.values()) == [3, 6, 6]  # 5 numbers x 3 topics
    for tps in held.values():
        assert split_pairs({(tp.topic, tp.partition) for tp in tps}, topics, counts) == []

    one.on_assignment(result["m-2"])
    assert decode_owned(one.metadata(topics).user_data) == sorted(
        {tp.partition for tp in held["m-2"]}
    )
    assert decode_owned(two.metadata(topics).user_data) == []  # a class of its own

    # sticky through the protocol: m-2 reports its numbers and a newcomer joins
    members = {
        "m-0": two.metadata(topics),
        "m-1": two.metadata(topics),
        "m-2": one.metadata(topics),
        "m-3": two.metadata(topics),
    }
    again = one.assign(_cluster(counts), members)
    kept = {tp.partition for tp in again["m-2"].partitions()}
    assert kept <= {tp.partition for tp in held["m-2"]} and kept


def test_topics_without_metadata_are_left_out() -> None:
    topics = ["r", "g"]
    members = {"a": CoPartitionAssignor.metadata(topics)}
    result = CoPartitionAssignor.assign(_cluster({"r": 2}), members)
    assert sorted((tp.topic, tp.partition) for tp in result["a"].partitions()) == [
        ("r", 0),
        ("r", 1),
    ]


def test_a_second_deployment_in_the_group_is_named_on_every_member(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A shadow sidecar (its own policy, its own verdict topic) started with production's
    GUARDRAIL_KAFKA__GROUP_ID joined production's group: it took one of three partition
    numbers, and 95 of 300 production requests got their verdict on the shadow's topic
    only, while every member was ready and nothing was logged (audit, real processes).
    Each member now says where it publishes; the leader names a group whose members
    publish to different topics, and so does every member told so by its assignment."""
    topics = list(INPUTS)
    counts = dict.fromkeys(topics, 3)
    prod = co_partition_assignor("verdicts=rag.verdicts claims=rag.claims")
    shadow = co_partition_assignor("verdicts=shadow.verdicts claims=rag.claims")
    members = {"a": prod.metadata(topics), "b": prod.metadata(topics), "c": shadow.metadata(topics)}
    with caplog.at_level(logging.ERROR, logger="sidecar.kafka.assignor"):
        result = prod.assign(_cluster(counts), members)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1
        assert "shadow.verdicts" in said[0] and "rag.verdicts" in said[0]
        assert "GUARDRAIL_KAFKA__GROUP_ID" in said[0]
        caplog.clear()
        shadow.on_assignment(result["c"])  # the member that is not the leader hears it too
        told = [r.getMessage() for r in caplog.records]
    assert len(told) == 1 and "shadow.verdicts" in told[0]
    assert {tp.partition for tp in result["c"].partitions()}  # still assigned: a warning


def test_one_deployment_and_older_members_raise_nothing(caplog: pytest.LogCaptureFixture) -> None:
    topics = list(INPUTS)
    prod = co_partition_assignor("verdicts=rag.verdicts")
    older = ConsumerProtocolMemberMetadata(0, topics, encode_owned([1]))  # says no deployment
    members = {"a": prod.metadata(topics), "b": prod.metadata(topics), "c": older}
    with caplog.at_level(logging.WARNING, logger="sidecar.kafka.assignor"):
        result = prod.assign(_cluster(dict.fromkeys(topics, 3)), members)
        prod.on_assignment(result["a"])
    assert not caplog.records
    assert decode_owned(prod.metadata(topics).user_data) == sorted(
        {tp.partition for tp in result["a"].partitions()}
    )
