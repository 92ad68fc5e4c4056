"""The bench's floors: the sidecar's loop with a constant verdict (JSON read or not, or a
dict-level sketch of deciding), and raw aiokafka.

Each runs as its own process, like the sidecar (``python -m
sidecar.lab.bench.floors noop|parse|dict|native|raw``, configured by the same ``GUARDRAIL_*``
environment, ``/readyz`` on ``GUARDRAIL_HTTP__PORT``), and answer every
``generation.final`` record with one verdict keyed by its request id:

* ``noop``: the serving loop itself (``runtime.serve``: FastStream subscriber,
  the pipelined producer, offset tracking, the commit cut, the ticker) with the
  processor replaced by :class:`ConstantVerdictProcessor`. What the sidecar
  would do if deciding cost nothing: the floor of ``fast_drain_vs_noop``.
* ``raw``: aiokafka alone, consume -> produce -> commit, no FastStream, no
  tracking: the floor of ``noop_vs_raw_client`` (what FastStream and the
  project's loop cost per record).
* ``parse``: the ``noop`` loop whose processor also reads every record's JSON
  into Python objects (``orjson.loads``, the fastest parser the project has) and
  takes the request id from the final event's ``request_id``
  (:class:`ParsingVerdictProcessor`), deciding nothing: ``parse_vs_noop`` bounds
  what any processor that builds Python objects from its inputs can reach.
* ``dict``: the ``noop`` loop whose processor is
  :class:`~sidecar.lab.bench.dict_floor.DictFloor` (:class:`DictVerdictProcessor`):
  the inputs read, checked and joined as plain dicts, scored by the served models in
  one call a batch, and a verdict of the sidecar's shape encoded per request. What a
  fast path rewritten on plain dicts could reach at best: the floor of such a rewrite.
* ``native``: the ``dict`` floor's sketch compiled outside the interpreter
  (:class:`~sidecar.lab.bench.native_floor.NativeFloor`, Rust; ``make native-floor``
  builds it), served the same way: what deciding in native code could reach at best.

``noop`` and ``raw`` tell requests apart without decoding JSON (the final event's
``event_type`` bytes, the record key as request id): they measure the loop, not
the parser.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from sidecar import __version__
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AnswerVerdict, Decision, Reason
from sidecar.health import HealthServer
from sidecar.kafka.clients import producer_size_args
from sidecar.kafka.publish import request_size_bytes
from sidecar.kafka.security import aiokafka_client_args
from sidecar.pipeline.outputs import Destination, Output, Step
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.policy import PlaceholderPolicy

if TYPE_CHECKING:  # the sketches import the models' code: only their floors load them
    from sidecar.lab.bench.dict_floor import DictFloor
    from sidecar.lab.bench.native_floor import NativeFloor

__all__ = [
    "ConstantVerdictProcessor",
    "DictVerdictProcessor",
    "ParsingVerdictProcessor",
    "constant_verdict",
    "is_final",
    "main",
]

log = logging.getLogger("sidecar.bench.floors")

FINAL_MARKER = b'"event_type":"generation.final"'
NOOP_POLICY = "bench-noop/0"
_GENERATION, _RETRIEVAL = InputKind.GENERATION, InputKind.RETRIEVAL  # as the processor reads them


def is_final(raw: bytes | None) -> bool:
    """A ``generation.final`` event, as compact JSON writers (orjson, the bench) emit it."""
    return raw is not None and FINAL_MARKER in raw


class _VerdictTemplate:
    """One verdict, built and validated once; stamped with a request id and a time.
    ``fields``: another verdict's JSON fields instead of the floors' constant one."""

    def __init__(self, fields: dict[str, Any] | None = None) -> None:
        if fields is not None:
            self._fields = fields
            return
        verdict = AnswerVerdict(
            request_id="template",
            idempotency_key="bench-noop",
            decision=Decision.ALLOW,
            reasons=[Reason(code="bench.noop", message="constant verdict (bench floor)")],
            policy=NOOP_POLICY,
            produced_at=datetime.now(UTC),
            sidecar_version=__version__,
        )
        self._fields = verdict.model_dump(mode="json")

    def encode(self, request_id: str) -> bytes:
        produced_at = datetime.now(UTC).isoformat()
        return orjson.dumps({**self._fields, "request_id": request_id, "produced_at": produced_at})


def constant_verdict(request_id: str) -> bytes:
    """The floors' verdict for ``request_id`` (a valid ``AnswerVerdict``; tests read it)."""
    return _VerdictTemplate().encode(request_id)


