"""Dead letters read back: their ``x-dlq-*`` headers, a bounded tally, a redrive's choice.

A dead letter is read leniently (a newer sidecar's extra ``x-dlq-*`` field, or junk a
producer wrote to the topic, must not stop an inspection): the reason is the first
``x-dlq-reason`` header, ``(none)`` without one. Nothing here holds a record past the
call that read it: :class:`Tally` keeps counts and a few samples per reason.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from sidecar.contracts.common import REQUEST_ID_MAX_CHARS
from sidecar.contracts.deadletter import DLQ_HEADER_PREFIX, dlq_header
from sidecar.dlq.reasons import REDRIVABLE
from sidecar.exceptions import ConfigError
from sidecar.lograte import printable

__all__ = [
    "NO_REASON",
    "OTHER",
    "DeadLetter",
    "RedrivePlan",
    "Skip",
    "Tally",
    "parse_since",
    "read_dead_letter",
    "redrive_skip",
    "redriven_headers",
]

NO_REASON: Final = "(none)"
OTHER: Final = "(other)"  # a reason or topic past the ones a tally tracks
SAMPLES_PER_REASON: Final = 3
MAX_SAMPLE_DETAIL_CHARS: Final = 200
MAX_TALLY_KEYS: Final = 256  # distinct reasons, and distinct source topics, counted apart
MAX_TALLY_KEY_CHARS: Final = 249  # Kafka's longest topic name; a reason is at most 64

Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One ``rag.dlq`` record: where it sits there, what its headers say, the original."""

    partition: int  # in the DLQ topic
    offset: int
    timestamp_ms: int  # the DLQ record's own (when it was dead-lettered)
    reason: str
    detail: str
    source_topic: str | None
    source_partition: int | None
    request_id: str | None
    failed_at: datetime | None
    truncated: bool
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header]  # every header, the x-dlq-* ones included


