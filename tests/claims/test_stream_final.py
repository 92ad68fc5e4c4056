"""The final answer is what gets verified, and a stream that differs from it is surfaced."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

import orjson
import pytest

from sidecar.claims.checker import VerifierClaimChecker, VerifierClaimSession
from sidecar.claims.scorer import ClaimScorer
from sidecar.claims.segment import ClaimSegmenter, segment_claims
from sidecar.claims.sentences import MAX_UNIT_CHARS
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    ClaimsSignal,
    ClaimVerdict,
    Decision,
    GenerationFinal,
    RetrievalEvent,
    RetrievalHit,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.exceptions import LifecycleError
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.ports import SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy.config import load_policy
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.rewrite import remove_unsupported
from tests.claims.conftest import REPO, LexicalVerifier, RetrievalFactory
from tests.conftest import EventFactory, dumps

EVIDENCE = "Paris is the capital of France. Berlin is the capital of Germany."
CERTIFIED = RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=["c0"], m1=True, m2=1.0)
POLICY = REPO / "models" / "policy" / "default.yaml"


def _stream(segmenter: ClaimSegmenter, text: str, step: int = 5) -> list[str]:
    out = []
    for k in range(0, len(text), step):
        out += [c.text for c in segmenter.feed(text[k : k + step])]
    return out


def test_a_different_final_answer_is_segmented_afresh_and_reuses_identical_claims() -> None:
    streamed = "Paris is in France. Rome is in Spain. Berlin is in Germany. "
    final = "Paris is in France. Rome is in Italy. Berlin is in Germany."
    seg = ClaimSegmenter()
    assert _stream(seg, streamed) == [
        "Paris is in France.",
        "Rome is in Spain.",
        "Berlin is in Germany.",
    ]
    tail = seg.finish(final)
    assert seg.mismatch
    # only the sentence the stream did not verify identically is new
    assert [(c.index, c.text) for c in tail] == [(3, "Rome is in Italy.")]
    assert [(c.index, c.text) for c in seg.claims] == [
        (0, "Paris is in France."),
        (3, "Rome is in Italy."),
        (2, "Berlin is in Germany."),
    ]
    assert seg.superseded == (1,)
    for claim in seg.claims:  # spans point into the final answer
        assert final[claim.span[0] : claim.span[1]] == claim.text


def test_identical_sentences_at_other_offsets_keep_their_verdicts_with_new_spans() -> None:
    seg = ClaimSegmenter()
    _stream(seg, "Paris is in France. Berlin is in Germany. ")
    final = "In short, Paris is in France. Berlin is in Germany."
    tail = seg.finish(final)
    # the first sentence changed ("In short, " is skipped, but its characters differ)
    assert seg.mismatch and seg.superseded == (0,)
    assert [c.text for c in tail] == ["Paris is in France."]
    assert [c.index for c in seg.claims] == [2, 1]
    assert final[seg.claims[1].span[0] : seg.claims[1].span[1]] == "Berlin is in Germany."


@pytest.mark.parametrize(
    ("streamed", "final"),
    [
        ("Paris is in France. Berlin is", "Paris is in France. Berlin is in Germany."),
        (
            "Paris is in France. Berlin is in Germany.  \n",
            "Paris is in France. Berlin is in Germany.",
        ),
        ("Paris is in France. ", "Paris is in France. "),
        ("", "Paris is in France."),
    ],
    ids=["continued", "trailing-blanks", "equal", "no-deltas"],
)
def test_a_final_answer_that_extends_the_stream_is_no_mismatch(streamed: str, final: str) -> None:
    seg = ClaimSegmenter()
    first = _stream(seg, streamed)
    tail = [c.text for c in seg.finish(final)]
    assert not seg.mismatch and seg.superseded == ()
    assert first + tail == [c.text for c in segment_claims(final)]


def test_a_final_answer_shorter_than_the_stream_supersedes_what_it_dropped() -> None:
    seg = ClaimSegmenter()
    _stream(seg, "Paris is in France. Rome is in Spain. More")
    assert seg.finish("Paris is in France.") == []
    assert seg.mismatch and seg.superseded == (1,)
    assert [c.index for c in seg.claims] == [0]


ACCENTED = "Renée Müller opened the café in Zürich. It served crème brûlée to Đậu Núñez."


def _nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


@pytest.mark.parametrize(
    ("streamed", "final"),
    [
        (_nfd(ACCENTED) + " ", ACCENTED),  # deltas decomposed (macOS text), final composed
        (ACCENTED + " ", _nfd(ACCENTED)),
        (_nfd(ACCENTED[:45]), ACCENTED),  # ... and the final continues the stream
        (_nfd(ACCENTED).replace("\u0323\u0302", "\u0302\u0323") + " ", ACCENTED),  # marks reordered
    ],
    ids=["nfd-stream", "nfd-final", "nfd-continued", "marks-reordered"],
)
def test_a_final_in_another_unicode_normal_form_is_no_mismatch(streamed: str, final: str) -> None:
    """Deltas decomposed (NFD) by one detokenizer path and a final composed (NFC) by another
    are the same text: the final was flagged stream-final-mismatch, every streamed verdict
    superseded and its claims verified again. The streamed claims now keep their verdicts,
    their spans moved into the final answer; only claims the stream did not hold are new."""
    seg = ClaimSegmenter()
    streamed_claims = []
    for k in range(0, len(streamed), 3):  # every third character: "e" | U+0301 among the cuts
        streamed_claims += seg.feed(streamed[k : k + 3])
    tail = seg.finish(final)
    assert not seg.mismatch and seg.superseded == ()
    assert [c.index for c in seg.claims] == [c.index for c in streamed_claims + tail]
    nfc = unicodedata.normalize("NFC", final)
    assert [unicodedata.normalize("NFC", c.text) for c in seg.claims] == [
        c.text for c in segment_claims(nfc)
    ]
    for claim in seg.claims:  # spans point into the final answer, in the final's form
        assert final[claim.span[0] : claim.span[1]] == claim.text
    if streamed.endswith(" "):  # the stream completed every sentence
        assert tail == []  # nothing to verify again


@pytest.mark.parametrize(
    "final",
    [
        ACCENTED.replace("Zürich", "Zu\u0308rich\u200b"),  # a zero-width space: other text
        ACCENTED.replace("Renée", "Ren\u00e9e\u2060"),  # a word joiner
        ACCENTED.replace("café", "ca\ufb00é"),  # a compatibility ligature (NFKC: "caffé")
        ACCENTED.replace("Zürich.", "Zürich\u00b2."),  # a superscript (NFKC: "Zürich2")
        ACCENTED.replace("Đậu Núñez", "Đậu\u00a0Núñez"),  # a no-break space (NFKC: " ")
    ],
    ids=["zero-width-space", "word-joiner", "ligature", "superscript", "no-break-space"],
)
def test_invisible_characters_and_compatibility_forms_stay_a_mismatch(final: str) -> None:
    """Only canonical equivalence (NFC) is the same text: an invisible character may hide
    text from a reader and a compatibility form (NFKC) may change the meaning ("x²" is not
    "x2"), so the stream a reader saw is not the final verified."""
    seg = ClaimSegmenter()
    _stream(seg, _nfd(ACCENTED) + " ")
    seg.finish(final)
    assert seg.mismatch and seg.superseded


def _session(lexical: LexicalVerifier, retrieval: RetrievalFactory) -> VerifierClaimSession:
    return VerifierClaimChecker(ClaimScorer(lexical)).open(retrieval(EVIDENCE), CERTIFIED)


def test_the_session_verifies_the_final_answer_and_counts_only_its_claims(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    streamed = "Paris is the capital of France. Berlin is the capital of Spain. "
    final = "Paris is the capital of France. Berlin is the capital of Germany."
    session = _session(lexical, retrieval)
    published = session.feed(streamed)
    assert [r.index for r in published] == [0, 1]
    calls_before = len(lexical.calls)
    tail, signal = session.finish(final)
    # one new verifier pair: the identical first sentence is not verified again
    assert len(lexical.calls) == calls_before + 1
    assert [(r.index, r.text) for r in tail] == [(2, "Berlin is the capital of Germany.")]
    assert [r.index for r in session.results] == [0, 2]
    assert [r.index for r in session.superseded] == [1]
    for r in session.results:
        assert final[r.span[0] : r.span[1]] == r.text
    assert signal.stream_mismatch and signal.superseded_claims == [1]
    assert signal.n == 2 and signal.unsupported == 0 and signal.unchecked == 0


def test_no_mismatch_means_no_flag_and_the_same_results(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    session = _session(lexical, retrieval)
    answer = "Paris is the capital of France. Berlin is the capital of Germany."
    session.feed(answer[:40])
    _, signal = session.finish(answer)
    assert not signal.stream_mismatch and signal.superseded_claims == []
    assert [r.index for r in session.results] == [0, 1] and session.superseded == ()
    with pytest.raises(LifecycleError):
        session.finish(answer)


def test_the_rewrite_uses_spans_into_the_final_answer(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    """Streamed spans applied to a different final answer garbled the verified-only text."""
    session = _session(lexical, retrieval)
    session.feed("Lyon is big. Paris is the capital of France. ")
    final = "Paris is the capital of France. Lyon is the capital of 1234 towns."
    _, signal = session.finish(final)
    assert signal.unsupported == 1  # 1234 is not in the evidence: the rule tier
    outcome = PolicyEngine(load_policy(POLICY)).decide(
        retrieval(EVIDENCE),
        GenerationFinal(request_id="req-1", answer=final, generator_model="gen"),
        Signals(retrieval=CERTIFIED, claims=signal),
        claims=session.results,
    )
    assert outcome.decision is not Decision.ALLOW
    assert outcome.rewritten_answer is not None
    assert "Paris is the capital of France." in outcome.rewritten_answer
    assert "1234" not in outcome.rewritten_answer


def test_a_final_in_another_normal_form_cut_into_other_claims_stays_a_mismatch() -> None:
    """A unit is cut at MAX_UNIT_CHARS characters, and decomposed text is longer: the stream
    cut this sentence, the final did not. The streamed claim verdicts that no longer stand
    were published all the same, so the caveat stays."""
    final = "Renée Müller and " * 56 + "José opened the café in Zürich. It is small."
    assert len(final) < MAX_UNIT_CHARS < len(_nfd(final))
    seg = ClaimSegmenter()
    _stream(seg, _nfd(final) + " ", step=50)
    seg.finish(final)
    assert seg.mismatch and seg.superseded


def test_a_final_in_another_normal_form_is_rewritten_with_spans_into_it(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    """The stream's spans index the decomposed deltas; the rewrite cuts the composed final:
    with the streamed spans the verified-only text was cut at the wrong characters."""
    evidence = "Zürich is in Switzerland. Malmö is in Sweden."
    final = "Zürich is in Switzerland. Malmö is in Sweden. Malmö has 1234 bridges."
    session = VerifierClaimChecker(ClaimScorer(lexical)).open(retrieval(evidence), CERTIFIED)
    assert [r.index for r in session.feed(_nfd(final) + "\n")] == [0, 1, 2]
    calls = len(lexical.calls)
    tail, signal = session.finish(final)
    assert tail == [] and len(lexical.calls) == calls  # nothing verified again
    assert not signal.stream_mismatch and signal.superseded_claims == []
    assert signal.n == 3 and signal.unsupported == 1  # 1234 is not in the evidence
    for r in session.results:
        assert final[r.span[0] : r.span[1]] == r.text.rstrip(".") + "."
    assert remove_unsupported(final, session.results) == (
        "Zürich is in Switzerland. Malmö is in Sweden."
    )
    outcome = PolicyEngine(load_policy(POLICY)).decide(
        retrieval(evidence),
        GenerationFinal(request_id="req-1", answer=final, generator_model="gen"),
        Signals(retrieval=CERTIFIED, claims=signal),
        claims=session.results,
    )
    assert "stream-final-mismatch" not in [r.code for r in outcome.reasons]


def _codes_and_decision(signal: ClaimsSignal, profile: str) -> tuple[list[str], Decision]:
    config = load_policy(POLICY).model_copy(update={"default_profile": profile})
    outcome = PolicyEngine(config).decide(
        retrieval_event_for_policy(),
        GenerationFinal(request_id="req-1", answer="Paris is in France.", generator_model="g"),
        Signals(retrieval=CERTIFIED, claims=signal),
        claims=[],
    )
    return [r.code for r in outcome.reasons], outcome.decision


def retrieval_event_for_policy() -> RetrievalEvent:
    return RetrievalEvent(
        request_id="req-1", tenant="acme", collection="docs", query="q", k=1,
        hits=[RetrievalHit(chunk_id="c0", doc_id="d0", score=0.9, text=EVIDENCE)],
    )  # fmt: skip


ALL_SUPPORTED = ClaimsSignal(
    status=SignalStatus.OK,
    n=2,
    supported=2,
    reliability=1.0,
    reliability_level="HIGH",
    hallucination_rate=0.0,
    evidence_scope="trusted",
)


def test_the_policy_turns_the_mismatch_into_a_caveat_reason() -> None:
    codes, decision = _codes_and_decision(ALL_SUPPORTED, "general")
    assert "stream-final-mismatch" not in codes and decision is Decision.ALLOW
    flagged = ALL_SUPPORTED.model_copy(update={"stream_mismatch": True, "superseded_claims": [1]})
    codes, decision = _codes_and_decision(flagged, "general")
    assert "stream-final-mismatch" in codes and decision is Decision.CAVEAT


@pytest.mark.parametrize(("profile", "expected"), [("general", "caveat"), ("medical", "block")])
def test_unchecked_claims_are_a_reason_with_the_profiles_missing_signal_action(
    profile: str, expected: str
) -> None:
    codes, _ = _codes_and_decision(ALL_SUPPORTED, profile)
    assert "claims-over-limit" not in codes
    codes, decision = _codes_and_decision(
        ALL_SUPPORTED.model_copy(update={"unchecked": 7}), profile
    )
    assert "claims-over-limit" in codes
    assert decision.value == expected


@pytest.mark.parametrize(("profile", "expected"), [("general", "caveat"), ("medical", "block")])
def test_unreadable_sentences_are_a_reason_not_nothing_to_check(
    profile: str, expected: str
) -> None:
    codes, decision = _codes_and_decision(
        ALL_SUPPORTED.model_copy(update={"unreadable": 2}), profile
    )
    assert "claims-unreadable" in codes and decision.value == expected
    only_unreadable = ClaimsSignal(status=SignalStatus.OK, unreadable=1, evidence_scope="trusted")
    codes, _ = _codes_and_decision(only_unreadable, profile)
    assert {"claims-unreadable", "claims-none"} <= set(codes)


def test_the_session_reports_unreadable_sentences(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    session = _session(lexical, retrieval)
    answer = "Mary Shelley wrote Frankenstein. Мэри Шелли написала Франкенштейна."
    session.feed(answer)
    _, signal = session.finish(answer)
    assert signal.unreadable == 1 and signal.n == 1


Feed = Callable[[InputKind, bytes], list[tuple[Destination, bytes]]]


def _feeder(lexical: LexicalVerifier, settings_factory: Callable[..., Settings]) -> Feed:
    """One message at a time into a processor with the claim check on (the lexical
    verifier) and the shipped default policy: what it published, in order."""
    suite = SignalSuite(claims=VerifierClaimChecker(ClaimScorer(lexical)))
    p = Processor(settings_factory(), PolicyEngine(load_policy(POLICY)), signals=suite)
    offsets = iter(range(100))

    def feed(kind: InputKind, raw: bytes) -> list[tuple[Destination, bytes]]:
        step = p.on_message(kind, raw, None, InputRef(kind.value, 0, next(offsets)), 0.0)
        return [(o.destination, o.value) for o in step.outputs]

    return feed


def test_the_processor_publishes_the_new_claims_and_the_mismatch(
    lexical: LexicalVerifier,
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    feed = _feeder(lexical, settings_factory)
    feed(InputKind.RETRIEVAL, dumps(retrieval_event()))
    out = feed(
        InputKind.GENERATION,
        dumps(delta_event(seq=0, text="Mary Shelley wrote Frankenstein. It was 1818. ")),
    )
    streamed = [ClaimVerdict.model_validate(orjson.loads(v)) for _, v in out]
    assert [v.claim_index for v in streamed] == [0, 1]
    answer = "Mary Shelley wrote Frankenstein. It was published in 1818."
    out = feed(InputKind.GENERATION, dumps(final_event(answer=answer)))
    claims = [
        ClaimVerdict.model_validate(orjson.loads(v)) for d, v in out if d is Destination.CLAIMS
    ]
    [verdict] = [
        AnswerVerdict.model_validate(orjson.loads(v)) for d, v in out if d is Destination.VERDICTS
    ]
    assert [(c.claim_index, c.text) for c in claims] == [(2, "It was published in 1818.")]
    signal = verdict.signals.claims
    assert signal.stream_mismatch and signal.superseded_claims == [1] and signal.n == 2
    assert "stream-final-mismatch" in [r.code for r in verdict.reasons]
    assert verdict.decision is not Decision.ALLOW


def test_the_processor_keeps_streamed_verdicts_of_a_final_in_another_normal_form(
    lexical: LexicalVerifier,
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Deltas decomposed, "e" and its accent in two deltas; the final composed. The
    published claim verdicts' spans index the deltas' text (what the stream showed); the
    answer verdict reports no mismatch, and nothing is published again."""
    feed = _feeder(lexical, settings_factory)
    feed(InputKind.RETRIEVAL, dumps(retrieval_event()))
    pieces = ["Mary Shelley wrote Frankenstein in Gene", "\u0300ve. It was published in 1818. "]
    out = []
    for seq, piece in enumerate(pieces):
        out += feed(InputKind.GENERATION, dumps(delta_event(seq=seq, text=piece)))
    streamed = [ClaimVerdict.model_validate(orjson.loads(v)) for _, v in out]
    assert [v.claim_index for v in streamed] == [0, 1]
    deltas_text = "".join(pieces)
    assert [deltas_text[v.span[0] : v.span[1]] for v in streamed] == [
        "Mary Shelley wrote Frankenstein in Gene\u0300ve.",
        "It was published in 1818.",
    ]
    answer = "Mary Shelley wrote Frankenstein in Genève. It was published in 1818."
    out = feed(InputKind.GENERATION, dumps(final_event(answer=answer)))
    assert [d for d, _ in out] == [Destination.VERDICTS]
    [verdict] = [AnswerVerdict.model_validate(orjson.loads(v)) for _, v in out]
    signal = verdict.signals.claims
    assert not signal.stream_mismatch and signal.superseded_claims == [] and signal.n == 2
    assert "stream-final-mismatch" not in [r.code for r in verdict.reasons]