class ConstantVerdictProcessor(Processor):
    """A ``Processor`` that decides nothing: every final event gets the same verdict.

    Every input is finished by the step it arrives in (there is nothing to join),
    so commits move exactly as the sidecar's do once a request is decided.
    """

    def __init__(self, settings: Settings, verdict: dict[str, Any] | None = None) -> None:
        """``verdict``: the JSON fields of the verdict to stamp (default: the floors'
        constant one; ``bench/sized_noop.py`` gives the sidecar's own)."""
        super().__init__(settings, PlaceholderPolicy())
        self._template = _VerdictTemplate(verdict)

    def on_batch(self, items: Sequence[BatchItem], now_ms: float) -> Step:
        """Every record is accepted and counted as the sidecar counts it, once per batch
        (``guardrail.consumer.records``): the floor pays for the same counter."""
        del now_ms
        step = Step()
        retrieval = feedback = 0
        answer = self._answer
        for kind, raw, key, ref in items:
            if kind is not _GENERATION:
                if kind is _RETRIEVAL:
                    retrieval += 1
                else:
                    feedback += 1
            out = answer(kind, raw, key)
            if out is not None:
                step.outputs.append(out)
                self.counters.verdicts += 1
            step.done.append(ref)
        self.counters.consumed += len(items)
        self.counters.inputs.batch(retrieval, len(items) - retrieval - feedback, feedback)
        return step

    def on_part(
        self, items: Sequence[BatchItem], start: int, now_ms: float, budget_ns: int | None
    ) -> tuple[Step, int]:
        """The rest of the batch in one part (``on_batch``): a floor's batch is quick."""
        del budget_ns
        return self.on_batch(items if start == 0 else items[start:], now_ms), len(items)

    def _answer(self, kind: InputKind, raw: bytes | None, key: bytes | None) -> Output | None:
        """The verdict for a keyed final event, told by its bytes (no JSON read)."""
        if kind is not _GENERATION or key is None or not is_final(raw):
            return None
        request_id = key.decode("utf-8", errors="replace")
        return Output(Destination.VERDICTS, key, self._template.encode(request_id), [])


class ParsingVerdictProcessor(ConstantVerdictProcessor):
    """The constant verdict, after reading every record's JSON into Python objects.

    What a processor that decided nothing would cost if it still parsed its inputs
    as any Python processor must before it can look at them: one ``orjson.loads``
    per record, the request id read from the final event. A record that does not
    parse is finished without a verdict (the floor does not dead-letter).
    """

    def _answer(self, kind: InputKind, raw: bytes | None, key: bytes | None) -> Output | None:
        del key  # the request id comes from the JSON, as the sidecar reads it
        if raw is None:
            return None
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if (
            kind is not _GENERATION
            or type(event) is not dict
            or event.get("event_type") != "generation.final"
        ):
            return None
        request_id = str(event.get("request_id"))
        value = self._template.encode(request_id)
        return Output(Destination.VERDICTS, request_id.encode(), value, [])


class DictVerdictProcessor(ConstantVerdictProcessor):
    """Verdicts from :class:`~sidecar.lab.bench.dict_floor.DictFloor`, the served models'.

    Every input is finished by the step it arrives in, as the other floors' are (the
    sketch's join holds no offsets back); a record the sketch refuses gets no verdict.
    """

    def __init__(self, settings: Settings, floor: DictFloor | NativeFloor) -> None:
        super().__init__(settings)
        self._floor = floor

    def on_batch(self, items: Sequence[BatchItem], now_ms: float) -> Step:
        del now_ms
        kinds = [kind for kind, _raw, _key, _ref in items]
        retrieval, generation = kinds.count(_RETRIEVAL), kinds.count(_GENERATION)
        verdicts = self._floor.on_batch(items)
        step = Step(
            outputs=[Output(Destination.VERDICTS, key, value, []) for _r, key, value in verdicts],
            done=[ref for _k, _raw, _key, ref in items],
        )
        self.counters.verdicts += len(verdicts)
        self.counters.consumed += len(items)
        self.counters.inputs.batch(retrieval, generation, len(items) - retrieval - generation)
        return step


