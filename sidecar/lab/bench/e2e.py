"""End-to-end benchmarks: real broker, sidecar processes, open-loop load.

* **drain throughput** (``sustained``): N requests are produced before the
  sidecar starts; the sidecar then reads and decides them as fast as it can.
  Throughput = (N - 1) / (last - first verdict ``produced_at``), the sidecars'
  own clock. No load generator competes with the sidecar for CPU while it drains.
* **open-loop latency**: requests are produced on a fixed schedule (answers per
  second) whatever the sidecar does; latency = time the verdict is consumed -
  time its generation-final event was handed to the producer.
* **claim latency**: for claim verdicts, time consumed - time the delta that
  completed the claim's sentence was handed to the producer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from guardrail_client.keys import partition_for
from sidecar.config import TOPIC_ROLES, Settings
from sidecar.contracts.events import AttentionSummary
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.corpus import delta, final, retrieval
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.osthreads import PROCESSOR_THREAD

# Every open loop starts with this much load at its rate, not measured: the first
# verdicts after start-up are slower than the steady state (in one run at 500 answers/s
# the 25 slowest were all among the first 52), and a p99 is a handful of verdicts.
WARMUP_S = 1.0
WARMUP_SHARE = 0.2  # at most this share of a short run's own duration


def warmup_requests(rate: float, duration_s: float) -> int:
    """Requests sent before the measured ones: ``WARMUP_S`` of load, or less in a short run."""
    return int(rate * min(WARMUP_S, WARMUP_SHARE * duration_s))


@dataclass
class LoadShape:
    """What one answer looks like on the wire."""

    k: int = 3  # the shipped lookback model's K (its summaries have one column per chunk)
    deltas: int = 2
    claims: int = 0  # sentences in the answer (each a claim); 0 = one short sentence
    payload_chars: int = 200  # characters of text per chunk
    # an attention summary like SmolLM2-135M's (30 layers x 9 heads x one column per
    # chunk), so the ONNX lookback scorer runs end to end; None: no summary
    attention: tuple[int, int] | None = (30, 9)
    generator_model: str = "HuggingFaceTB/SmolLM2-135M-Instruct@Q4_1"


@dataclass
class RunResult:
    name: str
    config: dict[str, Any]
    requests: int
    verdicts: int
    seconds: float
    throughput_answers_per_s: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    claim_latency_ms: dict[str, float] = field(default_factory=dict)
    rss_mb: float = 0.0
    cpu_s: float = 0.0
    # of ``cpu_s``, the processor thread's (``sidecar.osthreads``); None: a process
    # without one (the processor on the event loop, or the raw client floor)
    processor_cpu_s: float | None = None
    max_lag: int = 0
    incomplete: int = 0  # verdicts for requests evicted by the join TTL (not fully processed)
    # open loop: the rate the load generator held (requests over the time to send them
    # all), below the asked rate when the generator, on the same cores, cannot keep up
    offered_answers_per_s: float | None = None


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {
        "p50": pick(0.50),
        "p95": pick(0.95),
        "p99": pick(0.99),
        "max": round(ordered[-1], 2),
        "mean": round(statistics.fmean(ordered), 2),
    }


def answer_events(
    rid: str, shape: LoadShape
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    r = retrieval(rid, shape.k)
    for hit in r["hits"]:
        hit["text"] = (hit["text"] + " ") * max(1, shape.payload_chars // max(1, len(hit["text"])))
    n_sentences = max(1, shape.claims)
    sentences = [f"The value {i} of {rid} is {1000 + i}. " for i in range(n_sentences)]
    groups = max(1, min(shape.deltas, n_sentences))
    size = -(-n_sentences // groups)  # contiguous groups, so claim order = answer order
    pieces = ["".join(sentences[j * size : (j + 1) * size]) for j in range(groups)]
    deltas = [delta(rid, i, p) for i, p in enumerate(pieces) if p]
    extra: dict[str, Any] = {"generator_model": shape.generator_model}
    if shape.attention is not None:
        layers, heads = shape.attention
        rng = np.random.default_rng(abs(hash(rid)) % 2**32)
        values = rng.uniform(0.0, 1.0, size=(layers, heads, shape.k))
        extra["attention"] = AttentionSummary.from_array(values).model_dump()
    return r, deltas, final(rid, "".join(sentences), **extra)


# one request, encoded: id, key, retrieval, (sentences, delta) per delta, final. Drains
# and open loops encode their load before they start (in an open loop, building events
# inside the paced loop held the generator below the asked rate)
_Encoded = tuple[str, bytes, bytes, list[tuple[int, bytes]], bytes]


def _encoded_load(name: str, n: int, shape: LoadShape) -> list[_Encoded]:
    load = []
    for i in range(n):
        rid = f"{name}-{i}"
        r, ds, f = answer_events(rid, shape)
        deltas = [(d["text"].count(". "), orjson.dumps(d)) for d in ds]
        load.append((rid, rid.encode(), orjson.dumps(r), deltas, orjson.dumps(f)))
    return load


def _stat_cpu_s(stat: Path) -> tuple[str, float]:
    """A ``/proc`` ``stat`` file's name (``comm``) and CPU seconds (user + system); raises
    ``OSError``, ``IndexError`` or ``ValueError`` for one gone or unreadable."""
    comm, _, rest = stat.read_text().partition(" (")[2].rpartition(")")
    fields = rest.split()
    return comm, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    try:
        return _stat_cpu_s(Path(f"/proc/{pid}/stat"))[1]
    except (OSError, IndexError, ValueError):
        return 0.0


def _thread_cpu_s(pid: int, name: str) -> float | None:
    """The CPU (user + system) of process ``pid``'s threads the kernel names ``name``
    (``sidecar.osthreads``), summed; ``None`` when it has none now."""
    found = None
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            comm, spent = _stat_cpu_s(task / "stat")
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
        if comm == name:
            found = (found or 0.0) + spent
    return found


def _processor_cpu_s(before: dict[int, float]) -> float | None:
    """The processor threads' CPU since ``before`` (per process, as read at the start),
    summed; ``None`` when a process has no processor thread."""
    spent = 0.0
    for pid, start in before.items():
        now = _thread_cpu_s(pid, PROCESSOR_THREAD)
        if now is None:
            return None
        spent += now - start
    return spent


class Bench:
    def __init__(
        self,
        broker: LocalKafka,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        argv: Sequence[str] = ("-m", "sidecar", "run"),
        *,
        off_partition: bool = False,
        cpus: frozenset[int] | None = None,
    ) -> None:
        """``argv``: the process under test (default the sidecar; the floors run
        ``-m sidecar.lab.bench.floors noop|parse|raw``). ``off_partition``: a drain's
        generation records are written to the partition after the one murmur2 puts their
        request on (a producer with another partitioner): the sidecar reroutes each.
        ``cpus``: the CPUs the process under test runs on (``placement.Placement``)."""
        self.broker = broker
        self.workdir = workdir
        self.extra_env = extra_env or {}
        self.argv = tuple(argv)
        self.off_partition = off_partition
        self.cpus = cpus

    def _setup(self, partitions: int) -> tuple[Settings, dict[str, str]]:
        suffix = uuid.uuid4().hex[:8]
        topics = {n: f"bench.{suffix}.{n}" for n in TOPIC_ROLES}
        settings = Settings.load(
            kafka={
                "bootstrap_servers": self.broker.bootstrap_servers,
                "group_id": f"bench.{suffix}",
            },
            topics={**topics, "partitions": partitions},
        )
        env = {
            "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": self.broker.bootstrap_servers,
            "GUARDRAIL_KAFKA__GROUP_ID": f"bench.{suffix}",
            "GUARDRAIL_TOPICS__PARTITIONS": str(partitions),
            "GUARDRAIL_LOG_LEVEL": "WARNING",
            **{f"GUARDRAIL_TOPICS__{n.upper()}": v for n, v in topics.items()},
            **self.extra_env,
        }
        return settings, env

    async def _producer(self, settings: Settings) -> AIOKafkaProducer:
        p = AIOKafkaProducer(
            bootstrap_servers=settings.kafka.bootstrap_servers,
            acks=1,
            linger_ms=2,
            max_batch_size=256 * 1024,
            max_request_size=settings.topics.max_message_bytes,
        )
        await p.start()
        return p

    async def _fill(self, settings: Settings, records: list[tuple[str, bytes, bytes]]) -> None:
        producer = await self._producer(settings)
        generation, n = settings.topics.generation, settings.topics.partitions
        try:
            for topic, value, key in records:
                partition = None
                if self.off_partition and topic == generation and n > 1:
                    partition = (partition_for(key.decode(), n) + 1) % n
                await producer.send(topic, value, key=key, partition=partition)
            await producer.flush()
        finally:
            await producer.stop()

    async def drain(
        self,
        name: str,
        n: int,
        shape: LoadShape,
        partitions: int = 3,
        instances: int = 1,
        *,
        fill_after_start: bool = False,
    ) -> RunResult:
        """Pre-fill N requests, start the sidecar(s), time the drain.

        ``fill_after_start``: start the sidecar(s) first, on empty topics, and fill
        once every one is up and the group has settled (the scale-out runs: started
        on a backlog, the first instance up drained it alone before the second
        joined). The fill is encoded beforehand and runs faster than a drain.
        """
        settings, env = self._setup(partitions)
        await create_topics(settings)
        t = settings.topics
        records = [
            record
            for _, key, retrieval, deltas, final in _encoded_load(name, n, shape)
            for record in (
                (t.retrieval, retrieval, key),
                *((t.generation, delta, key) for _, delta in deltas),
                (t.generation, final, key),
            )
        ]
        if not fill_after_start:
            await self._fill(settings, records)
        sidecars = [
            SidecarProcess(env, self.workdir / f"{name}-{j}.log", self.argv, cpus=self.cpus)
            for j in range(instances)
        ]
        await asyncio.gather(*(asyncio.to_thread(s.start) for s in sidecars))
        cpu0 = {s.pid: _proc_cpu_s(s.pid) for s in sidecars if s.pid}
        # the processor's own thread (``sidecar.osthreads``), started on its first call
        processor0 = {pid: _thread_cpu_s(pid, PROCESSOR_THREAD) or 0.0 for pid in cpu0}
        if fill_after_start:
            await self._fill(settings, records)
        del records
        times: list[float] = []
        rss = 0.0
        incomplete = 0

        def on_verdict(obj: dict[str, Any], now: float) -> None:
            nonlocal incomplete
            del now  # the sidecar's own production time is what counts here
            times.append(datetime.fromisoformat(obj["produced_at"]).timestamp())
            incomplete += any(r["code"] == "incomplete" for r in obj["reasons"])

        async def sample() -> None:
            nonlocal rss
            while len(times) < n:
                rss = max(rss, *(s.rss_mb() or 0.0 for s in sidecars))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        await self._consume(settings, t.verdicts, n, on_verdict, timeout_s=120.0)
        sampler.cancel()
        cpu = sum(_proc_cpu_s(pid) - c0 for pid, c0 in cpu0.items())
        processor = _processor_cpu_s(processor0)
        for s in sidecars:
            await asyncio.to_thread(s.signal, signal.SIGTERM)
        times.sort()
        seconds = (times[-1] - times[0]) if len(times) > 1 else 0.0
        return RunResult(
            name=name,
            config={
                "mode": "drain",
                **asdict(shape),
                "partitions": partitions,
                "instances": instances,
                **({"generation_off_partition": True} if self.off_partition else {}),
                "filled": "after start" if fill_after_start else "before start",
            },
            requests=n,
            verdicts=len(times),
            seconds=round(seconds, 3),
            throughput_answers_per_s=round((len(times) - 1) / seconds, 1) if seconds > 0 else 0.0,
            rss_mb=round(rss, 1),
            cpu_s=round(cpu, 2),
            processor_cpu_s=None if processor is None else round(processor, 2),
            incomplete=incomplete,
        )

    async def open_loop(
        self, name: str, rate: float, duration_s: float, shape: LoadShape, partitions: int = 3
    ) -> RunResult:
        """Produce at a fixed rate while the sidecar runs; latency per verdict (and claim).

        The measured ``rate * duration_s`` requests follow :func:`warmup_requests` of
        the same load at the same rate, without a break; the warm-up's verdicts are
        awaited and checked for ``incomplete`` but not timed.
        """
        settings, env = self._setup(partitions)
        await create_topics(settings)
        sidecar = SidecarProcess(env, self.workdir / f"{name}.log", self.argv, cpus=self.cpus)
        await asyncio.to_thread(sidecar.start)
        t = settings.topics
        n = int(rate * duration_s)
        warm = warmup_requests(rate, duration_s)
        final_sent: dict[str, float] = {}
        sentence_sent: dict[tuple[str, int], float] = {}
        latencies: list[float] = []
        claim_latencies: list[float] = []
        incomplete = 0

        last_verdict = [0.0]

        def on_verdict(obj: dict[str, Any], now: float) -> None:
            nonlocal incomplete
            incomplete += any(r["code"] == "incomplete" for r in obj["reasons"])
            sent = final_sent.get(obj["request_id"])
            if sent is not None:
                latencies.append((now - sent) * 1000.0)
                last_verdict[0] = now

        def on_claim(obj: dict[str, Any], now: float) -> None:
            sent = sentence_sent.get((obj["request_id"], obj["claim_index"]))
            if sent is not None:
                claim_latencies.append((now - sent) * 1000.0)

        producer = await self._producer(settings)
        consumers = [
            asyncio.create_task(
                self._consume(settings, t.verdicts, warm + n, on_verdict, timeout_s=duration_s + 60)
            )
        ]
        if shape.claims:
            consumers.append(
                asyncio.create_task(
                    self._consume(
                        settings,
                        t.claims,
                        (warm + n) * shape.claims,
                        on_claim,
                        timeout_s=duration_s + 15,
                    )
                )
            )
        await asyncio.sleep(1.0)  # consumers assigned before the load starts
        load = _encoded_load(name, warm + n, shape)  # before the clock: the generator only sends
        # (time, sidecar CPU) as the first timed request is due: the measured part starts
        measured = [time.monotonic(), _proc_cpu_s(sidecar.pid or 0)]

        def on_measured() -> None:
            measured[:] = [time.monotonic(), _proc_cpu_s(sidecar.pid or 0)]

        try:
            rss, offered = await self._produce_at_rate(
                producer,
                settings=settings,
                load=load,
                rate=rate,
                sidecar=sidecar,
                final_sent=final_sent,
                sentence_sent=sentence_sent,
                warmup=warm,
                on_measured=on_measured,
            )
            await asyncio.gather(*consumers)
        finally:
            await producer.stop()
        start, cpu0 = measured
        elapsed = (last_verdict[0] or time.monotonic()) - start
        cpu = _proc_cpu_s(sidecar.pid or 0) - cpu0
        await asyncio.to_thread(sidecar.signal, signal.SIGTERM)
        return RunResult(
            name=name,
            config={
                "mode": "open-loop",
                "rate_answers_per_s": rate,
                "duration_s": duration_s,
                "warmup_requests": warm,
                **asdict(shape),
                "partitions": partitions,
            },
            requests=n,
            verdicts=len(latencies),
            seconds=round(elapsed, 2),
            throughput_answers_per_s=round(len(latencies) / elapsed, 1),
            latency_ms=percentiles(latencies),
            claim_latency_ms=percentiles(claim_latencies),
            rss_mb=round(rss, 1),
            cpu_s=round(cpu, 2),
            incomplete=incomplete,
            offered_answers_per_s=offered,
        )

    @staticmethod
    async def _produce_at_rate(
        producer: AIOKafkaProducer,
        *,
        settings: Settings,
        load: list[_Encoded],
        rate: float,
        sidecar: SidecarProcess,
        final_sent: dict[str, float],
        sentence_sent: dict[tuple[str, int], float],
        warmup: int = 0,
        on_measured: Callable[[], None] | None = None,
    ) -> tuple[float, float]:
        """Open loop: request i is due at start + i / rate, whatever the sidecar does.

        The first ``warmup`` requests are sent but not timed (no entry in
        ``final_sent`` / ``sentence_sent``); ``on_measured`` is called as the first
        timed one is due. Returns the sidecar's peak RSS and the rate the requests
        went out at.
        """
        t = settings.topics
        rss = 0.0
        n = len(load)
        start = time.monotonic()
        for i, (rid, key, raw_retrieval, deltas, raw_final) in enumerate(load):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            timed = i >= warmup
            if i == warmup and on_measured is not None:
                on_measured()
            await producer.send(t.retrieval, raw_retrieval, key=key)
            claim = 0
            for sentences, raw_delta in deltas:
                now = time.monotonic()
                for _ in range(sentences if timed else 0):
                    sentence_sent[(rid, claim)] = now
                    claim += 1
                await producer.send(t.generation, raw_delta, key=key)
            if timed:
                final_sent[rid] = time.monotonic()
            await producer.send(t.generation, raw_final, key=key)
            if i % 50 == 0:
                rss = max(rss, sidecar.rss_mb() or 0.0)
        sending_s = time.monotonic() - start
        await producer.flush()
        return rss, round(n / sending_s, 1) if sending_s > 0 else rate

    async def _consume(
        self,
        settings: Settings,
        topic: str,
        n: int,
        on: Callable[[dict[str, Any], float], None],
        timeout_s: float,
        *,
        cap_s: float = 1800.0,
    ) -> int:
        """Read ``n`` records of ``topic``; gives up after ``timeout_s`` without a new one.

        The wait is for progress, not a fixed time: a slow machine (the claim path
        on a slower CPU) gets its records as long as they keep coming, up to
        ``cap_s`` in all.
        """
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=settings.kafka.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=5,
        )
        await consumer.start()
        seen = 0
        cap = time.monotonic() + cap_s
        deadline = time.monotonic() + timeout_s
        try:
            while seen < n and time.monotonic() < min(deadline, cap):
                batch = await consumer.getmany(timeout_ms=100, max_records=5000)
                now = time.monotonic()
                if batch:
                    deadline = now + timeout_s
                for records in batch.values():
                    for m in records:
                        on(orjson.loads(m.value), now)
                        seen += 1
        finally:
            await consumer.stop()
        return seen
