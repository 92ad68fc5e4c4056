"""The processor's outputs for a fixed recorded input stay what they were.

A speed-up of the fast path must not change what the sidecar publishes. A fixed
batch sequence (requests with and without attention summaries, in both arrival
orders, a request that arrives across two batches, an identical re-send, a
malformed record, a label, trace headers, a half-request the TTL sweep decides)
runs through the processor with the shipped models, a fixed wall clock and a
stopped stage clock; every output (destination, key, headers, the verdict's
document, its trace's name, parent, attributes, stage names), the finished
inputs of each step and the counters are compared with
``data/recorded_outputs.json``, recorded from the processor before it was made
faster.

Every value is compared exactly except floats, which are compared to 1e-9
relative: the lookback classifier (ONNX) and the confidence model (numpy) may
round the last bits differently on another CPU (see ``sidecar/golden.py``).
The key order of every JSON object is compared too (the verdict's bytes are
the contract). To record again after an intended change of behaviour:
``python -m tests.pipeline.test_recorded_outputs``.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
import pytest

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AttentionSummary
from sidecar.lab.chaos.corpus import delta, final, retrieval
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Step
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.runtime import build_policy, build_signals
from tests.conftest import REPO
from tests.jsonclose import same_json

RECORDED = REPO / "tests" / "pipeline" / "data" / "recorded_outputs.json"
WALL = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
STAGE_NS = 10**15  # the stage clock stands still: timings are 0, whatever reads it
GENERATOR = "HuggingFaceTB/SmolLM2-135M-Instruct@Q4_1"
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _events(i: int) -> list[tuple[InputKind, dict[str, Any]]]:
    """Request ``i``: retrieval, two deltas, final (every third without attention)."""
    rid = f"rec-{i}"
    rng = random.Random(i)
    r = retrieval(rid, k=3, rng=rng)
    sentences = [f"The value {j} of {rid} is {1000 + rng.randrange(9000)}. " for j in range(2)]
    extra: dict[str, Any] = {"generator_model": GENERATOR}
    if i % 3:
        values = np.random.default_rng(i).uniform(0.0, 1.0, size=(30, 9, 3))
        extra["attention"] = AttentionSummary.from_array(values).model_dump()
    return [
        (InputKind.RETRIEVAL, r),
        (InputKind.GENERATION, delta(rid, 0, sentences[0])),
        (InputKind.GENERATION, delta(rid, 1, sentences[1])),
        (InputKind.GENERATION, final(rid, "".join(sentences), **extra)),
    ]


def recorded_batches() -> list[list[BatchItem]]:
    """The fixed input: four batches, then a TTL sweep (``run``)."""
    offsets = {InputKind.RETRIEVAL: itertools.count(), InputKind.GENERATION: itertools.count()}
    offsets[InputKind.FEEDBACK] = itertools.count()

    def item(
        kind: InputKind, event: dict[str, Any], headers: tuple[tuple[str, bytes], ...] = ()
    ) -> BatchItem:
        raw = orjson.dumps(event)
        ref = InputRef(kind.value, 0, next(offsets[kind]), headers, timestamp_ms=1_700_000_000_000)
        return (kind, raw, event["request_id"].encode(), ref)

    first: list[BatchItem] = []
    for i in range(6):  # whole requests, retrieval first; odd ones traced
        headers = (("traceparent", TRACEPARENT),) if i % 2 else ()
        first += [item(kind, event, headers) for kind, event in _events(i)]
    second = [item(kind, event) for kind, event in _events(6)[1:]]  # generation first
    second.append(item(*_events(6)[0]))
    split = _events(7)
    second += [item(kind, event) for kind, event in split[:2]]  # the rest comes next batch
    third = [item(kind, event) for kind, event in split[2:]]
    third.append(item(*_events(0)[3]))  # an identical re-send of a decided final
    bad = (InputKind.GENERATION, b'{"schema_version":1,"event_type":"generation.final"', b"x")
    third.append((*bad, InputRef("generation", 0, next(offsets[InputKind.GENERATION]))))
    label = {
        "schema_version": 1,
        "event_type": "feedback",
        "request_id": "rec-1",
        "correct": True,
        "source": "reviewer",
    }
    third.append(item(InputKind.FEEDBACK, label))
    fourth = [item(kind, event) for kind, event in _events(8)[:1]]  # a half-request
    fourth += [item(kind, event) for kind, event in _events(9)]
    return [first, second, third, fourth]


def _value(value: bytes) -> Any:
    """A JSON document as read; a dead letter's original bytes as text."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return {"bytes": value.decode("utf-8", "replace")}


