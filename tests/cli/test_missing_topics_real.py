"""A user who skipped `guardrail topics create`: the commands that read or write the topics
say so at once, naming the topics and the command, with exit 2.

Before, on a broker without the topics, `guardrail replay` waited out aiokafka's metadata
timeout (60 s of "Topic rag.retrieval not found in cluster metadata") and ended in a
traceback (UnknownTopicOrPartitionError), and `guardrail certificates list` (and
`reinstate`) in a traceback of a bare TimeoutError after the request timeout; `guardrail
dlq` named its topic but not what to do.
"""

from __future__ import annotations

import time

import pytest

from sidecar.cli.main import main
from sidecar.lab.demo import bundled_sample
from sidecar.lab.localkafka.broker import LocalKafka

pytestmark = pytest.mark.connected

QUICK_S = 20.0  # the request timeout is 30 s, the producer's metadata wait 60 s


@pytest.fixture
def no_topics(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Settings naming a topic set nobody created, on the real broker."""
    monkeypatch.setenv("GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS", kafka_broker.bootstrap_servers)
    for name, topic in unique_topics.items():
        if name != "group":
            monkeypatch.setenv(f"GUARDRAIL_TOPICS__{name.upper()}", topic)
    return unique_topics


def test_replay_names_the_missing_topics(
    no_topics: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    assert main(["replay", str(bundled_sample())]) == 2
    assert time.monotonic() - started < QUICK_S
    err = capsys.readouterr().err
    assert no_topics["retrieval"] in err and no_topics["generation"] in err
    assert "guardrail topics create" in err and "nothing was sent" in err


@pytest.mark.parametrize("command", [["list"], ["reinstate", "default/nq-open/r"]])
def test_certificates_name_the_missing_topic(
    no_topics: dict[str, str], capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    started = time.monotonic()
    assert main(["certificates", *command]) == 2
    assert time.monotonic() - started < QUICK_S
    err = capsys.readouterr().err
    assert f"topic {no_topics['certificates']} (GUARDRAIL_TOPICS__CERTIFICATES)" in err
    assert "guardrail topics create" in err


@pytest.mark.parametrize("command", [["inspect"], ["redrive", "--reason", "internal-error"]])
def test_dlq_names_the_missing_topic_and_what_to_do(
    no_topics: dict[str, str], capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    assert main(["dlq", *command]) == 2
    err = capsys.readouterr().err
    assert f"topic {no_topics['dlq']} (GUARDRAIL_TOPICS__DLQ) does not exist" in err
    assert "guardrail topics create" in err


@pytest.mark.parametrize("flags", [[], ["--request-id", "r-1", "--json"]])
def test_verdicts_names_the_missing_topic_and_what_to_do(
    no_topics: dict[str, str], capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    started = time.monotonic()
    assert main(["verdicts", *flags]) == 2
    assert time.monotonic() - started < QUICK_S
    captured = capsys.readouterr()
    assert captured.out == ""
    said = f"topic {no_topics['verdicts']} (GUARDRAIL_TOPICS__VERDICTS) does not exist"
    assert said in captured.err
    assert "guardrail topics create" in captured.err
