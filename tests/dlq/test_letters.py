"""Dead letters read back: lenient headers, a bounded tally, a redrive's choice, --since."""

from __future__ import annotations

import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest

from sidecar.contracts.deadletter import DeadLetterRecord
from sidecar.dlq.letters import (
    MAX_TALLY_KEYS,
    NO_REASON,
    OTHER,
    SAMPLES_PER_REASON,
    DeadLetter,
    RedrivePlan,
    Skip,
    Tally,
    parse_since,
    read_dead_letter,
    redriven_headers,
)
from sidecar.dlq.reasons import NOT_REDRIVABLE, REDRIVABLE
from sidecar.exceptions import ConfigError
from tests.docs.test_readme_dead_letters import code_reasons

NOW = datetime(2026, 12, 2, 19, 0, tzinfo=UTC)
INPUTS = frozenset({"rag.retrieval", "rag.generation", "rag.feedback"})


def letter(
    reason: str = "too-many-hits",
    *,
    topic: str = "rag.retrieval",
    request_id: str | None = "r1",
    offset: int = 0,
    extra: list[tuple[str, bytes]] | None = None,
    value: bytes | None = b"{}",
) -> DeadLetter:
    record = DeadLetterRecord(
        reason=reason,
        detail=f"detail of {reason}",
        source_topic=topic,
        source_partition=2,
        source_offset=7,
        request_id=request_id,
        failed_at=NOW,
        sidecar_version="0",
    )
    headers: list[tuple[str, bytes | None]] = [("traceparent", b"00-ab"), ("x-app", None)]
    headers += [*record.to_headers(), *(extra or [])]
    return read_dead_letter(
        partition=0,
        offset=offset,
        timestamp_ms=1_700_000_000_000 + offset * 1000,
        key=request_id.encode() if request_id else None,
        value=value,
        headers=headers,
    )


def test_a_dead_letter_is_read_from_its_headers_and_redriven_without_them() -> None:
    got = letter(extra=[("X-DLQ-Other", b"a newer field")])
    assert (got.reason, got.source_topic, got.source_partition) == (
        "too-many-hits",
        "rag.retrieval",
        2,
    )
    assert (got.request_id, got.failed_at, got.truncated) == ("r1", NOW, False)
    # the original headers in order, a null value as Kafka's consumer gives it back: empty
    assert redriven_headers(got) == [("traceparent", b"00-ab"), ("x-app", b"")]


def test_junk_on_the_topic_is_counted_not_fatal() -> None:
    junk = read_dead_letter(
        partition=0,
        offset=0,
        timestamp_ms=-1,
        key=None,
        value=b"x",
        headers=[("x-dlq-source-partition", b"two")],
    )
    assert (junk.reason, junk.source_partition, junk.source_topic) == (NO_REASON, None, None)
    tally = Tally()
    tally.add(junk)
    assert tally.to_json()["by_reason"] == {NO_REASON: 1}
    assert tally.to_json()["first"] is None
    # a foreign writer's CreateTime past year 9999 (a broker before Kafka 4.0 takes any):
    # counted, left out of the time range (a ValueError after the whole scan, before)
    far = read_dead_letter(
        partition=0, offset=1, timestamp_ms=2**62, key=None, value=b"x", headers=[]
    )
    tally.add(far)
    tally.add(letter())
    assert tally.to_json()["total"] == 3
    assert tally.to_json()["first"] == tally.to_json()["last"] == "2023-11-14T22:13:20+00:00"
    assert "3 dead letter(s) from 2023-11-14T22:13:20+00:00" in tally.render("rag.dlq")[0]


def test_the_tally_keeps_counts_and_a_few_samples_only() -> None:
    tally = Tally()
    for i in range(1000):
        tally.add(letter("oversize" if i % 10 else "malformed-json", request_id=f"r{i}", offset=i))
    out = tally.to_json()
    assert out["total"] == 1000
    assert out["by_reason"] == {"oversize": 900, "malformed-json": 100}
    assert out["by_source_topic"] == {"rag.retrieval": 1000}
    assert out["samples"]["malformed-json"]["request_ids"] == ["r0", "r10", "r20"]
    assert len(out["samples"]["oversize"]["request_ids"]) == SAMPLES_PER_REASON
    assert out["samples"]["oversize"]["details"] == ["detail of oversize"]  # distinct ones
    assert out["first"] < out["last"]
    text = "\n".join(tally.render("rag.dlq"))
    assert "900  oversize  (redrive once GUARDRAIL_LIMITS__MAX_MESSAGE_BYTES is raised)" in text
    assert "100  malformed-json\n" in text