def _first(headers: Sequence[Header], field_name: str) -> str | None:
    name = dlq_header(field_name)
    for k, v in headers:
        if k == name:
            return v.decode("utf-8", errors="replace")
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _time(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def read_dead_letter(
    *,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> DeadLetter:
    """A consumed DLQ record as a :class:`DeadLetter` (null header values read as empty)."""
    hs = [(k, b"" if v is None else v) for k, v in headers]
    return DeadLetter(
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        reason=_first(hs, "reason") or NO_REASON,
        detail=_first(hs, "detail") or "",
        source_topic=_first(hs, "source_topic"),
        source_partition=_int(_first(hs, "source_partition")),
        request_id=_first(hs, "request_id"),
        failed_at=_time(_first(hs, "failed_at")),
        truncated=_first(hs, "truncated") == "true",
        key=key,
        value=value,
        headers=hs,
    )


def redriven_headers(letter: DeadLetter) -> list[Header]:
    """The original headers, in order: every ``x-dlq-*`` one (in any case) left out."""
    return [(k, v) for k, v in letter.headers if not k.lower().startswith(DLQ_HEADER_PREFIX)]


class Skip(StrEnum):
    """Why a dead letter the reasons selected is not sent again."""

    NOT_AN_INPUT = "source-not-an-input-topic"  # also an output's own (output-too-large)
    SOURCE_MISSING = "source-topic-missing"  # deleted since (a send would wait, or create it)
    TRUNCATED = "truncated"  # only the first bytes of the original are left
    NO_VALUE = "no-value"  # a tombstone: the sidecar would dead-letter it again


def redrive_skip(
    letter: DeadLetter, input_topics: Collection[str], existing: Collection[str] | None = None
) -> Skip | None:
    """``None`` when ``letter`` can be sent again as it was, else why not (``existing``: the
    topics the cluster has, when known)."""
    if letter.source_topic not in input_topics:
        return Skip.NOT_AN_INPUT
    if existing is not None and letter.source_topic not in existing:
        return Skip.SOURCE_MISSING
    if letter.truncated:
        return Skip.TRUNCATED
    if letter.value is None:
        return Skip.NO_VALUE
    return None


MAX_TRACKED_REQUESTS: Final = 100_000  # request ids remembered to count one-sided requests


@dataclass
class RedrivePlan:
    """Which dead letters a redrive sends, and the counts it reports.

    ``reasons`` and ``request_ids`` select (no ids: every request); a selected letter is
    sent unless :func:`redrive_skip` says why not. ``join_topics`` (retrieval,
    generation) count the requests whose selected letters come from one of them only:
    their other half was read already, so a redrive cannot complete them.
    ``existing_topics``, once the cluster was asked: a letter of an input topic not among
    them is skipped (a send would wait for the topic, or have the broker create it)."""

    reasons: frozenset[str]
    request_ids: frozenset[str]
    input_topics: frozenset[str]
    join_topics: tuple[str, str]
    existing_topics: frozenset[str] | None = None
    chosen: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    not_selected: int = 0
    _sides: dict[str, int] = field(default_factory=dict)

    def consider(self, letter: DeadLetter) -> bool:
        """True when ``letter`` is to be sent (and counted as such)."""
        if letter.reason not in self.reasons or (
            self.request_ids and letter.request_id not in self.request_ids
        ):
            self.not_selected += 1
            return False
        why = redrive_skip(letter, self.input_topics, self.existing_topics)
        if why is not None:
            self.skipped[why] += 1
            return False
        self.chosen[letter.reason] += 1
        rid, topic = letter.request_id, letter.source_topic
        # a longer "request id" is no request's (a foreign writer's): not held to be counted
        if rid and len(rid) <= REQUEST_ID_MAX_CHARS and topic in self.join_topics:
            sides = self._sides
            if rid in sides or len(sides) < MAX_TRACKED_REQUESTS:
                sides[rid] = sides.get(rid, 0) | (1 << self.join_topics.index(topic))
        return True

    @property
    def one_sided(self) -> int:
        """Requests (of the first :data:`MAX_TRACKED_REQUESTS`) with letters on one side."""
        return sum(1 for bits in self._sides.values() if bits != 3)

    def to_json(self, *, sent: int, dry_run: bool) -> dict[str, Any]:
        return {
            "dry_run": dry_run,
            "selected": sum(self.chosen.values()),
            "sent": sent,
            "by_reason": dict(self.chosen.most_common()),
            "skipped": dict(self.skipped.most_common()),
            "not_selected": self.not_selected,
            "one_sided_requests": self.one_sided,
        }


@dataclass
class _Samples:
    request_ids: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def add(self, letter: DeadLetter) -> None:
        rid = (letter.request_id or "")[:MAX_SAMPLE_DETAIL_CHARS]
        if rid and len(self.request_ids) < SAMPLES_PER_REASON and rid not in self.request_ids:
            self.request_ids.append(rid)
        detail = letter.detail[:MAX_SAMPLE_DETAIL_CHARS]
        if detail and len(self.details) < SAMPLES_PER_REASON and detail not in self.details:
            self.details.append(detail)


@dataclass
class Tally:
    """Counts of dead letters by reason and source topic, their time range, a few samples
    per reason: memory bounded. The sidecar writes a few dozen reasons and topics, but
    anyone who may write to the topic writes any header: past :data:`MAX_TALLY_KEYS`
    distinct reasons (or source topics), and for one over :data:`MAX_TALLY_KEY_CHARS`
    characters, a letter is counted under :data:`OTHER`."""

    total: int = 0
    truncated: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    by_source_topic: Counter[str] = field(default_factory=Counter)
    first_ms: int | None = None
    last_ms: int | None = None
    samples: dict[str, _Samples] = field(default_factory=dict)

    def add(self, letter: DeadLetter) -> None:
        self.total += 1
        self.truncated += letter.truncated
        reason = _key(self.by_reason, letter.reason)
        self.by_reason[reason] += 1
        self.by_source_topic[_key(self.by_source_topic, letter.source_topic or NO_REASON)] += 1
        ts = letter.timestamp_ms
        if 0 <= ts <= _LAST_MS:  # -1: none; past year 9999: junk no datetime can show
            self.first_ms = ts if self.first_ms is None else min(self.first_ms, ts)
            self.last_ms = ts if self.last_ms is None else max(self.last_ms, ts)
        self.samples.setdefault(reason, _Samples()).add(letter)

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "truncated": self.truncated,
            "by_reason": dict(self.by_reason.most_common()),
            "by_source_topic": dict(self.by_source_topic.most_common()),
            "first": _iso(self.first_ms),
            "last": _iso(self.last_ms),
            "samples": {
                reason: {"request_ids": s.request_ids, "details": s.details}
                for reason, s in sorted(self.samples.items())
            },
        }

    def render(self, topic: str) -> list[str]:
        """The tally as lines for a terminal: the text read from the topic (reasons, request
        ids, details, source topics: a producer's, or a foreign writer's) with each character
        that is not printable written as an escape, so an ESC, a CSI, a newline or a
        bidirectional override in a dead letter cannot drive the on-call engineer's terminal
        or forge a line of the report."""
        if not self.total:
            return [f"{topic}: no dead letters in the range read"]
        lines = [
            f"{topic}: {self.total} dead letter(s) from {_iso(self.first_ms)} "
            f"to {_iso(self.last_ms)}"
            + (f", {self.truncated} truncated (cut to fit the topic)" if self.truncated else "")
        ]
        lines.append("by reason:")
        for reason, n in self.by_reason.most_common():
            fix = REDRIVABLE.get(reason)
            hint = f"  (redrive once {fix})" if fix else ""
            lines.append(f"  {n:>8}  {printable(reason)}{hint}")
            s = self.samples.get(reason)
            if s and s.request_ids:
                ids = ", ".join(printable(rid) for rid in s.request_ids)
                lines.append(f"            request ids: {ids}")
            lines.extend(
                f"            detail: {printable(detail)}" for detail in (s.details if s else ())
            )
        lines.append("by source topic:")
        lines.extend(f"  {n:>8}  {printable(t)}" for t, n in self.by_source_topic.most_common())
        return lines


def _key(counts: Counter[str], text: str) -> str:
    """``text`` as a tally's key: itself while the tally can track it, else :data:`OTHER`."""
    if text in counts:
        return text
    room = MAX_TALLY_KEYS - (OTHER not in counts)  # a key left for OTHER itself
    if len(counts) >= room or len(text) > MAX_TALLY_KEY_CHARS:
        return OTHER
    return text


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).isoformat(timespec="seconds")


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_LAST_MS: Final = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_since(text: str, now: datetime) -> datetime:
    """``--since``: an ISO 8601 time with its zone (``2026-12-02T19:00:00Z``) or a duration
    back from ``now`` (``90s``, ``15m``, ``2h``, ``1d``, ``1h30m``). ``ConfigError`` for
    anything else, a time without a zone (whose zone would be a guess) or one to come."""
    text = text.strip()
    match = _DURATION.fullmatch(text)
    if text and match and any(match.groups()):
        d, h, m, s = (int(g) if g else 0 for g in match.groups())
        try:
            return max(_EPOCH, now - timedelta(days=d, hours=h, minutes=m, seconds=s))
        except OverflowError:  # before year 1: every record is later
            return _EPOCH
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"--since {text!r} is neither an ISO 8601 time with its zone "
            "(2026-12-02T19:00:00Z) nor a duration (90s, 15m, 2h, 1d, 1h30m)"
        ) from None
    if when.tzinfo is None:
        raise ConfigError(
            f"--since {text!r} has no time zone; add one (Z for UTC, or +02:00) "
            "or give a duration (2h)"
        )
    if when > now:
        raise ConfigError(f"--since {text!r} is in the future (now is {now.isoformat()})")
    return max(_EPOCH, when)  # Kafka looks up no time before it (a ValueError in aiokafka)
