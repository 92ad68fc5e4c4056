"""Fuzzing the batch path: adversarial batches through ``Processor.on_batch``, no Kafka.

The processor runs with the shipped models (conformal calibration, lookback
classifier, calibrated confidence, the default policy; the claim verifier is
off, as by default) and small limits, so that records near every limit are
cheap. Hypothesis draws batches of valid-shaped events with absurd values,
wrong types, truncated JSON, random bytes, strings at the limits, duplicate
and conflicting events, and tenant headers (tenancy from the event and from a
header), and checks, for every batch and the TTL sweep after it:

* ``on_batch`` and ``on_tick`` never raise;
* every input is finished (``done``) by its batch or held, and every held one is
  finished by the sweep after the TTL; none is finished twice;
* every verdict, claim verdict and report is valid JSON of its contract, with no
  NaN or infinity anywhere in the model it was encoded from; every dead letter
  carries the original bytes and valid ``x-dlq-*`` headers;
* a request gets at most one final verdict.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sidecar.config import Settings, SignalSettings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    ClaimVerdict,
    CoverageReport,
    DeadLetterRecord,
)
from sidecar.pipeline import outputs
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination, Step
from sidecar.pipeline.ports import Policy, SignalSuite
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.runtime import build_coverage, build_policy, build_signals
from tests.conftest import REPO

LIMITS = {
    "max_message_bytes": 4096,
    "max_json_depth": 8,
    "max_hits": 8,
    "max_answer_chars": 300,
    "max_request_bytes": 6000,
}
JOIN = {
    "max_entries": 2,  # evictions within a batch
    "ttl_ms": 1000,
    "max_bytes": 65_536,
}
TOPICS = {k: f"rag.{k.value}" for k in InputKind}
_META = orjson.loads(  # the shipped lookback model's summary shape and generator
    (REPO / "models" / SignalSettings().lookback_model / "metadata.json").read_bytes()
)
GENERATOR = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def shipped() -> tuple[SignalSuite, Policy]:
    """The shipped signals and policy, loaded once (each example gets a fresh processor)."""
    base = Settings.load(models={"dir": str(REPO / "models")})
    return build_signals(base), build_policy(base)


# ------------------------------------------------------------------ strategies

tenants = st.sampled_from(["acme", "evil"])
absurd = st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 65504.0, 1e30, float("nan")])
ids = st.sampled_from(["r1", "r2", "r3", "r1", "r2", "..", ".", "x" * 129, "ok:1", ""])
scores = st.one_of(
    st.floats(-1.0, 1.0), absurd, st.integers(-(2**70), 2**70), st.sampled_from(["0.5", None])
)
ints = st.one_of(
    st.integers(0, 12), st.sampled_from([-1, 1024, 1025, 1_000_000, 2**63, 2**64, 1.5, "3"])
)
texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["a" * (LIMITS["max_answer_chars"] + d) for d in (-1, 0, 1)]),
    st.sampled_from(["The answer is 42. It is certain.", "Mary Shelley wrote it."]),
)


def _attention(fill: str) -> dict[str, Any]:
    shape = (_META["layers"], _META["heads"], _META["chunks"])
    arr = {
        "zeros": np.zeros(shape),
        "max": np.full(shape, 65504.0),
        "min": np.full(shape, -65504.0),
        "ramp": np.linspace(-1.0, 1.0, math.prod(shape)).reshape(shape),
    }[fill].astype("<f2")
    return {
        "layers": shape[0],
        "heads": shape[1],
        "chunks": shape[2],
        "values": base64.b64encode(arr.tobytes()).decode("ascii"),
    }


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    """A stray event of any type: valid-shaped, with absurd values and wrong types."""
    rid = draw(ids)
    kind = draw(st.sampled_from(["retrieval", "retrieval", "delta", "final", "final", "feedback"]))
    obj: dict[str, Any] = {"schema_version": 1, "request_id": rid}
    if kind == "retrieval":
        hits = [
            {"chunk_id": f"c{i}", "doc_id": "d", "score": draw(scores), "text": draw(texts)}
            for i in range(draw(st.integers(0, 10)))
        ]
        obj |= {
            "event_type": "retrieval",
            "tenant": draw(tenants),
            "collection": draw(st.sampled_from(["wiki", "unknown"])),
            "retriever": "qdrant-minilm-l6",
            "query": draw(texts),
            "k": draw(st.one_of(st.just(max(1, len(hits))), ints)),
            "hits": hits,
        }
    elif kind == "delta":
        obj |= {"event_type": "generation.delta", "seq": draw(ints), "text": draw(texts)}
    elif kind == "final":
        obj |= {
            "event_type": "generation.final",
            "answer": draw(texts),
            "generator_model": GENERATOR,
        }
        if draw(st.booleans()):
            obj["mean_token_logprob"] = draw(st.one_of(st.floats(-50.0, 0.0), absurd))
        if draw(st.booleans()):
            obj["attention"] = _attention(draw(st.sampled_from(["zeros", "max", "min", "ramp"])))
            obj["generator_model"] = _META["generator_model"]
    else:
        obj |= {
            "event_type": "feedback",
            "correct": draw(st.one_of(st.booleans(), st.just("yes"))),
            "source": "user",
        }
    match draw(st.integers(0, 19)):
        case 0:  # a wrong type
            field = draw(st.sampled_from(sorted(obj)))
            obj[field] = draw(st.sampled_from([None, [], {}, "x", 7, [[[[[[[[[1]]]]]]]]]]))
        case 1:  # a missing field
            del obj[draw(st.sampled_from(sorted(obj)))]
        case 2:  # an unknown one
            obj["extra"] = 1
        case _:
            pass
    return obj


@st.composite
def requests(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A well-formed request (retrieval, deltas, final) with extreme but valid values."""
    rid = draw(st.sampled_from(["r1", "r2", "r3", "q" * 128]))
    hits = [
        {
            "chunk_id": f"c{i}",
            "doc_id": f"d{i}",
            "score": draw(st.one_of(st.floats(0.0, 1.0), st.sampled_from([5e-324, -0.0]))),
            "text": draw(texts),
        }
        for i in range(draw(st.integers(1, LIMITS["max_hits"])))
    ]
    retrieval = {
        "schema_version": 1,
        "event_type": "retrieval",
        "request_id": rid,
        "tenant": "acme",
        "collection": "wiki",
        "retriever": "qdrant-minilm-l6",
        "query": draw(texts),
        "k": draw(st.sampled_from([len(hits), 1024])),
        "hits": hits,
    }
    pieces = draw(st.lists(st.sampled_from(["The answer ", "is 42. ", "Maybe."]), max_size=3))
    deltas = [
        {
            "schema_version": 1,
            "event_type": "generation.delta",
            "request_id": rid,
            "seq": i,
            "text": piece,
        }
        for i, piece in enumerate(pieces)
    ]
    final: dict[str, Any] = {
        "schema_version": 1,
        "event_type": "generation.final",
        "request_id": rid,
        "answer": draw(st.one_of(st.just("".join(pieces)), texts)),
        "generator_model": GENERATOR,
        "deltas": draw(st.sampled_from([None, len(pieces), 2**62])),
        "mean_token_logprob": draw(st.sampled_from([None, -1e308, -5e-324, 0.0, -1.5])),
    }
    if draw(st.booleans()):
        final["attention"] = _attention(draw(st.sampled_from(["zeros", "max", "min", "ramp"])))
        final["generator_model"] = _META["generator_model"]
    return [retrieval, *deltas, final]


