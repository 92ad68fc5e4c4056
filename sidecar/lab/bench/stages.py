"""Per-stage microbenchmarks, in process: where does a request's time go?"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind, decode_input, encode
from sidecar.lab.bench.e2e import LoadShape, answer_events, percentiles
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.ports import ClaimChecker, Policy, SignalSuite
from sidecar.pipeline.processor import Processor

Events = tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]
Item = tuple[InputKind, bytes, bytes, InputRef]


def request_items(events: Events, rid: str, index: int) -> list[Item]:
    """One request's input messages as the processor takes them (``rid`` replaces the id).

    Offsets are distinct per message: request ``index`` owns a block of
    generation offsets (its deltas, then its final event).
    """
    retrieval, deltas, final = events
    key = rid.encode()
    block = len(deltas) + 1

    def encoded(event: dict[str, Any]) -> bytes:
        return orjson.dumps({**event, "request_id": rid})

    items: list[Item] = [(InputKind.RETRIEVAL, encoded(retrieval), key, InputRef("r", 0, index))]
    items += [
        (InputKind.GENERATION, encoded(d), key, InputRef("g", 0, block * index + k))
        for k, d in enumerate(deltas)
    ]
    items.append(
        (InputKind.GENERATION, encoded(final), key, InputRef("g", 0, block * index + block - 1))
    )
    return items


@contextlib.contextmanager
def as_served(settings: Settings) -> Iterator[None]:
    """Inside it, what is loaded now (models, calibrations, imports) is out of the cyclic
    garbage collector's reach, as ``guardrail run`` puts it (``GUARDRAIL_GC_FREEZE``,
    ``runtime.freeze_startup_objects``), and the young generation is walked as it is there
    (``GUARDRAIL_GC_YOUNG_THRESHOLD``); given back after. Timed without it, every full
    collection walked the loaded models: the in-process stages and the profile came out
    ~8 % dearer than serving (helper-71: 0.92x frozen / not, the whole processor)."""
    from sidecar.runtime import (  # noqa: PLC0415 - the serving path's
        collect_as_served,
        collect_young_after,
    )

    young = collect_as_served(settings)
    try:
        yield
    finally:
        if settings.gc_freeze:
            gc.unfreeze()
        collect_young_after(young)


def _time(fn: Callable[[], Any], n: int) -> dict[str, float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
    out = percentiles(samples)
    return {f"{k}_us": v for k, v in out.items()}


def run_claim_stages(
    checker: ClaimChecker, n: int = 100, shape: LoadShape | None = None
) -> dict[str, Any]:
    """The claim path's stages: segmentation, evidence selection, the verifier per claim.

    ``verifier_single_claim``: one claim per verifier call (a sentence completed
    alone); ``verifier_batched_per_claim``: all of an answer's claims in one
    call, divided by their number. Both include evidence selection and the rule
    tier (``ClaimScorer.check``); ``evidence_select`` alone is also shown.
    ``windows_per_claim``: evidence windows each claim is scored against (the
    artifact's ``evidence_max_windows`` at most); ``verifier_batched_per_window``:
    the batched time divided by the number of (claim, window) pairs.
    """
    from sidecar.claims.checker import VerifierClaimChecker, evidence_chunks  # noqa: PLC0415
    from sidecar.claims.context import with_context  # noqa: PLC0415
    from sidecar.claims.segment import ClaimSegmenter  # noqa: PLC0415
    from sidecar.contracts.events import RetrievalEvent, RetrievalSignal, SignalStatus  # noqa: PLC0415

    if not isinstance(checker, VerifierClaimChecker):
        return {}
    shape = shape or LoadShape(k=5, deltas=5, claims=5, attention=None)
    r, deltas, final = answer_events("stage-claims", shape)
    texts = [d["text"] for d in deltas]

    def segment() -> list[Any]:
        seg = ClaimSegmenter()
        out = [c for t in texts for c in seg.feed(t)]
        return out + seg.finish(final["answer"])

    claims = segment()
    retrieval = RetrievalEvent.model_validate(r)
    trusted = RetrievalSignal(
        status=SignalStatus.OK, trusted_chunk_ids=[h.chunk_id for h in retrieval.hits]
    )
    chunks, _ = evidence_chunks(retrieval, trusted)
    scorer = checker.scorer
    index = scorer.index(chunks)
    per_answer = _time(lambda: scorer.check(claims, index, retrieval.query), n)
    windows = [
        len(index.windows(c.text, with_context(retrieval.query, c.context),
                          max_windows=scorer.max_windows, max_chars=scorer.max_chars))
        if scorer.max_windows > 1
        else 1
        for c in claims
    ]  # fmt: skip
    pairs = max(1, sum(windows))
    return {
        "claims_per_answer": len(claims),
        "windows_per_claim": round(pairs / max(1, len(claims)), 2),
        "verifier_batched_per_window": {k: round(v / pairs, 2) for k, v in per_answer.items()},
        "claim_segmentation_per_answer": _time(segment, n),
        "evidence_select": _time(lambda: index.select(claims[0].text), n),
        "verifier_single_claim": _time(lambda: scorer.check(claims[:1], index, retrieval.query), n),
        "verifier_batched_per_claim": {
            k: round(v / max(1, len(claims)), 2) for k, v in per_answer.items()
        },
    }


def run_stages(
    settings: Settings,
    policy: Policy,
    signals: SignalSuite,
    n: int = 2000,
    shape: LoadShape | None = None,
) -> dict[str, Any]:
    shape = shape or LoadShape()
    r, ds, f = answer_events("stage-0", shape)
    raw_r, raw_f = orjson.dumps(r), orjson.dumps(f)
    limits = {
        "max_bytes": settings.limits.max_message_bytes,
        "max_depth": settings.limits.max_json_depth,
    }
    results: dict[str, Any] = {
        "decode_retrieval": _time(lambda: decode_input(InputKind.RETRIEVAL, raw_r, **limits), n),
        "decode_final": _time(lambda: decode_input(InputKind.GENERATION, raw_f, **limits), n),
    }
    retrieval = decode_input(InputKind.RETRIEVAL, raw_r, **limits)
    final = decode_input(InputKind.GENERATION, raw_f, **limits)
    if signals.certifier is not None:
        certifier = signals.certifier
        results["certify"] = _time(lambda: certifier.certify(retrieval), n)  # type: ignore[arg-type]
    if signals.lookback is not None and final.event_type == "generation.final":
        scorer = signals.lookback
        cert = signals.certifier.certify(retrieval) if signals.certifier is not None else None  # type: ignore[arg-type]
        from sidecar.pipeline.ports import NOT_CONFIGURED_RETRIEVAL  # noqa: PLC0415

        c = cert or NOT_CONFIGURED_RETRIEVAL
        results["lookback_single"] = _time(lambda: scorer.score(final, c), n)
        batch = [(final, c)] * 32
        per_batch = _time(lambda: scorer.score_batch(batch), max(50, n // 32))
        results["lookback_batched_per_answer"] = {k: round(v / 32, 2) for k, v in per_batch.items()}
    counter = iter(range(10**9))

    def whole_request() -> None:
        i = next(counter)
        for kind, value, key, ref in request_items((r, ds, f), f"stage-{i}", i):
            processor.on_message(kind, value, key, ref, 0.0)

    processor = Processor(settings, policy, signals=signals)
    with as_served(settings):
        results["whole_request_processor"] = _time(whole_request, max(200, n // 4))
    from sidecar.contracts.events import Signals  # noqa: PLC0415

    assert retrieval.event_type == "retrieval" and final.event_type == "generation.final"  # noqa: S101
    results["policy"] = _time(lambda: policy.decide(retrieval, final, Signals()), n)
    er, _, ef = answer_events("stage-encode", shape)
    processor.on_message(InputKind.RETRIEVAL, orjson.dumps(er), None, InputRef("r", 1, 0), 0.0)
    step = processor.on_message(
        InputKind.GENERATION, orjson.dumps(ef), None, InputRef("g", 1, 0), 0.0
    )
    verdict_bytes = step.outputs[-1].value
    from sidecar.contracts.events import AnswerVerdict  # noqa: PLC0415

    verdict = AnswerVerdict.model_validate(orjson.loads(verdict_bytes))
    results["verdict_encode"] = _time(lambda: encode(verdict), n)
    return results
