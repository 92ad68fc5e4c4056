"""``guardrail dlq``'s flags: a typo, a time without a zone, a reason whose bytes would be
refused again, each a one-line error (exit 2) before Kafka is asked anything."""

from __future__ import annotations

import pytest

from sidecar.cli.main import main
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
