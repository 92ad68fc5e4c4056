"""A streaming request's claim session counts against the byte budgets (its evidence index).

With claims on, a session holds an evidence index for as long as the answer
streams; before, no budget counted it (a ~1 MB retrieval added 37.6 MB of heap).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import RetrievalEvent, RetrievalSignal, SignalStatus
from sidecar.contracts.verdicts import AnswerVerdict
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination, Step
from sidecar.pipeline.ports import SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory
from tests.fakes import ThresholdCertifier
from tests.pipeline.test_intake_limits import verdicts
from tests.pipeline.test_signal_wiring import PickyLookback, SentenceSession

R, G = InputKind.RETRIEVAL, InputKind.GENERATION
SENTENCE = "Mary Shelley wrote it. "


@dataclass
class HeavyChecker:
    """Sessions that hold ``index_bytes`` each, like a real evidence index."""

    index_bytes: int
    version: str = "sentences/1"

    def open(self, retrieval: RetrievalEvent, certification: RetrievalSignal) -> SentenceSession:
        del retrieval
        return SentenceSession(list(certification.trusted_chunk_ids), held_bytes=self.index_bytes)


def _processor(settings: Settings, index_bytes: int) -> Processor:
    suite = SignalSuite(
        certifier=ThresholdCertifier(),
        lookback=PickyLookback(),
        claims=HeavyChecker(index_bytes),
    )
    return Processor(settings, PlaceholderPolicy(), signals=suite)


def _feed(
    p: Processor, kind: InputKind, event: dict[str, object], offset: int, tenant: str = ""
) -> Step:
    """One event at ``offset`` of its topic (``tenant``: the trusted x-tenant header)."""
    headers = (("x-tenant", tenant.encode()),) if tenant else ()
    ref = InputRef("r" if kind is R else "g", 0, offset, headers)
    return p.on_message(kind, orjson.dumps(event), None, ref, 0.0)


def _open_stream(
    p: Processor,
    request_id: str,
    offset: int,
    retrieval: EventFactory,
    delta: EventFactory,
    tenant: str = "",
) -> Step:
    """The request's retrieval, then a delta completing one claim; the delta's step."""
    event = retrieval(request_id, tenant=tenant) if tenant else retrieval(request_id)
    _feed(p, R, event, offset, tenant)
    return _feed(p, G, delta(request_id, seq=0, text=SENTENCE), offset, tenant)


def test_a_streaming_session_is_counted_in_the_join_budget_and_evicts_older_requests(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
) -> None:
    settings = settings_factory(join={"max_bytes": 1_000_000})
    p = _processor(settings, index_bytes=400_000)
    _open_stream(p, "a", 0, retrieval_event, delta_event)
    entry = p.store.get("a")
    assert entry is not None and entry.claims_bytes == 400_000
    assert entry.bytes_held > 400_000 and p.store.bytes_held == entry.bytes_held
    _open_stream(p, "b", 1, retrieval_event, delta_event)
    assert len(p.store) == 2
    # the third session (opened as its retrieval arrives) does not fit beside the two:
    # the oldest request is decided incomplete
    step = _feed(p, R, retrieval_event("c"), 2)
    decided = verdicts(step)
    assert [(v.request_id, v.reasons[0].code) for v in decided] == [("a", "incomplete")]
    assert p.store.get("a") is None and p.store.bytes_held <= 1_000_000


def test_a_session_beyond_the_request_budget_is_not_kept_and_claims_are_unavailable(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_factory(limits={"max_request_bytes": 64_000})
    p = _processor(settings, index_bytes=70_000)
    _open_stream(p, "a", 0, retrieval_event, delta_event)
    entry = p.store.get("a")
    assert entry is not None and entry.claims is None and entry.claims_refused
    assert entry.bytes_held < 64_000  # nothing counted for a session not kept
    assert p.scoring.claims_refused == 1
    step = _feed(p, G, final_event("a", answer=SENTENCE, generator_model="gen-a"), 1)
    [out] = step.outputs
    verdict = AnswerVerdict.model_validate(orjson.loads(out.value))
    assert verdict.signals.claims.status is SignalStatus.UNAVAILABLE
    assert p.counters.claim_verdicts == 0


def test_an_index_that_fits_leaves_the_request_limit_to_its_events(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """A large retrieval's index does not make the final that follows it too large: the
    outcome must not depend on which topic's event came first."""
    settings = settings_factory(limits={"max_request_bytes": 64_000})
    p = _processor(settings, index_bytes=63_500)
    _open_stream(p, "a", 0, retrieval_event, delta_event)
    entry = p.store.get("a")
    assert entry is not None and entry.claims is not None
    assert entry.bytes_held + 400 > 64_000  # events + index + the final cross the limit
    step = _feed(p, G, final_event("a", answer=SENTENCE, generator_model="gen-a"), 1)
    [out] = [o for o in step.outputs if o.destination is Destination.VERDICTS]
    verdict = AnswerVerdict.model_validate(orjson.loads(out.value))
    assert verdict.signals.claims.status is SignalStatus.OK
    assert p.counters.dead_letters == 0


def test_a_session_that_fits_is_kept(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
) -> None:
    settings = settings_factory(limits={"max_request_bytes": 64_000})
    p = _processor(settings, index_bytes=10_000)
    _open_stream(p, "a", 0, retrieval_event, delta_event)
    entry = p.store.get("a")
    assert entry is not None and entry.claims is not None and not entry.claims_refused
    assert entry.claims_bytes == 10_000 and p.counters.claim_verdicts == 1


def test_another_tenants_events_never_repeat_a_requests_claim_keys(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
) -> None:
    """With header tenancy a tenant can send events under another's request id: its claim
    verdicts (same id, same claim text) must not carry the victim's idempotency keys, or a
    consumer de-duplicating by key drops the victim's real verdict."""
    settings = settings_factory(tenancy={"source": "header", "header": "x-tenant"})
    p = _processor(settings, index_bytes=0)
    keys: dict[str, list[bytes]] = {}
    for offset, tenant in enumerate(("acme", "evil")):
        step = _open_stream(p, "req-1", offset, retrieval_event, delta_event, tenant)
        keys[tenant] = [
            dict(o.headers)["x-idempotency-key"]
            for o in step.outputs
            if o.destination is Destination.CLAIMS
        ]
    assert len(keys["acme"]) == len(keys["evil"]) == 1
    assert keys["acme"] != keys["evil"]
    # a replay of the same request repeats its key
    replay = _processor(settings, index_bytes=0)
    step = _open_stream(replay, "req-1", 0, retrieval_event, delta_event, "acme")
    assert [dict(o.headers)["x-idempotency-key"] for o in step.outputs] == keys["acme"]
