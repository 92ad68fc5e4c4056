"""Is the sidecar making progress? Pending input versus published verdicts and dead letters.

``PendingSampler`` samples the consumer group's lag on every input topic (end
offset minus committed offset, summed) with one admin client and one consumer
kept open for the whole run. ``longest_quiet`` takes those samples and the
times at which verdicts or dead letters were read, and returns the longest
interval during which input was pending and nothing was published.

A quiet interval is normal up to the join TTL: a half-request is held (its
offsets stay uncommitted) and nothing is published for it until the sweep
evicts it. ``wedge_threshold_s`` is therefore the TTL plus one sweep interval
plus a fixed slack for one batch's scoring and the publish confirmation on a
loaded machine; a longer quiet interval is a wedge.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.config import JoinSettings, Settings

WEDGE_SLACK_S = 2.0
SAMPLE_EVERY_S = 0.5


def wedge_threshold_s(join: JoinSettings) -> float:
    """The longest quiet interval with input pending that is not a wedge."""
    return (join.ttl_ms + join.sweep_interval_ms) / 1000.0 + WEDGE_SLACK_S


def longest_quiet(samples: Sequence[tuple[float, int]], progress: Sequence[float]) -> float:
    """Longest time, at any sample with pending input, since the later of the last progress
    and the start of that pending run (resolution: the sampling interval).

    ``samples`` are ``(time, pending)`` in time order; ``progress`` the sorted times at
    which a verdict or a dead letter was published.
    """
    longest = 0.0
    run_start: float | None = None
    last_progress = float("-inf")
    j = 0
    for t, pending in samples:
        while j < len(progress) and progress[j] <= t:
            last_progress = progress[j]
            j += 1
        if pending <= 0:
            run_start = None
            continue
        if run_start is None:
            run_start = t
        longest = max(longest, t - max(run_start, last_progress))
    return longest


class PendingSampler:
    """Samples the lag of the sidecar's group on the input topics until stopped."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.samples: list[tuple[float, int]] = []
        self.missed = 0  # samples the broker did not answer (counted, not guessed)
        self._stop = asyncio.Event()

    @property
    def pending(self) -> int | None:
        """The latest sample's lag (None before the first sample)."""
        return self.samples[-1][1] if self.samples else None

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        s = self.settings
        t = s.topics
        tps = [
            TopicPartition(topic, p)
            for topic in (t.retrieval, t.generation, t.feedback)
            for p in range(t.partitions)
        ]
        admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka.bootstrap_servers)
        probe = AIOKafkaConsumer(bootstrap_servers=s.kafka.bootstrap_servers)
        await admin.start()
        await probe.start()
        try:
            while not self._stop.is_set():
                try:
                    committed = await admin.list_consumer_group_offsets(s.kafka.group_id)
                    ends = await probe.end_offsets(tps)
                except Exception:  # noqa: BLE001 - best effort while the broker is busy
                    self.missed += 1
                else:
                    lag = sum(
                        max(0, end - max(0, committed[tp].offset if tp in committed else 0))
                        for tp, end in ends.items()
                    )
                    self.samples.append((time.monotonic(), lag))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SAMPLE_EVERY_S):
                        await self._stop.wait()
        finally:
            await probe.stop()
            await admin.close()
