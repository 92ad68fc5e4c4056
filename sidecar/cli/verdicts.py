"""``guardrail verdicts``: what the sidecar decided, read back from ``rag.verdicts``.

Reads the verdicts topic (and the claim verdicts topic with ``--claims``) as
``guardrail dlq inspect`` reads the DLQ (:class:`~sidecar.kafka.scan.TopicScan`): no
consumer group, committed records only, up to the end offsets taken at the start.
``--request-id`` reads only the partition murmur2 puts that key on. Each verdict is
one line on stdout, every field a producer wrote escaped (:func:`~sidecar.lograte.printable`:
an ESC sequence or a forged line in a request id shows as its escape), or with
``--json`` the verdict document as one JSON line. A record that is not a verdict is
shown as unreadable with its place, never a crash (``--tenant`` and ``--decision``
leave it out: the summary counts those). ``--follow`` then shows new verdicts as they
come, until Ctrl-C (the summary then, exit 130). The counts by decision go to stderr
as the last line, so stdout holds only verdicts (``--json``: only JSON lines).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import heapq
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from sidecar.cli.groups import add_progress_arg, progress_enabled
from sidecar.config import Settings
from sidecar.contracts.verdicts import AnswerVerdict, ClaimVerdict
from sidecar.exceptions import ConfigError
from sidecar.lograte import printable

if TYPE_CHECKING:
    from aiokafka import ConsumerRecord

DECISIONS: Final = ("allow", "caveat", "block", "incomplete")
_DETAIL_CHARS: Final = 200  # of an unreadable record's error


def register(sub: Any) -> None:
    p = sub.add_parser(
        "verdicts",
        help="the sidecar's verdicts (rag.verdicts), one line each, without joining a "
        "consumer group",
    )
    p.add_argument("--request-id", help="only this request (read from its partition alone)")
    p.add_argument("--tenant", help="only this tenant's verdicts")
    p.add_argument("--decision", choices=DECISIONS, help="only verdicts with this decision")
    p.add_argument("--since", help="from this time (ISO 8601 with a zone) or this long ago (2h)")
    p.add_argument("--limit", type=int, help="only the newest N verdicts (those selected)")
    p.add_argument(
        "--claims", action="store_true", help="also the claim verdicts (GUARDRAIL_TOPICS__CLAIMS)"
    )
    p.add_argument("--json", action="store_true", help="the verdict documents as JSON lines")
    p.add_argument(
        "--follow",
        action="store_true",
        help="then keep showing new verdicts as they come, until Ctrl-C",
    )
    p.add_argument("--bootstrap-servers", help="override GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS")
    add_progress_arg(p, "a progress bar on stderr")
    p.set_defaults(func=run_verdicts)


@dataclass(frozen=True)
class Shown:
    """One record read: a verdict (``verdict``) or an unreadable record (``error``)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    verdict: AnswerVerdict | ClaimVerdict | None = None
    error: str | None = None

    @property
    def kind(self) -> str:
        """What the summary counts it as: a decision (``incomplete`` for a block the
        pipeline gave a request that never completed), ``claim <label>``, ``unreadable``."""
        v = self.verdict
        if v is None:
            return "unreadable"
        if isinstance(v, ClaimVerdict):
            return f"claim {v.label.value}"
        if any(r.code == "incomplete" for r in v.reasons):
            return "incomplete"
        return v.decision.value


def read_record(
    topic: str,
    partition: int,
    offset: int,
    *,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    claims: bool = False,
) -> Shown:
    """A record of the verdicts topic (``claims``: of the claim verdicts topic) read as its
    verdict, or as unreadable with why (not UTF-8, not JSON, not the schema)."""
    at = functools.partial(
        Shown, topic=topic, partition=partition, offset=offset, timestamp_ms=timestamp_ms, key=key
    )
    if value is None:
        return at(error="a tombstone (no value)")
    model: type[AnswerVerdict] | type[ClaimVerdict] = ClaimVerdict if claims else AnswerVerdict
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return at(error=f"not UTF-8 (byte {exc.start})")
    try:
        return at(verdict=model.model_validate_json(text))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        why = f"not {'a claim' if claims else 'an answer'} verdict: {where}: {first['msg']}{more}"
        return at(error=why[:_DETAIL_CHARS])


