"""``guardrail dlq inspect|redrive``: the dead-letter topic read back, and sent back.

``inspect`` counts what is in ``rag.dlq`` (by reason, by source topic, the time range,
a few request ids and details per reason) without joining a consumer group and
without holding the records. ``redrive`` sends the chosen dead letters' original
bytes, key and headers (the ``x-dlq-*`` ones left out) to the input topic each came
from, once what refused them was fixed on the sidecar's side; it is a dry run unless
``--yes``, and refuses reasons whose bytes would be refused again (``--force``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sidecar.cli.groups import add_progress_arg, progress_enabled
from sidecar.config import Settings
from sidecar.exceptions import ConfigError, GuardrailError

if TYPE_CHECKING:
    from sidecar.dlq.letters import RedrivePlan
    from sidecar.kafka.dlq import Redriver


def register(sub: Any) -> None:
    p = sub.add_parser("dlq", help="the dead-letter topic (rag.dlq): inspect it, redrive it")
    cmds = p.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    inspect = cmds.add_parser(
        "inspect",
        help="counts by reason and source topic, the time range and samples, without "
        "joining a consumer group",
    )
    _common(inspect)
    inspect.add_argument("--json", action="store_true", help="one JSON object on stdout")
    inspect.add_argument(
        "--limit", type=int, help="stop after N dead letters (those --reason selects)"
    )
    inspect.set_defaults(func=run_inspect)
    redrive = cmds.add_parser(
        "redrive",
        help="send dead letters' original bytes, key and headers to their source topic "
        "(a dry run unless --yes)",
    )
    _common(redrive)
    redrive.add_argument(
        "--request-id", action="append", default=[], help="only this request (repeatable)"
    )
    redrive.add_argument(
        "--dry-run", action="store_true", help="count what would be sent (the default)"
    )
    redrive.add_argument("--yes", action="store_true", help="send them")
    redrive.add_argument(
        "--force",
        action="store_true",
        help="also reasons whose bytes are refused again (or that this version does not know)",
    )
    redrive.add_argument("--json", action="store_true", help="one JSON object on stdout")
    redrive.set_defaults(func=run_redrive)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", help="from this time (ISO 8601 with a zone) or this long ago (2h)")
    p.add_argument(
        "--reason", action="append", default=[], help="only this x-dlq-reason (repeatable)"
    )
    p.add_argument("--bootstrap-servers", help="override GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS")
    add_progress_arg(p, "a progress bar on stderr")


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.bootstrap_servers:
        overrides["kafka"] = {"bootstrap_servers": args.bootstrap_servers}
    return Settings.load(**overrides)


class _UsageError(Exception):
    """A flag the command cannot take: one line on stderr, exit 2."""


def _since(args: argparse.Namespace) -> datetime | None:
    from sidecar.dlq.letters import parse_since  # noqa: PLC0415

    if args.since is None:
        return None
    try:
        return parse_since(args.since, datetime.now(UTC))
    except ConfigError as exc:
        raise _UsageError(str(exc)) from None


def _unknown_reasons(reasons: Sequence[str]) -> str | None:
    """What is wrong with the reasons given, or ``None``."""
    from sidecar.dlq.reasons import is_known, known_reasons  # noqa: PLC0415

    for reason in reasons:
        if not is_known(reason):
            close = difflib.get_close_matches(reason, known_reasons(), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return (
                f"unknown reason {reason!r}{hint}; the reasons are those of the README's "
                f"dead-letter table: {', '.join(known_reasons())}"
            )
    return None


def _usage(command: str, error: str) -> int:
    sys.stderr.write(f"guardrail dlq {command}: {error}\n")
    return 2


def _bar(args: argparse.Namespace, total: int, what: str) -> Any:
    from tqdm import tqdm  # noqa: PLC0415

    return tqdm(
        total=total, unit=" records", desc=what, disable=not progress_enabled(args), file=sys.stderr
    )


def run_inspect(args: argparse.Namespace) -> int:
    from sidecar.dlq.letters import Tally  # noqa: PLC0415
    from sidecar.kafka.dlq import DlqScan  # noqa: PLC0415

    if args.limit is not None and args.limit < 1:
        return _usage("inspect", f"--limit must be at least 1, got {args.limit}")
    problem = _unknown_reasons(args.reason)
    if problem:
        return _usage("inspect", problem)
    try:
        since = _since(args)
    except _UsageError as exc:
        return _usage("inspect", str(exc))
    settings = _settings(args)
    wanted = set(args.reason)
    tally = Tally()

    async def scan() -> bool:
        async with DlqScan(settings, since) as dlq:
            with _bar(args, dlq.to_read, "dlq inspect") as bar:
                async for letter in dlq.letters():
                    bar.update(1)
                    if wanted and letter.reason not in wanted:
                        continue
                    tally.add(letter)
                    if args.limit is not None and tally.total >= args.limit:
                        return True
        return False

    stopped = asyncio.run(scan())
    if args.json:
        out = {"topic": settings.topics.dlq, **tally.to_json(), "stopped_at_limit": stopped}
        out["since"] = since.isoformat() if since else None
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return 0
    lines = tally.render(settings.topics.dlq)
    if stopped:
        lines.append(f"(stopped after --limit {args.limit} dead letters)")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _redrive_refusal(args: argparse.Namespace) -> str | None:
    """What in the flags a redrive cannot take, or ``None``."""
    from sidecar.dlq.reasons import NOT_REDRIVABLE  # noqa: PLC0415

    if not args.reason:
        return "name the reasons to send again with --reason (repeatable)"
    if args.dry_run and args.yes:
        return "--dry-run and --yes contradict each other; give one"
    if args.force:
        return None
    problem = _unknown_reasons(args.reason)
    if problem:
        return f"{problem} (--force sends a reason this version lacks)"
    refused = [r for r in args.reason if r in NOT_REDRIVABLE]
    if refused:
        why = "; ".join(f"{r}: {NOT_REDRIVABLE[r]}" for r in refused)
        return (
            f"refused: the same bytes would be dead-lettered again ({why}); have the "
            "producer send corrected events, or pass --force"
        )
    return None


def _partial(
    args: argparse.Namespace,
    plan: RedrivePlan,
    redriver: Redriver | None,
    at: dict[int, int],
    exc: BaseException,
) -> None:
    """The counts of a redrive that stopped part way: on stdout (``--json``: the report with
    ``error``, ``unconfirmed`` and ``last_read``: the DLQ ``partition@offset`` of the last
    letter read in each partition), the error itself left to the caller."""
    sent = redriver.sent if redriver is not None else 0
    unconfirmed = redriver.unconfirmed if redriver is not None else 0
    error = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
    last = [f"{p}@{o}" for p, o in sorted(at.items())]
    if args.json:
        report = plan.to_json(sent=sent, dry_run=redriver is None)
        report |= {"error": error, "unconfirmed": unconfirmed, "last_read": last}
        sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
        return
    if not last:  # stopped before a dead letter was read: the error says it all
        return
    sys.stdout.write(
        f"stopped ({error}) after reading {plan.not_selected + sum(plan.skipped.values())} "
        f"dead letter(s) not sent and {sum(plan.chosen.values())} selected, up to DLQ "
        f"partition@offset {', '.join(last)}: {sent} sent and confirmed, {unconfirmed} "
        "handed to the producer unconfirmed (they may or may not have been written)\n"
    )


def run_redrive(args: argparse.Namespace) -> int:
    from sidecar.dlq.letters import RedrivePlan  # noqa: PLC0415
    from sidecar.kafka.dlq import DlqScan, Redriver  # noqa: PLC0415

    problem = _redrive_refusal(args)
    if problem:
        return _usage("redrive", problem)
    try:
        since = _since(args)
    except _UsageError as exc:
        return _usage("redrive", str(exc))
    settings = _settings(args)
    t = settings.topics
    plan = RedrivePlan(
        reasons=frozenset(args.reason),
        request_ids=frozenset(args.request_id),
        input_topics=frozenset((t.retrieval, t.generation, t.feedback)),
        join_topics=(t.retrieval, t.generation),
    )
    sending = bool(args.yes)
    redriver = Redriver(settings, plan.input_topics) if sending else None
    at: dict[int, int] = {}  # DLQ partition: the offset of the last letter read there

    async def go() -> None:
        async with DlqScan(settings, since) as dlq:
            plan.existing_topics = dlq.cluster_topics  # no send to a topic gone (or auto-created)
            async with redriver if redriver is not None else contextlib.nullcontext():
                with _bar(args, dlq.to_read, "dlq redrive") as bar:
                    async for letter in dlq.letters():
                        bar.update(1)
                        at[letter.partition] = letter.offset
                        if plan.consider(letter) and redriver is not None:
                            await redriver.send(letter)

    try:
        asyncio.run(go())
    except (GuardrailError, KeyboardInterrupt) as exc:
        # what was sent before the failure (or Ctrl-C) is said, so a second redrive can be
        # narrowed to the rest instead of sending them all again
        _partial(args, plan, redriver, at, exc)
        raise
    sent = redriver.sent if redriver is not None else 0
    report = plan.to_json(sent=sent, dry_run=not sending)
    if args.json:
        sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
        return 0
    per_reason = ", ".join(f"{r} {n}" for r, n in plan.chosen.most_common()) or "none"
    if sending:
        sys.stdout.write(f"sent {sent} dead letter(s) to their source topics ({per_reason})\n")
    else:
        sys.stdout.write(
            f"dry run: {report['selected']} dead letter(s) would be sent ({per_reason}); "
            "add --yes to send them\n"
        )
    if plan.skipped:
        listed = ", ".join(f"{n} {why}" for why, n in plan.skipped.most_common())
        sys.stdout.write(f"skipped: {listed}\n")
    sys.stdout.write(f"not selected (other reasons or request ids): {plan.not_selected}\n")
    if plan.one_sided:
        sys.stdout.write(
            f"note: {plan.one_sided} request(s) have dead letters on only one of "
            f"{t.retrieval} / {t.generation}: their other half was read already, so a "
            "redrive cannot complete them (decided incomplete after GUARDRAIL_JOIN__TTL_MS, "
            "or dead-lettered after-final while the sidecar remembers their verdict)\n"
        )
    return 0
