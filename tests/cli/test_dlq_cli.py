"""``guardrail dlq``'s flags: a typo, a time without a zone, a reason whose bytes would be
refused again, each a one-line error (exit 2) before Kafka is asked anything."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Self

import pytest
from aiokafka.errors import KafkaError

from sidecar.cli.main import main
from sidecar.config import Settings
from sidecar.dlq.letters import DeadLetter, read_dead_letter
from sidecar.exceptions import BrokerError
from sidecar.kafka import dlq as kafka_dlq
from sidecar.kafka.dlq import Redriver
from sidecar.lab.localkafka.broker import free_port


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    # a port nothing listens on: a check that let the command go on would fail differently
    code = main([*argv, "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--no-progress"])
    captured = capsys.readouterr()
    assert captured.out == ""
    return code, captured.err


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (
            ["inspect", "--reason", "too-many-hit"],
            "unknown reason 'too-many-hit' (did you mean too-many-hits?)",
        ),
        (["redrive", "--reason", "oversise"], "unknown reason 'oversise' (did you mean oversize?)"),
        (["inspect", "--since", "yesterday"], "--since 'yesterday' is neither an ISO 8601 time"),
        (["redrive", "--reason", "oversize", "--since", "2026-12-01T10:00"], "has no time zone"),
        (["inspect", "--limit", "0"], "--limit must be at least 1, got 0"),
        (["redrive"], "name the reasons to send again with --reason"),
        (["redrive", "--reason", "oversize", "--dry-run", "--yes"], "contradict"),
        (
            ["redrive", "--reason", "oversize", "--reason", "malformed-json", "--yes"],
            "refused: the same bytes would be dead-lettered again (malformed-json: the bytes "
            "are not JSON); have the producer send corrected events, or pass --force",
        ),
    ],
)
def test_sloppy_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], match: str
) -> None:
    code, err = run(capsys, "dlq", *argv)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"guardrail dlq {argv[0]}: ")
    assert match in err


def test_force_takes_a_refused_reason_and_then_needs_the_broker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDRAIL_KAFKA__REQUEST_TIMEOUT_MS", "2000")
    code, err = run(capsys, "dlq", "redrive", "--reason", "malformed-json", "--force", "--yes")
    assert code == 1
    assert err.startswith("guardrail: cannot read rag.dlq (GUARDRAIL_TOPICS__DLQ) at 127.0.0.1:")
    assert err.count("\n") == 1


class FakeScan:
    """Five dead letters, 'too-many-hits', on rag.retrieval, on two DLQ partitions."""

    def __init__(self, settings: object, since: object = None) -> None:
        self.to_read = 5
        self.cluster_topics = frozenset({"rag.retrieval", "rag.dlq"})

    async def __aenter__(self) -> FakeScan:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def letters(self) -> AsyncIterator[DeadLetter]:
        for i in range(5):
            yield read_dead_letter(
                partition=i % 2,
                offset=10 + i,
                timestamp_ms=0,
                key=f"r{i}".encode(),
                value=b"{}",
                headers=[
                    ("x-dlq-reason", b"too-many-hits"),
                    ("x-dlq-source-topic", b"rag.retrieval"),
                    ("x-dlq-request-id", f"r{i}".encode()),
                ],
            )


class BrokerGoesAway(Redriver):
    """Confirms two sends, then the broker is gone (or the user pressed Ctrl-C)."""

    failure: BaseException = BrokerError("sending r2 to rag.retrieval failed: broker gone")

    async def __aenter__(self) -> Self:
        return self

    async def send(self, letter: DeadLetter) -> None:
        if self.sent == 2:
            raise self.failure
        self.sent += 1

    async def __aexit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize(
    ("failure", "code", "error"),
    [
        (BrokerError("sending r2 to rag.retrieval failed: broker gone"), 1, "broker gone"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_a_redrive_that_stops_part_way_says_what_it_sent(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    failure: BaseException,
    code: int,
    error: str,
) -> None:
    """The broker gone after two of five sends (or Ctrl-C): the command said only the
    error (with --json, nothing on stdout), so the on-call engineer could not tell what
    was sent, and a second redrive sent all five again."""
    monkeypatch.setattr(kafka_dlq, "DlqScan", FakeScan)
    monkeypatch.setattr(kafka_dlq, "Redriver", BrokerGoesAway)
    monkeypatch.setattr(BrokerGoesAway, "failure", failure)
    argv = ["dlq", "redrive", "--reason", "too-many-hits", "--yes", "--no-progress"]
    assert main([*argv, "--json"]) == code
    out = json.loads(capsys.readouterr().out)
    assert (out["sent"], out["selected"], out["unconfirmed"]) == (2, 3, 0)
    assert out["last_read"] == ["0@12", "1@11"]
    assert error in out["error"]
    assert main(argv) == code
    text = capsys.readouterr().out
    assert "2 sent and confirmed" in text
    assert "up to DLQ partition@offset 0@12, 1@11:" in text


async def test_a_redriver_left_on_a_failure_counts_the_sends_confirmed_by_then() -> None:
    """Leaving the block on an error flushes what it can: a send confirmed by then is sent,
    one failed or still pending is unconfirmed (before, neither was counted)."""
    loop = asyncio.get_running_loop()
    redriver = Redriver(Settings.load(), {"rag.retrieval"})
    ok, failed, pending = loop.create_future(), loop.create_future(), loop.create_future()
    ok.set_result(None)
    failed.set_exception(KafkaError("gone"))
    redriver._unconfirmed.extend([ok, failed, pending])
    await redriver.__aexit__(BrokerError, BrokerError("gone"), None)
    assert (redriver.sent, redriver.unconfirmed) == (1, 2)


async def test_a_send_not_confirmed_on_leaving_is_counted_unconfirmed() -> None:
    """Leaving the block normally waits for each send; the first that fails raises, and it,
    like the ones behind it not yet confirmed, is unconfirmed (it was dropped uncounted)."""
    loop = asyncio.get_running_loop()
    redriver = Redriver(Settings.load(), {"rag.retrieval"})
    ok, failed, later = loop.create_future(), loop.create_future(), loop.create_future()
    ok.set_result(None)
    failed.set_exception(KafkaError("gone"))
    later.set_result(None)
    redriver._unconfirmed.extend([ok, failed, later])
    with pytest.raises(BrokerError, match="not confirmed"):
        await redriver.__aexit__(None, None, None)
    assert (redriver.sent, redriver.unconfirmed) == (2, 1)