def test_an_answer_with_a_code_block_is_judged_on_its_prose_and_says_the_code_is_unchecked(
    lexical: LexicalVerifier,
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Audit: each line of a fenced code block was a claim ("Print(frankenstein)."), found
    in no evidence: under the default policy the answer was blocked
    (claims-hallucination-rate-exceeded) though its prose was all supported."""
    suite = SignalSuite(claims=VerifierClaimChecker(ClaimScorer(lexical)))
    p = Processor(settings_factory(), PolicyEngine(load_policy(POLICY)), signals=suite)
    answer = (
        "Mary Shelley wrote Frankenstein.\n```python\nbook = load('frankenstein')\n"
        "print(book.author)\n```\nFrankenstein is gothic fiction."
    )
    out = []
    for k, (kind, event) in enumerate(
        [
            (InputKind.RETRIEVAL, retrieval_event()),
            (InputKind.GENERATION, delta_event(seq=0, text=answer[:40])),
            (InputKind.GENERATION, delta_event(seq=1, text=answer[40:])),
            (InputKind.GENERATION, final_event(answer=answer)),
        ]
    ):
        step = p.on_message(kind, dumps(event), None, InputRef(kind.value, 0, k), 0.0)
        out += step.outputs
    claims = [ClaimVerdict.model_validate(orjson.loads(o.value)) for o in out[:-1]]
    assert [c.text for c in claims] == [
        "Mary Shelley wrote Frankenstein.",
        "Frankenstein is gothic fiction.",
    ]
    verdict = AnswerVerdict.model_validate(orjson.loads(out[-1].value))
    codes = [r.code for r in verdict.reasons]
    assert verdict.signals.claims.unreadable == 3  # the fence's and the code's lines
    assert "claims-unreadable" in codes and "claims-hallucination-rate-exceeded" not in codes
    assert verdict.decision is Decision.CAVEAT  # enterprise: claims.when_missing