@st.composite
def message(draw: st.DrawFn, obj: dict[str, Any]) -> BatchItem:
    """One input message for ``obj``: its bytes (mostly intact), a key and headers."""
    intact = json.dumps(obj, allow_nan=True).encode()  # NaN, 2**64: not orjson's
    raw: bytes | None = intact
    match draw(st.integers(0, 29)):
        case 0:
            raw = intact[: draw(st.integers(0, len(intact)))]
        case 1:
            raw = draw(st.binary(max_size=64))
        case 2:
            at = draw(st.integers(0, len(intact)))
            raw = intact[:at] + b"\xff\xfe" + intact[at:]
        case 3:
            raw = None
        case 4:  # padded to the message limit - 1, at it, + 1
            pad = LIMITS["max_message_bytes"] - len(intact) + draw(st.integers(-1, 1))
            raw = b" " * pad + intact
        case _:
            pass
    kind = {
        "retrieval": InputKind.RETRIEVAL,
        "feedback": InputKind.FEEDBACK,
    }.get(str(obj.get("event_type")), InputKind.GENERATION)
    if draw(st.integers(0, 29)) == 0:
        kind = draw(st.sampled_from(list(InputKind)))
    rid = obj.get("request_id")
    good = rid.encode("utf-8", "surrogatepass") if isinstance(rid, str) else None
    key = draw(st.sampled_from([good, good, good, good, None, b"\xff"]))
    tenant = draw(st.sampled_from([b"acme", b"acme", b"acme", b"acme", b"evil", b"\xffacme", None]))
    headers: list[tuple[str, bytes]] = []
    if tenant is not None:
        headers.append(("x-tenant", tenant))
    if draw(st.integers(0, 3)) == 0:
        headers.append(("traceparent", draw(st.binary(max_size=60))))
    return kind, raw, key, InputRef(TOPICS[kind], 0, -1, tuple(headers))