@dataclass
class Selection:
    """What the flags select. An unreadable record is selected by ``--request-id`` when its
    key is that id; ``--tenant`` and ``--decision`` leave it out (neither can be read from
    it: :meth:`hides` says so, and the summary counts them)."""

    request_id: str | None = None
    tenant: str | None = None
    decision: str | None = None

    def wants(self, shown: Shown) -> bool:
        v = shown.verdict
        if v is None:
            return self._key_matches(shown) and self.tenant is None and self.decision is None
        if self.request_id is not None and v.request_id != self.request_id:
            return False
        if self.tenant is not None and v.tenant != self.tenant:
            return False
        return self.decision is None or shown.kind == self.decision

    def hides(self, shown: Shown) -> bool:
        """An unreadable record left out only because ``--tenant`` or ``--decision`` cannot
        be checked on it."""
        return shown.verdict is None and self._key_matches(shown) and not self.wants(shown)

    def _key_matches(self, shown: Shown) -> bool:
        return self.request_id is None or shown.key == self.request_id.encode()


def _time(shown: Shown) -> str:
    v = shown.verdict
    record_time = datetime.fromtimestamp(shown.timestamp_ms / 1000, UTC)
    when = v.produced_at if v is not None else record_time
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def render_line(shown: Shown) -> str:
    """One line for the terminal, every producer-written field escaped."""
    v = shown.verdict
    where = f"{shown.topic}[{shown.partition}]@{shown.offset}"
    if v is None:
        key = "-" if shown.key is None else printable(shown.key.decode("utf-8", "replace"))
        return f"{_time(shown)}  unreadable  key={key}  at {where}: {printable(shown.error or '')}"
    tenant = f"  tenant={printable(v.tenant)}" if v.tenant is not None else ""
    if isinstance(v, ClaimVerdict):
        return (
            f"{_time(shown)}  {printable(v.request_id)}  claim #{v.claim_index} "
            f"{v.label.value}  score={v.score:.3f}{tenant}  {printable(v.text)}"
        )
    confidence = "-" if v.confidence is None else f"{v.confidence:.3f}"
    reasons = ", ".join(printable(r.code) for r in v.reasons) or "-"
    stage = "  (stream)" if v.stage == "stream" else ""
    return (
        f"{_time(shown)}  {printable(v.request_id)}  {shown.kind}{stage}  "
        f"confidence={confidence}{tenant}  reasons: {reasons}"
    )


def render_json(shown: Shown) -> str:
    """The verdict document as one JSON line (non-ASCII written as ``\\u`` escapes), or the
    place and error of an unreadable record."""
    if shown.verdict is None:
        key = None if shown.key is None else shown.key.decode("utf-8", "replace")
        doc: dict[str, Any] = {
            "unreadable": True,
            "topic": shown.topic,
            "partition": shown.partition,
            "offset": shown.offset,
            "key": key,
            "error": shown.error,
        }
    else:
        doc = shown.verdict.model_dump(mode="json")
    return json.dumps(doc, sort_keys=True)


@dataclass
class Newest:
    """The newest ``limit`` records selected (by record time, then place), held in a heap
    of that size: memory bounded by ``--limit``, not by the topic."""

    limit: int
    _heap: list[tuple[int, str, int, int, int, Shown]] = field(default_factory=list)
    _seq: int = 0

    def add(self, shown: Shown) -> None:
        self._seq += 1
        item = (shown.timestamp_ms, shown.topic, shown.partition, shown.offset, self._seq, shown)
        if len(self._heap) < self.limit:
            heapq.heappush(self._heap, item)
        elif item[:5] > self._heap[0][:5]:
            heapq.heapreplace(self._heap, item)

    def oldest_first(self) -> list[Shown]:
        return [item[-1] for item in sorted(self._heap, key=lambda i: i[:5])]


