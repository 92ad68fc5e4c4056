"""``guardrail replay`` streams its file: a day of recorded traffic is not held in memory.

Before, the whole file was parsed into records first (a 212 MB recording of 300,000
events took 1.28 GB of RSS before the first record was sent; a day of traffic does
not fit) and nothing said how far a long replay had come. Now the file is checked
line by line first (a bad line still stops the replay before anything is sent), then
read again as it is sent, with the broker's confirmations awaited as it goes, and
progress goes to stderr.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from sidecar.cli.main import main
from sidecar.config import Settings
from sidecar.lab import replay

EVENTS = 20_000


class _Cluster:
    """aiokafka's client, as far as the replay asks it: the cluster's topic names."""

    existing: ClassVar[set[str]] = {"rag.retrieval", "rag.generation", "rag.feedback"}

    async def fetch_all_metadata(self) -> _Cluster:
        return self

    def topics(self) -> set[str]:
        return set(self.existing)


class _Producer:
    """Stands in for aiokafka's producer: keeps what was sent, confirms at once."""

    sent: ClassVar[list[tuple[str, bytes | None]]] = []

    def __init__(self, **kwargs: Any) -> None:
        del kwargs
        self.client = _Cluster()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def flush(self) -> None:
        return None

    async def send(
        self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None
    ) -> asyncio.Future[None]:
        del value, headers
        self.sent.append((topic, key))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> type[_Producer]:
    monkeypatch.setattr(_Producer, "sent", [])
    monkeypatch.setattr(replay, "AIOKafkaProducer", _Producer)
    return _Producer


def _recording(path: Path, n: int) -> Path:
    text = "x" * 500
    with path.open("wb") as f:
        for i in range(n):
            event = {"schema_version": 1, "event_type": "generation.final",
                     "request_id": f"req-{i}", "answer": text, "generator_model": "m"}  # fmt: skip
            f.write(orjson.dumps(event) + b"\n")
    return path


def test_a_long_recording_is_streamed_with_progress(
    tmp_path: Path, producer: type[_Producer], capsys: pytest.CaptureFixture[str]
) -> None:
    warm_up = _recording(tmp_path / "hour.jsonl", 10)  # the imports are no part of it
    assert main(["replay", str(warm_up), "--bootstrap-servers", "127.0.0.1:1"]) == 0
    producer.sent.clear()
    path = _recording(tmp_path / "day.jsonl", EVENTS)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        code = main(["replay", str(path), "--bootstrap-servers", "127.0.0.1:1"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 0
    assert len(producer.sent) == EVENTS
    assert producer.sent[0] == ("rag.generation", b"req-0")
    assert peak < size / 2, (peak, size)  # was 14 times the file: every record held
    out = capsys.readouterr()
    assert out.out.count("replayed") == 2
    assert f"replayed {EVENTS} messages" in out.out
    assert f"10000 of {EVENTS} messages" in out.err


def test_a_bad_line_at_the_end_stops_the_replay_before_anything_is_sent(
    tmp_path: Path, producer: type[_Producer], capsys: pytest.CaptureFixture[str]
) -> None:
    path = _recording(tmp_path / "day.jsonl", 100)
    with path.open("ab") as f:
        f.write(b"{not json\n")
    assert main(["replay", str(path), "--bootstrap-servers", "127.0.0.1:1"]) == 2
    assert producer.sent == []
    assert "day.jsonl:101: not a JSON object" in capsys.readouterr().err


def test_a_topic_that_does_not_exist_stops_the_replay_before_anything_is_sent(
    tmp_path: Path,
    producer: type[_Producer],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before `guardrail topics create`, the replay sent into aiokafka's metadata wait:
    60 s of ERROR lines, then a traceback (UnknownTopicOrPartitionError)."""
    monkeypatch.setattr(_Cluster, "existing", {"rag.retrieval"})
    path = _recording(tmp_path / "day.jsonl", 10)
    assert main(["replay", str(path), "--bootstrap-servers", "127.0.0.1:1"]) == 2
    assert producer.sent == []
    err = capsys.readouterr().err
    assert "topic(s) rag.generation do not exist on 127.0.0.1:1" in err
    assert "guardrail topics create" in err


def test_a_recorded_event_is_replayed_with_its_own_bytes(tmp_path: Path) -> None:
    """A verdict's idempotency key is drawn from the input bytes: a recording of another
    producer's events (a Go service escapes ``<`` as ``\\u003c``, Python's json.dumps
    writes ``", "``) was re-encoded compact, so its replay's verdicts came under other
    keys than the recorded traffic's, never recognisable as the same requests."""
    recorded = [
        b'{"schema_version": 1, "event_type": "retrieval", "request_id": "req-1", "k": 0}',
        b'{"schema_version":1,"event_type":"generation.final","request_id":"req-1",'
        b'"answer":"a \\u003c b","generator_model":"m"}',
    ]
    path = tmp_path / "recorded.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(recorded) + b"\r\n")  # BOM, CRLF
    records = replay.load_file(path, Settings.load())
    assert [r.value for r in records] == recorded
    assert [r.key for r in records] == [b"req-1", b"req-1"]
