"""``guardrail verdicts``' reading and formatting, without a broker: a verdict becomes one
escaped line (or its JSON document), a record that is not a verdict is shown as
unreadable with its place, the flags select, ``--limit`` keeps the newest, and a sloppy
flag is a one-line error (exit 2) before Kafka is asked anything."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

import pytest

from sidecar.cli.main import main
from sidecar.cli.verdicts import (
    Newest,
    Selection,
    Shown,
    read_record,
    render_json,
    render_line,
    summary,
)
from sidecar.contracts.verdicts import (
    AnswerVerdict,
    ClaimLabel,
    ClaimVerdict,
    Decision,
    Reason,
)
from sidecar.lab.localkafka.broker import free_port

NOW = datetime(2026, 12, 3, 10, 0, 0, 123_000, tzinfo=UTC)
HOSTILE = "acme\x1b[2J\x1b]0;owned\x07\u202egnp.exe\nguardrail: all verdicts allow"


def answer(
    request_id: str = "req-1",
    decision: Decision = Decision.CAVEAT,
    codes: tuple[str, ...] = ("profile.default", "claims.unsupported"),
    tenant: str | None = "acme",
    confidence: float | None = 0.8125,
) -> AnswerVerdict:
    return AnswerVerdict(
        request_id=request_id,
        idempotency_key=f"k-{request_id}",
        tenant=tenant,
        decision=decision,
        reasons=[Reason(code=c, message=f"{c} \x1b[31mred") for c in codes],
        policy="test",
        confidence=confidence,
        produced_at=NOW,
        sidecar_version="test",
    )


def record(value: bytes | None, key: bytes | None = b"req-1", offset: int = 7) -> Shown:
    return read_record(
        "rag.verdicts", 2, offset, timestamp_ms=1_700_000_000_000, key=key, value=value
    )


def test_a_verdict_is_one_line_with_its_request_decision_reasons_confidence_and_time() -> None:
    shown = record(answer().model_dump_json().encode())
    assert shown.kind == "caveat"
    assert render_line(shown) == (
        "2026-12-03T10:00:00.123Z  req-1  caveat  confidence=0.812  tenant=acme  "
        "reasons: profile.default, claims.unsupported"
    )
    assert json.loads(render_json(shown)) == answer().model_dump(mode="json")


def test_an_incomplete_block_is_counted_as_incomplete() -> None:
    v = answer(decision=Decision.BLOCK, codes=("incomplete",), confidence=None)
    shown = record(v.model_dump_json().encode())
    assert shown.kind == "incomplete"
    assert "  incomplete  confidence=-  " in render_line(shown)


def test_producer_text_is_escaped_on_the_line_and_in_json() -> None:
    shown = record(answer(tenant=HOSTILE).model_dump_json().encode())
    line = render_line(shown)
    assert line.isprintable()  # no ESC, BEL, newline or bidi override reaches the terminal
    assert "tenant=acme\\x1b[2J\\x1b]0;owned\\x07\\u202egnp.exe\\nguardrail" in line
    text = render_json(shown)
    assert text.isprintable()
    assert json.loads(text)["tenant"] == HOSTILE  # the document itself, unchanged


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (b"\xff\xfe{not utf-8", "not UTF-8 (byte 0)"),
        (b"{not json", "not an answer verdict: the document: Invalid JSON"),
        (b'{"request_id": "x"}', "not an answer verdict: idempotency_key: Field required (and "),
        (None, "a tombstone (no value)"),
    ],
)
def test_a_record_that_is_not_a_verdict_is_unreadable_with_its_place(
    value: bytes | None, error: str
) -> None:
    shown = record(value, key=b"\x1b[1Aforged\nline")
    assert shown.verdict is None
    assert shown.kind == "unreadable"
    assert shown.error is not None
    assert shown.error.startswith(error)
    line = render_line(shown)
    assert line.isprintable()
    assert "unreadable  key=\\x1b[1Aforged\\nline  at rag.verdicts[2]@7: " in line
    doc = json.loads(render_json(shown))
    assert (doc["unreadable"], doc["partition"], doc["offset"]) == (True, 2, 7)


def test_a_claim_verdict_shows_its_label_and_text_escaped() -> None:
    claim = ClaimVerdict(
        request_id="req-1",
        idempotency_key="k",
        claim_index=3,
        span=(0, 5),
        text="Paris\x1b[2J",
        label=ClaimLabel.UNSUPPORTED,
        score=0.25,
        produced_at=NOW,
        verifier_version="test",
    )
    shown = read_record(
        "rag.claims",
        0,
        1,
        timestamp_ms=0,
        key=b"req-1",
        value=claim.model_dump_json().encode(),
        claims=True,
    )
    assert shown.kind == "claim unsupported"
    assert render_line(shown).endswith("req-1  claim #3 unsupported  score=0.250  Paris\\x1b[2J")
    # an answer verdict on the claims topic is not a claim verdict
    wrong = read_record(
        "rag.claims", 0, 2, timestamp_ms=0, key=None, value=answer().model_dump_json().encode(),
        claims=True,
    )  # fmt: skip
    assert wrong.kind == "unreadable"


def test_the_selection_filters_and_keeps_unreadable_records_of_the_key_alone() -> None:
    caveat = record(answer().model_dump_json().encode())
    other = record(answer("req-2", Decision.ALLOW, tenant="beta").model_dump_json().encode())
    junk = record(b"junk", key=b"req-1")
    assert Selection(request_id="req-1").wants(caveat)
    assert not Selection(request_id="req-1").wants(other)
    assert Selection(request_id="req-1").wants(junk)
    assert not Selection(request_id="req-2").wants(junk)
    assert Selection(tenant="beta").wants(other)
    assert not Selection(tenant="beta").wants(caveat)
    assert Selection(decision="caveat").wants(caveat)
    assert not Selection(decision="allow").wants(caveat)
    assert (Selection(tenant="acme").wants(junk), Selection(tenant="acme").hides(junk)) == (
        False,
        True,
    )
    assert not Selection(request_id="req-2", decision="allow").hides(junk)  # another key


def test_limit_keeps_the_newest_oldest_first() -> None:
    newest = Newest(3)
    for ts in [5, 1, 9, 3, 7, 2]:
        newest.add(
            read_record("t", ts % 2, ts, timestamp_ms=ts, key=None, value=b"x")
        )  # fmt: skip
    assert [s.timestamp_ms for s in newest.oldest_first()] == [5, 7, 9]


def test_the_summary_counts_by_decision() -> None:
    counts = Counter({"allow": 2, "incomplete": 1, "unreadable": 1, "claim supported": 4})
    assert summary(["rag.verdicts", "rag.claims"], counts, 3) == (
        "rag.verdicts + rag.claims: 8 selected, the newest 3 shown "
        "(allow 2, incomplete 1, claim supported 4, unreadable 1)"
    )
    assert summary(["rag.verdicts"], Counter(), 0) == "rag.verdicts: 0 selected"
    assert summary(["v"], Counter({"allow": 1}), 1, hidden=2) == (
        "v: 1 selected (allow 1); 2 unreadable record(s) left out (--tenant, --decision: "
        "not readable)"
    )


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--limit", "0"], "guardrail verdicts: --limit must be at least 1, got 0"),
        (["--since", "yesterday"], "guardrail verdicts: --since 'yesterday' is neither"),
    ],
)
def test_sloppy_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], match: str
) -> None:
    code = main(["verdicts", *argv, "--bootstrap-servers", f"127.0.0.1:{free_port()}"])
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(match)