def summary(topics: list[str], counts: Counter[str], shown: int, hidden: int = 0) -> str:
    """The last line (on stderr): how many verdicts matched, by decision (``hidden``:
    unreadable records that ``--tenant`` or ``--decision`` could not be checked on)."""
    order = [*DECISIONS, *sorted(k for k in counts if k not in DECISIONS and k != "unreadable")]
    order.append("unreadable")
    parts = ", ".join(f"{k} {counts[k]}" for k in order if counts[k])
    total = sum(counts.values())
    limited = f", the newest {shown} shown" if shown < total else ""
    line = f"{' + '.join(topics)}: {total} selected{limited}" + (f" ({parts})" if parts else "")
    if hidden:
        line += f"; {hidden} unreadable record(s) left out (--tenant, --decision: not readable)"
    return line


@dataclass
class Listing:
    """What ``guardrail verdicts`` read and wrote: the records selected (by kind), those
    printed, the unreadable ones the flags left out."""

    selection: Selection
    as_json: bool = False
    claims_topic: str | None = None  # its records read as claim verdicts
    newest: Newest | None = None
    counts: Counter[str] = field(default_factory=Counter)
    printed: int = 0
    hidden: int = 0

    def take(self, r: ConsumerRecord[bytes, bytes]) -> Shown | None:
        """The record read; ``None`` when the flags leave it out."""
        shown = read_record(
            r.topic,
            r.partition,
            r.offset,
            timestamp_ms=r.timestamp,
            key=r.key,
            value=r.value,
            claims=r.topic == self.claims_topic,
        )
        if not self.selection.wants(shown):
            self.hidden += self.selection.hides(shown)
            return None
        self.counts[shown.kind] += 1
        return shown

    def show(self, shown: Shown) -> None:
        sys.stdout.write((render_json if self.as_json else render_line)(shown) + "\n")
        self.printed += 1


def _usage(error: str) -> int:
    sys.stderr.write(f"guardrail verdicts: {error}\n")
    return 2


def run_verdicts(args: argparse.Namespace) -> int:
    from tqdm import tqdm  # noqa: PLC0415

    from sidecar.dlq.letters import parse_since  # noqa: PLC0415
    from sidecar.kafka.scan import TopicScan  # noqa: PLC0415

    if args.limit is not None and args.limit < 1:
        return _usage(f"--limit must be at least 1, got {args.limit}")
    try:
        since = None if args.since is None else parse_since(args.since, datetime.now(UTC))
    except ConfigError as exc:
        return _usage(str(exc))
    overrides: dict[str, Any] = {}
    if args.bootstrap_servers:
        overrides["kafka"] = {"bootstrap_servers": args.bootstrap_servers}
    settings = Settings.load(**overrides)
    t = settings.topics
    named = [(t.verdicts, "GUARDRAIL_TOPICS__VERDICTS")]
    if args.claims:
        named.append((t.claims, "GUARDRAIL_TOPICS__CLAIMS"))
    listing = Listing(
        Selection(args.request_id, args.tenant, args.decision),
        as_json=args.json,
        claims_topic=t.claims if args.claims else None,
        newest=Newest(args.limit) if args.limit is not None else None,
    )

    async def scan() -> None:
        scanning = TopicScan(
            settings, named, since, key=args.request_id, client_id="guardrail-verdicts"
        )
        async with scanning as topics:
            with tqdm(
                total=topics.to_read,
                unit=" records",
                desc="verdicts",
                disable=not progress_enabled(args),
                file=sys.stderr,
            ) as bar:
                async for r in topics.records():
                    bar.update(1)
                    shown = listing.take(r)
                    if shown is not None and listing.newest is not None:
                        listing.newest.add(shown)
                    elif shown is not None:
                        listing.show(shown)
            for shown in listing.newest.oldest_first() if listing.newest else []:
                listing.show(shown)
            if not args.follow:
                return
            sys.stdout.flush()
            async for r in topics.follow():
                shown = listing.take(r)
                if shown is not None:
                    listing.show(shown)
                    sys.stdout.flush()

    def counted() -> None:
        sys.stdout.flush()
        said = summary([tp for tp, _ in named], listing.counts, listing.printed, listing.hidden)
        sys.stderr.write(said + "\n")

    try:
        asyncio.run(scan())
    except KeyboardInterrupt:  # how --follow ends: the counts of what was shown, exit 130
        counted()
        raise
    counted()
    return 0