def _step(step: Step) -> dict[str, Any]:
    outputs = []
    for out in step.outputs:
        trace = out.trace
        outputs.append(
            {
                "destination": out.destination.value,
                "key": None if out.key is None else out.key.decode(),
                "headers": [[name, value.decode()] for name, value in out.headers],
                "value": _value(out.value),
                "trace": None
                if trace is None
                else {
                    "name": trace.name,
                    "parent": [[k, v.decode()] for k, v in trace.parent],
                    "attributes": trace.attributes,
                    "stages": [name for name, _, _ in trace.stages],
                    "answered_ns": trace.answered_ns,
                    "links": [[[k, v.decode()] for k, v in h] for h in trace.links],
                },
            }
        )
    done = [[ref.topic, ref.partition, ref.offset] for ref in step.done]
    return {"outputs": outputs, "done": done}


def run() -> dict[str, Any]:
    """The processor's steps for :func:`recorded_batches`, then a sweep past the TTL."""
    settings = Settings.load(models={"dir": str(REPO / "models")})
    signals, policy = build_signals(settings), build_policy(settings)
    processor = Processor(
        settings, policy, signals=signals, wall_clock=lambda: WALL, clock_ns=lambda: STAGE_NS
    )
    steps = [
        _step(processor.on_batch(batch, 1000.0 * n))
        for n, batch in enumerate(recorded_batches(), start=1)
    ]
    steps.append(_step(processor.on_tick(10.0**9)))
    counters = dataclasses.asdict(processor.counters)
    counters["inputs"] = sorted([*key, n] for key, n in processor.counters.inputs.counts().items())
    signals.close()
    return {"steps": steps, "counters": counters}


@pytest.fixture(scope="module")
def outputs() -> dict[str, Any]:
    read: dict[str, Any] = orjson.loads(orjson.dumps(run()))  # as JSON, like the recording
    return read


def test_the_recorded_input_covers_every_kind_of_output(outputs: dict[str, Any]) -> None:
    """Not vacuous: verdicts of each decision path, a dead letter, incompletes, a trace."""
    published = [o for step in outputs["steps"] for o in step["outputs"]]
    kinds = {o["destination"] for o in published}
    assert {"verdicts", "dlq"} <= kinds
    verdicts = [o["value"] for o in published if o["destination"] == "verdicts"]
    assert len(verdicts) == 10  # 10 requests, one of them half: incomplete at the sweep
    assert any("incomplete" in [r["code"] for r in v["reasons"]] for v in verdicts)
    assert any(v["signals"]["lookback"]["status"] == "ok" for v in verdicts)
    assert any(v["signals"]["lookback"]["status"] != "ok" for v in verdicts)
    assert any(o["trace"] and o["trace"]["parent"] for o in published)
    counters = outputs["counters"]
    assert counters["feedback"] == 1 and counters["dead_letter_reasons"] == {
        "after-final": 1,  # the decided final, sent again
        "malformed-json": 1,
    }


def test_the_outputs_for_the_recorded_input_are_unchanged(outputs: dict[str, Any]) -> None:
    same_json(outputs, orjson.loads(RECORDED.read_bytes()), "outputs")


if __name__ == "__main__":  # record again (after an intended change of behaviour)
    RECORDED.parent.mkdir(parents=True, exist_ok=True)
    RECORDED.write_bytes(orjson.dumps(run(), option=orjson.OPT_INDENT_2) + b"\n")
