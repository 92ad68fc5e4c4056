"""The ACLs the sidecar needs, what it says when some are missing, and a refusal while it
runs (no broker here: tests/kafka/test_acls_real.py runs the same against one)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)

from sidecar.config import Settings
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka import permissions
from sidecar.kafka.permissions import (
    DESCRIBE,
    READ,
    WRITE,
    Need,
    authorisation_error,
    check_permissions,
    hidden_topics_refusal,
    missing,
    needs,
)
from sidecar.kafka.readiness import LoopState, watch_authorisation

ALL = (1 << READ) | (1 << WRITE) | (1 << 8)  # Read, Write, Describe


def _settings(**overrides: Any) -> Settings:
    return Settings.load(
        kafka={
            "bootstrap_servers": "k1:9092,k2:9092",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "rag-guard",
            "sasl_password": "s3cret-XYZ-pw",
        },
        **overrides,
    )


def _names(wanted: list[Need]) -> set[tuple[str, str, int, bool]]:
    return {(n.resource, n.name, n.operation, n.essential) for n in wanted}


def test_needs_follow_what_the_sidecar_will_do() -> None:
    settings = _settings()
    least = _names(needs(settings, claims=False, reports=False, certificates=False))
    inputs = ("rag.retrieval", "rag.generation", "rag.feedback")
    assert least == {
        ("group", "guardrail-sidecar", READ, True),
        *(("topic", t, READ, True) for t in inputs),
        ("topic", "rag.verdicts", WRITE, True),
        ("topic", "rag.dlq", WRITE, True),
        *(("topic", t, WRITE, False) for t in inputs),  # reroute: a warning only
        # the start checks that these exist: any ACL on them gives Describe
        *(("topic", t, DESCRIBE, True) for t in ("rag.claims", "rag.reports", "rag.certificates")),
    }
    every = _names(needs(settings, claims=True, reports=True, certificates=True))
    assert every ^ least == {
        ("topic", "rag.claims", WRITE, True),
        ("topic", "rag.reports", WRITE, True),
        ("topic", "rag.certificates", READ, True),
        ("topic", "rag.certificates", WRITE, True),
        *(("topic", t, DESCRIBE, True) for t in ("rag.claims", "rag.reports", "rag.certificates")),
    }
    no_reroute = _settings(join={"reroute": False})
    assert all(
        n.essential for n in needs(no_reroute, claims=False, reports=False, certificates=False)
    )


def test_missing_reads_the_brokers_bit_fields() -> None:
    wanted = [
        Need("topic", "a", READ, "input"),
        Need("topic", "b", WRITE, "verdicts"),
        Need("topic", "c", WRITE, "dlq"),
        Need("group", "g", READ, "group"),
        Need("topic", "d", READ, "not said"),
    ]
    topics: dict[str, int | None] = {
        "a": 1 << WRITE | 1 << 8,  # Write and Describe, no Read
        "b": ALL,
        "c": 0,  # not even Describe
        "d": None,  # the broker did not say: not checked
    }
    assert [n.name for n in missing(wanted, topics, {"g": ALL})] == ["a", "c"]
    assert [n.name for n in missing(wanted, topics, {"g": 0})] == ["a", "c", "g"]
    assert [n.name for n in missing(wanted, {}, {})] == []  # nothing said: nothing refused


def _fake(
    monkeypatch: pytest.MonkeyPatch, topics: dict[str, int | None], group: int | None
) -> None:
    async def topic_operations(_admin: object, names: list[str]) -> dict[str, int | None]:
        return {n: topics.get(n, ALL) for n in names}

    async def group_operations(_admin: object, name: str) -> dict[str, int | None]:
        return {name: group}

    monkeypatch.setattr(permissions, "topic_operations", topic_operations)
    monkeypatch.setattr(permissions, "_group_operations", group_operations)


async def test_a_refused_essential_acl_ends_the_start_naming_each_and_the_grant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake(monkeypatch, {"rag.retrieval": 1 << 8, "rag.dlq": 0}, group=1 << 8)
    with pytest.raises(ConfigError) as raised:
        await check_permissions(
            _settings(), object(), claims=False, reports=False, certificates=False
        )
    said = str(raised.value)
    assert "does not allow this sidecar's principal (User:rag-guard) 3 operation(s)" in said
    assert "Read on group guardrail-sidecar (the consumer group)" in said
    assert "Read on topic rag.retrieval (input)" in said
    assert "Write on topic rag.dlq (DLQ)" in said
    grant = "kafka-acls.sh --bootstrap-server k1:9092 --add --allow-principal User:rag-guard"
    assert f"{grant} --operation Read --topic rag.retrieval" in said
    assert f"{grant} --operation Read --group guardrail-sidecar" in said
    assert "s3cret-XYZ-pw" not in said


async def test_write_on_the_inputs_missing_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reads_only = 1 << READ | 1 << 8
    _fake(monkeypatch, {"rag.retrieval": reads_only, "rag.generation": reads_only}, group=ALL)
    with caplog.at_level(logging.WARNING, logger="sidecar.kafka.permissions"):
        left = await check_permissions(
            _settings(), object(), claims=True, reports=True, certificates=True
        )
    assert [n.name for n in left] == ["rag.retrieval", "rag.generation"]
    (warning,) = caplog.messages
    assert "Write on topic rag.retrieval; Write on topic rag.generation" in warning
    assert "GUARDRAIL_JOIN__REROUTE=false" in warning


async def test_an_unknown_principal_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, {"rag.verdicts": 0}, group=ALL)
    tls = Settings.load(kafka={"bootstrap_servers": "k:9093", "security_protocol": "SSL"})
    with pytest.raises(ConfigError, match=r"principal \(User:PRINCIPAL\)"):
        await check_permissions(tls, object(), claims=False, reports=False, certificates=False)


def test_a_topic_it_may_not_describe_is_named_with_what_it_needs() -> None:
    said = str(hidden_topics_refusal(_settings(), ["rag.verdicts", "rag.claims"]))
    assert "2 operation(s) it needs" in said
    assert "Write on topic rag.verdicts (verdicts; not even Describe now)" in said
    assert "Describe on topic rag.claims (checked to exist at start; not even Describe" in said
    assert "guardrail topics create" in said


def test_only_authorisation_errors_are_final() -> None:
    said = authorisation_error(TopicAuthorizationFailedError("rag.retrieval"))
    assert said is not None and "rag.retrieval" in said and "TopicAuthorizationFailed" in said
    assert authorisation_error(KafkaConnectionError("down")) is None
    assert authorisation_error(ValueError("x")) is None


class _Subscriber:
    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)

    async def get_msg(self, consumer: object) -> str:
        if self.errors:
            raise self.errors.pop(0)
        return "records"


async def test_a_refused_fetch_makes_the_loop_not_live_and_others_do_not() -> None:
    state = LoopState()
    subscriber = _Subscriber(KafkaConnectionError("blip"), GroupAuthorizationFailedError("g"))
    watch_authorisation(subscriber, state)
    with pytest.raises(KafkaConnectionError):  # FastStream's loop logs it and fetches again
        await subscriber.get_msg(None)
    assert state.live and state.liveness_checks()["no_fatal_publish_error"]
    with pytest.raises(GroupAuthorizationFailedError):
        await subscriber.get_msg(None)
    assert not state.liveness_checks()["no_fatal_publish_error"]
    assert not state.readiness_checks(requires_assignment=False)["publishing"]
    assert "GroupAuthorizationFailedError" in str(state.fatal)
    assert await subscriber.get_msg(None) == "records"


class _Answer:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj

    def to_object(self) -> dict[str, Any]:
        return self.obj


class _Admin:
    """Answers the authorised-operations requests as a broker (or a Kafka-speaking
    service) would."""

    def __init__(self, topics: list[tuple[int, str, int]], groups: list[tuple[int, int]]):
        self.topics = topics
        self.groups = groups

    @property
    def _client(self) -> _Admin:  # aiokafka's admin client sends through its client
        return self

    def get_random_node(self) -> int:
        return 1

    async def send(self, node: int, request: object) -> _Answer:
        rows = [
            {"error_code": e, "name": n, "topic_authorized_operations": ops}
            for e, n, ops in self.topics
        ]
        return _Answer({"topics": rows})

    async def describe_consumer_groups(self, groups: list[str], **_: object) -> list[_Answer]:
        rows = [{"error_code": e, "authorized_operations": ops} for e, ops in self.groups]
        return [_Answer({"groups": rows})]


async def test_what_the_broker_says_is_read_and_what_it_cannot_mean_is_not_checked() -> None:
    omitted = -(2**31)
    admin = _Admin(
        [
            (0, "granted", ALL),
            (29, "refused", omitted),  # TOPIC_AUTHORIZATION_FAILED: may not even describe
            (0, "omitted", omitted),  # the broker did not say
            (0, "garbage", 0),  # described, yet no Describe: not a broker that authorises
            (3, "unknown", omitted),  # no such topic: the topic check says so
        ],
        [(0, 1 << READ | 1 << 8)],
    )
    got = await permissions.topic_operations(
        admin,
        ["granted", "refused", "omitted", "garbage", "unknown"],
    )
    assert got == {"granted": ALL, "refused": 0, "omitted": None, "garbage": None, "unknown": None}
    group = permissions._group_operations
    assert await group(admin, "g") == {"g": 1 << READ | 1 << 8}
    for answer, said in (((30, omitted), 0), ((0, omitted), None), ((0, 1 << READ), None)):
        assert await group(_Admin([], [answer]), "g") == {"g": said}


async def test_a_cluster_that_does_not_answer_the_question_leaves_it_unchecked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Moments after the topic check answered: the start goes on (a refusal still ends the
    loop when it comes) instead of ending with exit 1 even under ``wait_at_start``."""
    from sidecar import runtime

    class Closing:
        async def close(self) -> None:
            return None

    async def unreachable(kafka: object) -> object:
        raise BrokerError("cannot reach Kafka at k1:9092")

    async def no_answer(settings: object, admin: object, **_: object) -> list[Need]:
        raise BrokerError("could not read this client's permissions from k1:9092: timeout")

    async def reached(kafka: object) -> Closing:
        return Closing()

    processor = runtime.build_processor(_settings())
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        monkeypatch.setattr(runtime, "started_admin", unreachable)
        await runtime._check_permissions(_settings(), processor)
        monkeypatch.setattr(runtime, "started_admin", reached)
        monkeypatch.setattr(runtime, "check_permissions", no_answer)
        await runtime._check_permissions(_settings(), processor)
    said = [m for m in caplog.messages if m.startswith("the Kafka ACLs were not checked")]
    assert len(said) == 2 and "cannot reach" in said[0] and "timeout" in said[1]
