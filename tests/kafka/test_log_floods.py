"""A producer's flood of records the sidecar logs about writes one line per interval, not one each.

Audit, against a real broker: 100 records of 2 MB on ``rag.generation`` with a DLQ
topic of Kafka's default 1 MB ``max.message.bytes`` wrote 100 WARNING lines
``dead letter for rag.dlq truncated: ...`` (17,000 bytes, 170 KB per 1,000 records).
The log is as the command line sets it up (``limit_repeats``, ``one_line`` on the
root handlers): the first line in full, the rest counted.
"""

from __future__ import annotations

from aiokafka import ConsumerRecord

from sidecar.kafka.withdrawals import CertificateBoard, _Latest
from sidecar.lograte import report_repeats
from sidecar.pipeline.outputs import Destination
from tests.conftest import EventFactory, LogLines, dumps
from tests.kafka.harness import memory_harness, settings_for, wait_until

FLOOD = 200
KEY = b"default/nq-open/qdrant-minilm-l6"


async def test_oversized_records_for_the_dlq_log_one_line_with_a_count(
    unique_topics: dict[str, str], log_lines: LogLines
) -> None:
    async with memory_harness(settings_for(unique_topics)) as h:
        t = h.settings.topics
        h.service.publisher.limits[Destination.DLQ] = 4_096  # the DLQ topic's limit
        for i in range(FLOOD):
            junk = b'{"request_id": "r%d", "pad": "' % i + b"x" * 8_000  # not JSON, too big
            await h.publish(t.generation, junk, f"r{i}".encode())
        await wait_until(lambda: len(h.received[t.dlq]) == FLOOD, 20, "the dead letters")
        assert h.service.state.truncated_dead_letters == FLOOD
    truncated = [line for line in log_lines.lines if "truncated" in line]
    assert len(truncated) == 1  # was one per record
    assert truncated[0].startswith(f"dead letter for {t.dlq} truncated: ")
    assert report_repeats([log_lines], every=True) == 1  # the rest, counted
    assert log_lines.lines[-1].endswith(f"({FLOOD - 1} more like it not logged, the last 0s ago)")


async def test_outputs_too_large_for_their_topic_log_one_line_with_a_count(
    unique_topics: dict[str, str],
    log_lines: LogLines,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    async with memory_harness(settings_for(unique_topics)) as h:
        t = h.settings.topics
        h.service.publisher.limits[Destination.VERDICTS] = 200  # smaller than any verdict
        for i in range(FLOOD // 4):
            rid = f"req-{i}"
            await h.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
            await h.publish(t.generation, dumps(final_event(rid)), rid.encode())
        await wait_until(lambda: len(h.received[t.dlq]) == FLOOD // 4, 20, "the dead letters")
    never = [line for line in log_lines.lines if "can never be published" in line]
    assert len(never) == 1  # was one per verdict
    assert report_repeats([log_lines], every=True) == 1
    assert log_lines.lines[-1].startswith(f"an output for {t.verdicts} can never be published")
    assert log_lines.lines[-1].endswith(
        f"({FLOOD // 4 - 1} more like it not logged, the last 0s ago)"
    )


def test_junk_on_the_certificates_topic_logs_one_line_with_a_count(log_lines: LogLines) -> None:
    """Audit: 1,000 records that are no withdrawal under a certified key of a running
    sidecar's ``rag.certificates`` wrote 1,000 WARNING lines (170,890 bytes)."""
    settings = settings_for({"group": "g"})
    board = CertificateBoard(settings, _Latest(), every_key=True)
    topic = settings.topics.certificates
    for offset in range(FLOOD):
        board.apply(ConsumerRecord(topic, 0, offset, 0, 0, KEY, b"junk", None, 4, 4, []))
        board.apply(ConsumerRecord(topic, 0, offset, 0, 0, b"\xff", b"junk", None, 1, 4, []))
    assert board.ignored == 2 * FLOOD
    assert len(log_lines.lines) == 2  # a line of each kind; was one per record
    assert report_repeats([log_lines], every=True) == 2
    assert all(f"({FLOOD - 1} more like it not logged" in line for line in log_lines.lines[2:])
    board.apply(ConsumerRecord(topic, 0, FLOOD, 0, 0, KEY, None, None, 4, 0, []))
    assert log_lines.lines[-1].startswith(f"tombstone of {KEY.decode()} read from {topic}")