async def raw_loop(settings: Settings, stop: asyncio.Event, assigned: list[bool]) -> int:
    """aiokafka only: getmany -> send a verdict per final -> await them -> commit.

    Commits at the sidecar's cadence (every ``join.sweep_interval_ms``, after the
    verdicts of everything consumed so far are confirmed), not after every
    fetch. Returns how many verdicts it published. ``assigned[0]`` turns true
    once the group has given this consumer partitions (for ``/readyz``).
    """
    kafka, topics = settings.kafka, settings.topics
    client = aiokafka_client_args(kafka)
    consumer = AIOKafkaConsumer(
        topics.retrieval,
        topics.generation,
        **client,
        group_id=kafka.group_id,
        enable_auto_commit=False,
        auto_offset_reset=kafka.auto_offset_reset,
        session_timeout_ms=kafka.session_timeout_ms,
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
        max_partition_fetch_bytes=kafka.max_partition_fetch_bytes,
    )
    producer = AIOKafkaProducer(  # sized as the sidecar's
        **client,
        acks="all",
        enable_idempotence=True,
        **producer_size_args(kafka, request_size_bytes(topics.max_message_bytes)),
    )
    template = _VerdictTemplate()
    published = 0
    interval_s = settings.join.sweep_interval_ms / 1000.0
    loop = asyncio.get_running_loop()
    next_commit = loop.time() + interval_s
    offsets: dict[TopicPartition, int] = {}
    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(
                timeout_ms=kafka.batch_timeout_ms or 100, max_records=kafka.max_poll_records
            )
            assigned[0] = bool(consumer.assignment())
            if not batch:
                continue
            futures = [
                await producer.send(topics.verdicts, template.encode(m.key.decode()), key=m.key)
                for records in batch.values()
                for m in records
                if m.key is not None and is_final(m.value)
            ]
            await asyncio.gather(*futures)
            published += len(futures)
            offsets.update({tp: records[-1].offset + 1 for tp, records in batch.items()})
            if loop.time() >= next_commit:
                await consumer.commit(offsets)
                offsets, next_commit = {}, loop.time() + interval_s
        if offsets:
            await consumer.commit(offsets)
    finally:
        await producer.stop()
        await consumer.stop()
    return published


async def _serve_raw(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    assigned = [False]
    health = HealthServer(
        settings.http.host, settings.http.port, lambda: {"partitions_assigned": assigned[0]}
    )
    await health.start()
    try:
        published = await raw_loop(settings, stop, assigned)
    finally:
        await health.stop()
    log.info("raw loop stopped after %d verdicts", published)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sidecar.lab.bench.floors noop|parse|dict|native|raw``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in (["noop"], ["parse"], ["dict"], ["native"], ["raw"]):
        sys.stderr.write("usage: python -m sidecar.lab.bench.floors noop|parse|dict|native|raw\n")
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    for noisy in ("aiokafka", "faststream", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = Settings.load()
    if args == ["raw"]:
        asyncio.run(_serve_raw(settings))
        return 0
    from sidecar import runtime  # noqa: PLC0415 - the serving loop, only for these floors

    processor: Processor
    if args == ["dict"]:
        from sidecar.lab.bench.dict_floor import DictFloor  # noqa: PLC0415 - its floor only

        floor = DictFloor(runtime.build_processor(settings))
        processor = DictVerdictProcessor(settings, floor)
    elif args == ["native"]:
        from sidecar.lab.bench.native_floor import NativeFloor  # noqa: PLC0415 - its floor only

        native = NativeFloor(runtime.build_processor(settings))
        processor = DictVerdictProcessor(settings, native)
    elif args == ["parse"]:
        processor = ParsingVerdictProcessor(settings)
    else:
        processor = ConstantVerdictProcessor(settings)
    asyncio.run(runtime.serve(settings, processor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