def test_a_redrive_skips_what_cannot_be_sent_as_it_was() -> None:
    plan = RedrivePlan(
        reasons=frozenset({"too-many-hits", "output-too-large", "internal-error"}),
        request_ids=frozenset(),
        input_topics=INPUTS,
        join_topics=("rag.retrieval", "rag.generation"),
    )
    assert plan.consider(letter())
    assert plan.consider(letter(topic="rag.generation"))  # the same request's other half
    assert plan.consider(letter(request_id="r2"))  # one side only
    assert not plan.consider(letter("output-too-large", topic="rag.verdicts"))
    assert not plan.consider(letter(extra=[("x-dlq-truncated", b"true")]))
    assert not plan.consider(letter("internal-error", value=None))
    assert not plan.consider(letter("malformed-json"))
    assert not plan.consider(letter(topic="rag.dlq"))  # never fed back into the DLQ
    out = plan.to_json(sent=0, dry_run=True)
    assert out["selected"] == 3
    assert out["skipped"] == {Skip.NOT_AN_INPUT: 2, Skip.TRUNCATED: 1, Skip.NO_VALUE: 1}
    assert (out["not_selected"], out["one_sided_requests"]) == (1, 1)


def test_a_redrive_by_request_id_takes_those_only() -> None:
    plan = RedrivePlan(
        reasons=frozenset({"oversize"}),
        request_ids=frozenset({"r2"}),
        input_topics=INPUTS,
        join_topics=("rag.retrieval", "rag.generation"),
    )
    assert [plan.consider(letter("oversize", request_id=r)) for r in ("r1", "r2", None)] == [
        False,
        True,
        False,
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", NOW - timedelta(hours=2)),
        ("1h30m", NOW - timedelta(minutes=90)),
        ("90s", NOW - timedelta(seconds=90)),
        ("1d", NOW - timedelta(days=1)),
        ("2026-12-02T17:00:00Z", datetime(2026, 12, 2, 17, tzinfo=UTC)),
        ("2026-12-02T19:00:00+02:00", datetime(2026, 12, 2, 17, tzinfo=UTC)),
        # before the epoch, or too long ago for a datetime: from the start (an
        # OverflowError traceback, or aiokafka's ValueError for a negative time, before)
        ("1969-07-20T20:17:00Z", datetime(1970, 1, 1, tzinfo=UTC)),
        ("99999999999d", datetime(1970, 1, 1, tzinfo=UTC)),
        ("800000d", datetime(1970, 1, 1, tzinfo=UTC)),
    ],
)
def test_since_takes_a_zoned_time_or_a_duration(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("yesterday", "neither an ISO 8601 time"),
        ("", "neither an ISO 8601 time"),
        ("2h ago", "neither an ISO 8601 time"),
        ("-2h", "neither an ISO 8601 time"),
        ("2026-12-02T17:00", "has no time zone"),
        ("2026-12-02", "has no time zone"),
        ("2026-12-03T00:00:00Z", "in the future"),
    ],
)
def test_since_refuses_a_guess(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_since(text, NOW)


def test_every_reason_the_sidecar_writes_is_classified_for_a_redrive_once() -> None:
    raised = set(code_reasons())
    assert set(REDRIVABLE) & set(NOT_REDRIVABLE) == set()
    assert sorted(raised - {*REDRIVABLE, *NOT_REDRIVABLE}) == []
    assert sorted({*REDRIVABLE, *NOT_REDRIVABLE} - raised) == []


def test_the_text_report_escapes_what_a_producer_or_a_foreign_writer_put_in_the_topic() -> None:
    """A DLQ written before x-dlq-request-id was checked (de1ba59) holds raw keys, and anyone
    who may write to the topic writes any header: an ESC / CSI sequence, a C1 CSI, a newline
    forging a line of the report, a right-to-left override. Printed raw, they drove the
    on-call engineer's terminal (the screen cleared, the title set, 'exe.png' shown)."""
    hostile = read_dead_letter(
        partition=0,
        offset=0,
        timestamp_ms=1_700_000_000_000,
        key=None,
        value=b"{}",
        headers=[
            ("x-dlq-reason", b"oversize"),
            ("x-dlq-request-id", b"r\x1b[2J\r\n  999  forged \xc2\x9b31m\xe2\x80\xaegnp.exe"),
            ("x-dlq-detail", b"d\x1b]0;owned\x07\nby source topic:"),
            ("x-dlq-source-topic", b"rag.retrieval\x1b[8m"),
        ],
    )
    tally = Tally()
    tally.add(hostile)
    lines = tally.render("rag.dlq")
    text = "\n".join(lines)
    assert all(c.isprintable() for line in lines for c in line), text
    assert sum(line == "by source topic:" for line in lines) == 1
    assert r"r\x1b[2J\r\n  999  forged \x9b31m\u202egnp.exe" in text
    assert r"detail: d\x1b]0;owned\x07\nby source topic:" in text
    assert r"rag.retrieval\x1b[8m" in text
    # --json keeps the text as it was read (json.dumps escapes it)
    assert tally.to_json()["samples"]["oversize"]["details"] == [
        "d\x1b]0;owned\x07\nby source topic:"
    ]


def test_the_tally_stays_bounded_on_a_topic_anyone_wrote_to() -> None:
    """The sidecar writes a few dozen reasons, but a foreign writer's records carry any
    x-dlq-reason and x-dlq-source-topic: 200,000 distinct ones held 200,000 counters and
    sample lists (143 MB traced) where the docstring promised a bounded tally; a
    megabyte-long request id was kept whole in the samples."""
    tally = Tally()
    tally.add(letter("oversize", request_id="r" * 1_000_000))
    long_reason = [("x-dlq-reason", b"x" * 100_000)]  # longer than any reason or topic name
    tally.add(
        read_dead_letter(
            partition=0, offset=0, timestamp_ms=0, key=None, value=None, headers=long_reason
        )
    )
    n = 20_000
    for i in range(n):
        tally.add(
            read_dead_letter(
                partition=0,
                offset=i,
                timestamp_ms=i,
                key=None,
                value=b"x",
                headers=[
                    ("x-dlq-reason", f"reason-{i}".encode()),
                    ("x-dlq-source-topic", f"topic-{i}".encode()),
                    ("x-dlq-request-id", f"r{i}".encode()),
                ],
            )
        )
    tally.add(letter("oversize"))  # counted apart still: it was tracked before
    out = tally.to_json()
    assert out["total"] == n + 3
    assert sum(out["by_reason"].values()) == n + 3
    assert sum(out["by_source_topic"].values()) == n + 3
    assert len(out["by_reason"]) == len(out["by_source_topic"]) == MAX_TALLY_KEYS
    assert len(out["samples"]) == MAX_TALLY_KEYS
    assert out["by_reason"]["oversize"] == 2
    assert out["by_reason"][OTHER] == n + 1 - (MAX_TALLY_KEYS - 2)
    assert max(len(r) for s in out["samples"].values() for r in s["request_ids"]) <= 200


def test_a_redrive_skips_a_letter_whose_source_topic_the_cluster_no_longer_has() -> None:
    plan = RedrivePlan(
        reasons=frozenset({"oversize"}),
        request_ids=frozenset(),
        input_topics=INPUTS,
        join_topics=("rag.retrieval", "rag.generation"),
        existing_topics=frozenset({"rag.generation", "rag.dlq"}),
    )
    assert not plan.consider(letter("oversize"))
    assert plan.consider(letter("oversize", topic="rag.generation"))
    assert plan.to_json(sent=0, dry_run=True)["skipped"] == {Skip.SOURCE_MISSING: 1}


def test_a_redrive_holds_no_megabyte_request_ids_to_count_one_sided_requests() -> None:
    """A foreign writer's dead letters name request ids of a megabyte: the plan kept each
    to count one-sided requests, 200 MB for 200 letters (100,000 were allowed)."""
    plan = RedrivePlan(
        reasons=frozenset({"oversize"}),
        request_ids=frozenset(),
        input_topics=INPUTS,
        join_topics=("rag.retrieval", "rag.generation"),
    )
    tracemalloc.start()
    try:
        for i in range(200):
            huge = f"{i:03d}" + "r" * 1_000_000
            assert plan.consider(
                read_dead_letter(
                    partition=0,
                    offset=i,
                    timestamp_ms=0,
                    key=None,
                    value=b"{}",
                    headers=[
                        ("x-dlq-reason", b"oversize"),
                        ("x-dlq-source-topic", b"rag.retrieval"),
                        ("x-dlq-request-id", huge.encode()),
                    ],
                )
            )
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 10_000_000, held
    assert plan.to_json(sent=0, dry_run=True)["selected"] == 200
