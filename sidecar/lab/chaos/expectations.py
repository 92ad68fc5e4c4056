"""What must come of each chaos record (Outcome, HostileRecord) and the tally of what did.

Every generated record says what the sidecar must do with it: dead-letter it
(with one of a set of reasons), answer its request with a verdict, either of
the two, or consume it silently (a label). The runner tags each record with a
``x-chaos-id`` header (dead letters keep the original headers) and
:func:`tally` checks each against the dead letters and the verdicts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sidecar.lab.replay import Record

TENANT = "acme"
OTHER_TENANT = "evil"
CHAOS_ID_HEADER = "x-chaos-id"


class Outcome(StrEnum):
    DLQ = "dlq"  # dead-lettered (with one of ``reasons`` when they are given)
    ANSWER = "answer"  # not dead-lettered; its request gets a verdict
    EITHER = "either"  # answered, or dead-lettered (with one of ``reasons`` when given)
    CONSUME = "consume"  # a label: finished without an output of its own (committed)
    # exactly one of its request's ONE_OF records is dead-lettered, the others are answered:
    # which one crosses a per-request budget depends on the order the two topics are read in
    ONE_OF = "one-of"


@dataclass(frozen=True, slots=True)
class HostileRecord:
    case: str
    record: Record
    outcome: Outcome
    request: tuple[str, str] | None = None  # (tenant, request_id) whose verdict answers it
    reasons: frozenset[str] = frozenset()
    complete: bool = False  # its request must be decided, not evicted as incomplete


def tagged(record: Record, chaos_id: int) -> Record:
    """The record with its chaos id header (dead letters keep the original headers)."""
    return replace(record, headers=[*record.headers, (CHAOS_ID_HEADER, str(chaos_id).encode())])


@dataclass(slots=True)
class Tally:
    """What came of the tracked records."""

    lost: int = 0  # neither dead-lettered nor answered (labels: not committed)
    unexpected: list[str] = field(default_factory=list)  # outcome other than the one required
    by_case: Counter[str] = field(default_factory=Counter)


def tally(
    tracked: Mapping[str, HostileRecord],
    dead_letters: Mapping[str, str],
    verdicts: Counter[tuple[str, str]],
    *,
    committed_all: bool,
    incomplete: Collection[tuple[str, str]] = (),
) -> Tally:
    """Check every tracked record (by chaos id) against the dead letters and the verdicts.

    ``dead_letters`` maps chaos ids to DLQ reasons; ``verdicts`` counts final
    verdicts per (tenant, request id); ``committed_all`` says whether the group's
    committed offsets reached the end of every input partition; ``incomplete`` names
    the requests whose verdict says they were evicted before they were complete.
    """
    out = Tally()
    one_of: dict[tuple[str, str], list[str]] = {}
    evicted = set(incomplete)
    reported: set[tuple[str, str]] = set()
    for cid, h in tracked.items():
        out.by_case[h.case] += 1
        reason = dead_letters.get(cid)
        answered = h.request is not None and verdicts[h.request] > 0
        consumed = h.outcome is Outcome.CONSUME and committed_all
        if reason is None and not answered and not consumed:
            out.lost += 1
        if h.outcome is Outcome.ONE_OF and h.request is not None:
            one_of.setdefault(h.request, []).append(cid)
        wrong = _wrong(h, reason, answered=answered)
        if wrong is None and h.complete and h.request in evicted and h.request not in reported:
            reported.add(h.request)
            wrong = "its request decided, got block/incomplete"
        if wrong is not None:
            out.unexpected.append(f"{h.case} #{cid}: expected {wrong}")
    for request, cids in one_of.items():
        reasons = [dead_letters.get(cid) for cid in cids]
        allowed = tracked[cids[0]].reasons
        hit = [r for r in reasons if r is not None and (not allowed or r in allowed)]
        if len(hit) != 1 or len([r for r in reasons if r is not None]) != 1:
            case = tracked[cids[0]].case
            out.unexpected.append(
                f"{case} {request[1]}: expected one dead letter {sorted(allowed)}, got {reasons}"
            )
        elif verdicts[request] == 0:
            out.unexpected.append(f"{tracked[cids[0]].case} {request[1]}: expected a verdict")
    return out


def _wrong(h: HostileRecord, reason: str | None, *, answered: bool) -> str | None:
    """What was required of ``h`` when it did not happen (ONE_OF is checked per request)."""
    match h.outcome:
        case Outcome.DLQ if reason is None or (h.reasons and reason not in h.reasons):
            return f"dead letter {sorted(h.reasons) or 'any'}, got {reason or 'none'}"
        case Outcome.ANSWER if reason is not None:
            return f"a verdict, got dead letter {reason}"
        case Outcome.ANSWER if not answered:
            return "a verdict"
        case Outcome.CONSUME if reason is not None:
            return f"consumed, got dead letter {reason}"
        case Outcome.EITHER if reason is not None and h.reasons and reason not in h.reasons:
            return f"a verdict or dead letter {sorted(h.reasons)}, got {reason}"
    return None
