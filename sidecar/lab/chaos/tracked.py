"""Tracking hostile traffic: every sent record under a chaos id, settling, wedges, log errors."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from sidecar.config import JoinSettings
from sidecar.lab.chaos.expectations import (
    TENANT,
    HostileRecord,
    Outcome,
    tagged,
    tally,
)
from sidecar.lab.chaos.hostile import HostileFactory
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.chaos.progress import (
    WEDGE_SLACK_S,
    PendingSampler,
    longest_quiet,
    wedge_threshold_s,
)
from sidecar.lab.chaos.watch import Outputs, ScenarioResult, final_verdicts
from sidecar.lab.replay import Record


class Tracked:
    """Every sent record under a chaos id, with what must come of it."""

    def __init__(self, factory: HostileFactory, keep_values: bool = True) -> None:
        self.factory = factory
        self.keep_values = keep_values
        self.hostile: dict[str, HostileRecord] = {}
        self.ordinary_records: dict[str, HostileRecord] = {}
        self.ordinary_ids: list[str] = []
        self._next = 0

    def _tag(self, h: HostileRecord, into: dict[str, HostileRecord]) -> Record:
        cid = str(self._next)
        self._next += 1
        out = tagged(h.record, int(cid))
        kept = h if self.keep_values else replace(h, record=replace(h.record, value=b""))
        into[cid] = kept
        return out

    def add(self, group: Iterable[HostileRecord]) -> list[Record]:
        return [self._tag(h, self.hostile) for h in group]

    def ordinary(self, rid: str, drop_final: bool = False) -> list[Record]:
        """A whole request of the trusted tenant (``drop_final``: it never completes)."""
        self.ordinary_ids.append(rid)
        records = self.factory.ordinary(rid)
        if drop_final:
            records = records[:-1]
        return [
            self._tag(
                HostileRecord(
                    "ordinary", r, Outcome.ANSWER, (TENANT, rid), complete=not drop_final
                ),
                self.ordinary_records,
            )
            for r in records
        ]

    def satisfied(self, out: Outputs) -> bool:
        """Every required verdict and dead letter has been read."""
        answered = final_verdicts(out)
        if any(answered[(TENANT, rid)] == 0 for rid in self.ordinary_ids):
            return False
        for cid, h in self.hostile.items():
            if h.outcome is Outcome.DLQ and cid not in out.dlq_ids:
                return False
            if h.outcome is Outcome.ANSWER and h.request and answered[h.request] == 0:
                return False
        return True

    def score(
        self, result: ScenarioResult, out: Outputs, *, committed_all: bool, exactly_one: bool
    ) -> None:
        """``lost``: ordinary requests without (exactly) one verdict, plus hostile records
        neither dead-lettered nor answered; ``unexpected``: any other outcome than required."""
        answered = final_verdicts(out)
        incomplete = {
            (v.get("tenant") or "", v["request_id"])
            for v in out.verdicts
            if any(r["code"] == "incomplete" for r in v["reasons"])
        }
        ordinary_lost = sum(
            1
            for rid in self.ordinary_ids
            if (answered[(TENANT, rid)] != 1 if exactly_one else answered[(TENANT, rid)] == 0)
        )
        hostile = tally(
            self.hostile, out.dlq_ids, answered, committed_all=committed_all, incomplete=incomplete
        )
        leaks = tally(
            self.ordinary_records,
            out.dlq_ids,
            answered,
            committed_all=committed_all,
            incomplete=incomplete,
        )
        result.lost += ordinary_lost + hostile.lost
        unexpected = hostile.unexpected + leaks.unexpected
        result.unexpected = len(unexpected)
        result.duplicates = sum(n - 1 for n in answered.values() if n > 1)
        result.verdicts = len(out.verdicts)
        result.dlq = sum(out.dlq_reasons.values())
        result.dlq_reasons = dict(out.dlq_reasons)
        why = Counter(
            "capacity" if "(capacity)" in r["message"] else "ttl"
            for v in out.verdicts
            for r in v["reasons"]
            if r["code"] == "incomplete"
        )
        result.notes += [
            f"incomplete verdicts by eviction: {dict(why)} (capacity: count or byte budget)",
            f"ordinary requests: {len(self.ordinary_ids)}, without "
            f"{'exactly one' if exactly_one else 'a'} verdict: {ordinary_lost}",
            f"hostile records: {len(self.hostile)} in {len(hostile.by_case)} cases, "
            f"neither dead-lettered nor answered: {hostile.lost}",
            f"input committed to the end of every partition: {committed_all}",
            *(f"unexpected: {u}" for u in unexpected[:20]),
        ]


async def settle(
    tracked: Tracked,
    out: Outputs,
    sampler: PendingSampler,
    *,
    since: float,
    timeout_s: float,
    quiet_s: float = 1.5,
) -> bool:
    """Wait until all input since ``since`` is committed and every required output was read
    (or, should an expectation be wrong, nothing more came for ``quiet_s``); False on timeout.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = sampler.samples[-1] if sampler.samples else None
        if last is not None and last[0] > since and last[1] == 0:
            latest = max(out.progress[-1] if out.progress else since, since)
            if tracked.satisfied(out) or time.monotonic() - latest >= quiet_s:
                return True
        await asyncio.sleep(0.2)
    return False


def wedge(
    result: ScenarioResult, sampler: PendingSampler, out: Outputs, join: JoinSettings
) -> float:
    """``wedged_s``: the longest quiet interval with input pending, if over the threshold."""
    quiet = longest_quiet(sampler.samples, out.progress)
    threshold = wedge_threshold_s(join)
    result.notes.append(
        f"longest quiet interval with input pending: {quiet:.1f} s (a wedge above "
        f"{threshold:.1f} s: TTL + sweep + {WEDGE_SLACK_S:.0f} s); lag samples: "
        f"{len(sampler.samples)}, missed: {sampler.missed}"
    )
    return round(quiet, 1) if quiet > threshold else 0.0


def log_errors(side: SidecarProcess) -> str:
    lines = side.tail(100_000_000).splitlines()
    errors = [line for line in lines if " ERROR " in line]
    tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
    last = f"; the last: {errors[-1][:300]}" if errors else ""
    return f"sidecar log: {len(errors)} ERROR lines, {tracebacks} tracebacks{last}"
