"""Reading a scenario's outputs: verdict and DLQ topics, RSS and lag, and the result record.

``lost`` counts requests that never got a verdict, plus hostile messages that
reached neither the DLQ nor a verdict; duplicates are recognised by request
id and idempotency key.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.config import Settings
from sidecar.lab.chaos.expectations import (
    CHAOS_ID_HEADER,
)
from sidecar.lab.chaos.process import SidecarProcess


@dataclass
class ScenarioResult:
    name: str
    sent: int = 0  # input messages produced
    requests: int = 0  # requests that must get a verdict
    verdicts: int = 0
    duplicates: int = 0
    lost: int = 0
    dlq: int = 0
    dlq_reasons: dict[str, int] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    max_lag: int = 0
    seconds: float = 0.0
    key_conflicts: int = 0  # request ids whose verdicts carry more than one idempotency key
    not_ready_during_outage: bool | None = None
    ready_after_outage: bool | None = None
    recovery_s: float | None = None  # from the end of the fault to the last verdict
    # longest interval with input pending and nothing published, when over the wedge
    # threshold (progress.wedge_threshold_s), else 0; None where not measured
    wedged_s: float | None = None
    unexpected: int = 0  # tracked records whose outcome is not the one required (hostile)
    memory: dict[str, Any] = field(default_factory=dict)  # the soak's RSS budget check
    notes: list[str] = field(default_factory=list)


@dataclass
class Outputs:
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    dlq_reasons: Counter[str] = field(default_factory=Counter)
    dlq_ids: dict[str, str] = field(default_factory=dict)  # x-chaos-id -> DLQ reason
    last_verdict_at: float = 0.0  # time.monotonic() when the latest verdict was read
    progress: list[float] = field(default_factory=list)  # when each verdict or DLQ was read


class Watch:
    """Reads the verdict and DLQ topics and samples RSS and lag in the background."""

    def __init__(
        self,
        settings: Settings,
        sidecars: Callable[[], Iterable[SidecarProcess]],
        *,
        sample_lag: bool = True,  # off where a PendingSampler measures it
    ) -> None:
        self.settings = settings
        self.sidecars = sidecars
        self.sample_lag = sample_lag
        self.out = Outputs()
        self.peak_rss_mb = 0.0
        self.max_lag = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_rss, daemon=True)

    def _sample_rss(self) -> None:
        while not self._stop.wait(0.25):
            for p in self.sidecars():
                rss = p.rss_mb()
                if rss is not None:
                    self.peak_rss_mb = max(self.peak_rss_mb, rss)

    async def run(self, until: Callable[[Outputs], bool], timeout_s: float) -> None:
        t = self.settings.topics
        consumer = AIOKafkaConsumer(
            t.verdicts,
            t.dlq,
            bootstrap_servers=self.settings.kafka.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_partition_fetch_bytes=32 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )
        await consumer.start()
        self._sampler.start()
        deadline = time.monotonic() + timeout_s
        next_lag = 0.0
        try:
            while time.monotonic() < deadline and not until(self.out):
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    for m in records:
                        now = time.monotonic()
                        if m.topic == t.dlq:
                            headers = dict(m.headers)
                            reason = headers.get("x-dlq-reason", b"?").decode()
                            self.out.dlq_reasons[reason] += 1
                            chaos_id = headers.get(CHAOS_ID_HEADER)
                            if chaos_id is not None:
                                self.out.dlq_ids[chaos_id.decode()] = reason
                        else:
                            self.out.verdicts.append(orjson.loads(m.value))
                            self.out.last_verdict_at = now
                        self.out.progress.append(now)
                if self.sample_lag and time.monotonic() >= next_lag:
                    self.max_lag = max(self.max_lag, await self._lag())
                    next_lag = time.monotonic() + 1.0
        finally:
            self._stop.set()
            await consumer.stop()

    async def _lag(self) -> int:
        s = self.settings
        admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka.bootstrap_servers)
        probe = AIOKafkaConsumer(bootstrap_servers=s.kafka.bootstrap_servers)
        try:
            await admin.start()
            await probe.start()
            committed = await admin.list_consumer_group_offsets(s.kafka.group_id)
            tps = [TopicPartition(s.topics.retrieval, p) for p in range(s.topics.partitions)]
            tps += [TopicPartition(s.topics.generation, p) for p in range(s.topics.partitions)]
            ends = await probe.end_offsets(tps)
            return sum(
                max(0, end - max(0, committed[tp].offset if tp in committed else 0))
                for tp, end in ends.items()
            )
        except Exception:  # noqa: BLE001 - lag is best effort while the broker is down
            return 0
        finally:
            await probe.stop()
            await admin.close()


def final_verdicts(out: Outputs) -> Counter[tuple[str, str]]:
    """Final verdicts per (tenant, request id)."""
    return Counter(
        (v.get("tenant") or "", v["request_id"])
        for v in out.verdicts
        if v.get("stage", "final") == "final"
    )


def score_requests(result: ScenarioResult, expected: set[str], out: Outputs) -> None:
    """Verdicts, duplicates, idempotency-key conflicts, lost requests and dead letters."""
    seen: Counter[str] = Counter(v["request_id"] for v in out.verdicts)
    keys = {(v["request_id"], v["idempotency_key"]) for v in out.verdicts}
    result.verdicts = len(out.verdicts)
    result.duplicates = sum(seen.values()) - len(seen)
    keys_per_request = Counter(rid for rid, _ in keys)
    result.key_conflicts = sum(1 for n in keys_per_request.values() if n > 1)
    if result.key_conflicts:
        result.notes.append("some duplicate verdicts carry different idempotency keys")
    result.lost += len(expected - set(seen))
    result.dlq = sum(out.dlq_reasons.values())
    result.dlq_reasons = dict(out.dlq_reasons)