@st.composite
def batches(draw: st.DrawFn) -> list[list[BatchItem]]:
    """Whole requests and stray events, shuffled, with repeats, cut into one to three batches."""
    pool = [e for r in draw(st.lists(requests(), min_size=1, max_size=3)) for e in r]
    pool += draw(st.lists(events(), max_size=6))
    sequence = draw(st.permutations(pool)) + draw(st.lists(st.sampled_from(pool), max_size=4))
    items = [draw(message(obj)) for obj in sequence]
    cuts = sorted(draw(st.lists(st.integers(1, len(items)), max_size=2)))
    offsets: Counter[str] = Counter()
    numbered: list[BatchItem] = []
    for kind, raw, key, ref in items:
        numbered.append((kind, raw, key, replace(ref, offset=offsets[ref.topic])))
        offsets[ref.topic] += 1
    bounds = [0, *cuts, len(numbered)]
    return [numbered[a:b] for a, b in itertools.pairwise(bounds) if b > a]


# ------------------------------------------------------------------ invariants


def _floats(value: Any) -> Iterator[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _floats(v)


def _finite_encode(model: BaseModel) -> bytes:
    """``encode``, refusing a model that holds NaN or infinity (JSON would turn it to null)."""
    bad = [f for f in _floats(model.model_dump()) if not math.isfinite(f)]
    assert not bad, f"{type(model).__name__} holds non-finite floats {bad}: {model!r}"
    return orjson.dumps(model.model_dump(mode="json"))


def _check_outputs(step: Step, raw_by_ref: dict[tuple[str, int], bytes | None]) -> None:
    for out in step.outputs:
        match out.destination:
            case Destination.VERDICTS:
                verdict = AnswerVerdict.model_validate_json(out.value)
                event(f"verdict {verdict.reasons[0].code if verdict.reasons else verdict.decision}")
            case Destination.CLAIMS:
                ClaimVerdict.model_validate_json(out.value)
            case Destination.REPORTS:
                CoverageReport.model_validate_json(out.value)
            case Destination.DLQ:
                record = DeadLetterRecord.from_headers(out.headers)
                source = (record.source_topic, record.source_offset)
                assert out.value == (raw_by_ref[source] or b""), record
                event(f"dead letter {record.reason}")


def _final_verdicts(step: Step, header_tenancy: bool) -> Iterator[tuple[tuple[str, str], str]]:
    for out in step.outputs:
        if out.destination is Destination.VERDICTS:
            v = AnswerVerdict.model_validate_json(out.value)
            if v.stage == "final":
                tenant = (v.tenant or "") if header_tenancy else ""
                yield (tenant, v.request_id), v.idempotency_key


@pytest.fixture(scope="module")
def finite_encode() -> Iterator[None]:
    """Every output model is checked for NaN and infinity before it is encoded."""
    with mock.patch.object(outputs, "encode", _finite_encode):
        yield


@functools.cache
def _config(tenancy: str) -> Settings:
    return Settings.load(
        limits=LIMITS,
        join=JOIN,
        tenancy={"source": tenancy},
        models={"dir": str(REPO / "models")},
    )


@pytest.mark.parametrize("tenancy", ["event", "header"])
@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(drawn=batches())
def test_adversarial_batches_keep_the_contract(
    shipped: tuple[SignalSuite, Policy],
    finite_encode: None,
    tenancy: str,
    drawn: list[list[BatchItem]],
) -> None:
    suite, policy = shipped
    config = _config(tenancy)
    processor = Processor(config, policy, signals=replace(suite, coverage=build_coverage(config)))
    raw_by_ref = {(ref.topic, ref.offset): raw for batch in drawn for _, raw, _, ref in batch}
    steps = [processor.on_batch(batch, now_ms=10.0 * i) for i, batch in enumerate(drawn)]
    steps.append(processor.on_tick(10.0 * len(drawn) + JOIN["ttl_ms"] + 1.0))
    assert len(processor.store) == 0, "the sweep after the TTL left requests open"
    # an input not finished by its batch was held: a later batch or the sweep finishes it
    finished = Counter((r.topic, r.offset) for s in steps for r in s.done)
    assert set(finished) == set(raw_by_ref), "an input was never finished"
    assert max(finished.values()) == 1, f"an input was finished twice: {finished}"
    keys: dict[tuple[str, str], list[str]] = {}
    for step in steps:
        _check_outputs(step, raw_by_ref)
        for request, key in _final_verdicts(step, tenancy == "header"):
            keys.setdefault(request, []).append(key)
    twice = {r: k for r, k in keys.items() if len(k) > 1}
    assert not twice, f"more than one final verdict: {twice}"
