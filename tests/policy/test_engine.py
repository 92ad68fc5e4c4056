"""Decisions per risk profile, rewrites, refusals, missing signals and strict mode."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson
import pytest

from sidecar.claims.scores import summarise
from sidecar.claims.segment import segment_claims
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    ClaimLabel,
    ClaimsSignal,
    Decision,
    GenerationFinal,
    LookbackSignal,
    RetrievalEvent,
    RetrievalHit,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.ports import ClaimResult, PolicyOutcome
from sidecar.pipeline.processor import Processor
from sidecar.policy.config import ConfidenceRules, load_policy
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.rewrite import remove_unsupported, verified_only
from tests.conftest import EventFactory, dumps

REPO = Path(__file__).resolve().parents[2]

DEFAULT = Path(__file__).resolve().parents[2] / "models" / "policy" / "default.yaml"
S, U, C = ClaimLabel.SUPPORTED, ClaimLabel.UNSUPPORTED, ClaimLabel.UNCERTAIN

# Seed 001's worked example: the metformin answer and its verification results.
METFORMIN = (
    "Metformin works by activating AMPK to reduce hepatic glucose output. "
    "It typically reduces HbA1c by 1.5%. The standard starting dose is 500mg twice daily. "
    "The maximum dose is 2000mg/day. It should be avoided in patients with eGFR < 30."
)
METFORMIN_LABELS = [S, S, U, U, U]


@pytest.fixture(scope="module")
def engine() -> PolicyEngine:
    return PolicyEngine(load_policy(DEFAULT))


def retrieval(tenant: str = "acme") -> RetrievalEvent:
    hit = RetrievalHit(chunk_id="c1", doc_id="d1", score=0.8, text="context")
    return RetrievalEvent(
        request_id="r", tenant=tenant, collection="docs", query="q", k=1, hits=[hit]
    )


def final(answer: str) -> GenerationFinal:
    return GenerationFinal(request_id="r", answer=answer, generator_model="gen")


def results(answer: str, labels: Sequence[ClaimLabel]) -> list[ClaimResult]:
    claims = segment_claims(answer)
    assert len(claims) == len(labels), [c.text for c in claims]
    return [
        ClaimResult(c.index, c.span, c.text, label, 0.9 if label is S else 0.1, ("c1",))
        for c, label in zip(claims, labels, strict=True)
    ]


CERTIFIED = RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=["c1"], m1=True, m2=1.0)
FACTUAL = LookbackSignal(status=SignalStatus.OK, p_factual=0.9)


def signals(
    labels: Sequence[ClaimLabel],
    *,
    retrieval_signal: RetrievalSignal = CERTIFIED,
    lookback: LookbackSignal = FACTUAL,
    scope: str = "trusted",
) -> Signals:
    claims = summarise(labels, "trusted" if scope == "trusted" else "all-retrieved")
    return Signals(retrieval=retrieval_signal, lookback=lookback, claims=claims)


def decide(
    engine: PolicyEngine,
    tenant: str,
    answer: str,
    labels: Sequence[ClaimLabel],
    *,
    retrieval_signal: RetrievalSignal = CERTIFIED,
    lookback: LookbackSignal = FACTUAL,
    scope: str = "trusted",
    confidence: float | None = 0.9,
) -> tuple[Decision, list[str], PolicyOutcome]:
    outcome = engine.decide(
        retrieval(tenant),
        final(answer),
        signals(labels, retrieval_signal=retrieval_signal, lookback=lookback, scope=scope),
        claims=results(answer, labels),
        confidence=confidence,
    )
    return outcome.decision, [r.code for r in outcome.reasons], outcome


@pytest.fixture(scope="module")
def tenant_engine() -> PolicyEngine:
    config = load_policy(DEFAULT)
    tenants = {"clinic": "medical", "corp": "enterprise", "web": "general"}
    return PolicyEngine(config.model_copy(update={"tenants": tenants}))


@pytest.mark.parametrize(
    ("tenant", "confidence", "expected", "code"),
    [
        ("clinic", 0.10, Decision.BLOCK, "confidence-very-low"),
        ("clinic", 0.50, Decision.CAVEAT, "confidence-low"),
        ("clinic", None, Decision.CAVEAT, "confidence-not-configured"),
        ("corp", 0.05, Decision.BLOCK, "confidence-very-low"),
        ("corp", 0.25, Decision.CAVEAT, "confidence-low"),
        ("corp", None, Decision.ALLOW, "confidence-not-configured"),
        ("web", 0.01, Decision.CAVEAT, "confidence-low"),
    ],
)
def test_calibrated_confidence_thresholds_per_profile(
    tenant_engine: PolicyEngine,
    tenant: str,
    confidence: float | None,
    expected: Decision,
    code: str,
) -> None:
    answer = "Metformin activates AMPK. It reduces HbA1c by 1.5%."
    decision, codes, _ = decide(tenant_engine, tenant, answer, [S, S], confidence=confidence)
    assert decision is expected, codes
    assert code in codes


def test_confidence_above_the_thresholds_adds_no_reason(tenant_engine: PolicyEngine) -> None:
    answer = "Metformin activates AMPK."
    for tenant in ("clinic", "corp", "web"):
        _, codes, _ = decide(tenant_engine, tenant, answer, [S], confidence=0.61)
        assert not [c for c in codes if c.startswith("confidence")], (tenant, codes)


def test_a_profile_without_confidence_thresholds_ignores_it() -> None:
    config = load_policy(DEFAULT)
    plain = config.profiles["general"].model_copy(update={"confidence": ConfidenceRules()})
    engine = PolicyEngine(
        config.model_copy(
            update={"profiles": {**config.profiles, "general": plain}, "default_profile": "general"}
        )
    )
    _, codes, _ = decide(engine, "anyone", "Metformin activates AMPK.", [S], confidence=None)
    assert not [c for c in codes if c.startswith("confidence")], codes


def test_confidence_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="block_below"):
        ConfidenceRules(block_below=0.5, caveat_below=0.2)


def test_all_supported_is_allowed_in_every_profile(tenant_engine: PolicyEngine) -> None:
    answer = "Metformin activates AMPK. It reduces HbA1c by 1.5%."
    for tenant, profile in (("clinic", "medical"), ("corp", "enterprise"), ("web", "general")):
        decision, codes, outcome = decide(tenant_engine, tenant, answer, [S, S])
        assert decision is Decision.ALLOW, (profile, codes)
        assert codes[0] == f"profile.{profile}" and "claims-reliability-high" in codes
        assert outcome.rewritten_answer is None and outcome.caveat_text is None


def test_seed001_worked_example_blocks_with_the_verified_facts(
    tenant_engine: PolicyEngine,
) -> None:
    decision, codes, outcome = decide(tenant_engine, "clinic", METFORMIN, METFORMIN_LABELS)
    assert decision is Decision.BLOCK
    assert "claims-reliability-low" in codes and "claims-hallucination-rate-exceeded" in codes
    assert "answer-verified-only" in codes and outcome.escalate
    assert outcome.rewritten_answer == (
        "Based on the retrieved context, the following can be confirmed:\n"
        "• Metformin works by activating AMPK to reduce hepatic glucose output.\n"
        "• It typically reduces HbA1c by 1.5%.\n\n"
        "Additional information could not be verified from the available context."
    )
    assert outcome.caveat_text == "Answer limited to context-verified claims."


ONE_IN_FOUR = (
    "Paris is the capital of France. The Seine flows through Paris. "
    "The Louvre is a museum. The Eiffel Tower was built in 1850."
)


@pytest.mark.parametrize(
    ("tenant", "decision", "code"),
    [
        ("clinic", Decision.BLOCK, "strict-unsupported-claim"),  # 0.25 > 0.05 and strict
        ("corp", Decision.BLOCK, "claims-hallucination-rate-exceeded"),  # 0.25 > 0.20
        ("web", Decision.CAVEAT, "claims-reliability-medium"),  # 0.25 <= 0.30, 0.75 MEDIUM
    ],
)
def test_one_unsupported_claim_in_four_per_profile(
    tenant_engine: PolicyEngine, tenant: str, decision: Decision, code: str
) -> None:
    got, codes, _ = decide(tenant_engine, tenant, ONE_IN_FOUR, [S, S, S, U])
    assert got is decision and code in codes


def test_caveat_rewrites_the_answer_without_unsupported_claims(
    tenant_engine: PolicyEngine,
) -> None:
    _, codes, outcome = decide(tenant_engine, "web", ONE_IN_FOUR, [S, S, S, U])
    assert outcome.rewritten_answer == (
        "Paris is the capital of France. The Seine flows through Paris. The Louvre is a museum."
    )
    assert (outcome.caveat_text or "").startswith("Note: Some claims in the original answer")
    assert "escalate" not in codes


def test_nothing_verified_is_refused(tenant_engine: PolicyEngine) -> None:
    decision, codes, outcome = decide(tenant_engine, "corp", ONE_IN_FOUR, [U, U, C, U])
    assert decision is Decision.BLOCK and "answer-refused" in codes
    assert (outcome.rewritten_answer or "").startswith(
        "The retrieved context does not contain sufficient information"
    )


def test_missing_signals_are_explicit_reasons(tenant_engine: PolicyEngine) -> None:
    answer = "Paris is the capital of France."
    missing = LookbackSignal(status=SignalStatus.NOT_CONFIGURED)
    decision, codes, _ = decide(tenant_engine, "corp", answer, [S], lookback=missing)
    assert decision is Decision.ALLOW and "lookback-not-configured" in codes  # allow, but said
    decision, codes, _ = decide(tenant_engine, "clinic", answer, [S], lookback=missing)
    assert decision is Decision.CAVEAT and "lookback-not-configured" in codes
    unavailable = LookbackSignal(status=SignalStatus.UNAVAILABLE)
    _, codes, _ = decide(tenant_engine, "clinic", answer, [S], lookback=unavailable)
    assert "lookback-unavailable" in codes
    outcome = tenant_engine.decide(
        retrieval("clinic"),
        final(answer),
        Signals(
            retrieval=CERTIFIED,
            lookback=FACTUAL,
            claims=ClaimsSignal(status=SignalStatus.UNAVAILABLE),
        ),
    )
    assert outcome.decision is Decision.BLOCK  # medical: claims.when_missing = block
    assert "claims-unavailable" in [r.code for r in outcome.reasons]
    assert (outcome.rewritten_answer or "").startswith("The retrieved context does not")


def test_lookback_thresholds(tenant_engine: PolicyEngine) -> None:
    answer = "Paris is the capital of France."
    low = LookbackSignal(status=SignalStatus.OK, p_factual=0.3)
    decision, codes, _ = decide(tenant_engine, "corp", answer, [S], lookback=low)
    assert decision is Decision.CAVEAT and "lookback-low" in codes
    very_low = LookbackSignal(status=SignalStatus.OK, p_factual=0.05)
    decision, codes, outcome = decide(tenant_engine, "corp", answer, [S], lookback=very_low)
    assert decision is Decision.BLOCK and "lookback-very-low" in codes
    # the claim is verified against trusted chunks: it survives as a verified fact
    assert "• Paris is the capital of France." in (outcome.rewritten_answer or "")


def test_no_trusted_chunk(tenant_engine: PolicyEngine) -> None:
    answer = "Paris is the capital of France."
    none = RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=[], m1=False, m2=0.0)
    decision, codes, _ = decide(
        tenant_engine, "clinic", answer, [S], retrieval_signal=none, scope="all-retrieved"
    )
    assert decision is Decision.BLOCK and "retrieval-no-trusted-chunk" in codes
    assert "claims-evidence-untrusted" in codes
    # medical: claims verified against untrusted chunks are not offered as facts
    assert "answer-refused" in codes
    decision, codes, _ = decide(
        tenant_engine, "web", answer, [S], retrieval_signal=none, scope="all-retrieved"
    )
    assert decision is Decision.CAVEAT


def test_an_answer_without_claims_is_not_silently_fine(tenant_engine: PolicyEngine) -> None:
    outcome = tenant_engine.decide(retrieval("corp"), final("Is it safe?"), signals([]), claims=[])
    assert outcome.decision is Decision.CAVEAT
    assert "claims-none" in [r.code for r in outcome.reasons]


def test_without_per_claim_results_there_is_no_rewrite(tenant_engine: PolicyEngine) -> None:
    outcome = tenant_engine.decide(retrieval("web"), final(ONE_IN_FOUR), signals([S, S, S, U]))
    assert outcome.decision is Decision.CAVEAT and outcome.rewritten_answer is None
    assert "claims-detail-unavailable" in [r.code for r in outcome.reasons]


def test_strict_mode_blocks_mid_stream(tenant_engine: PolicyEngine) -> None:
    streamed = results(ONE_IN_FOUR, [S, S, S, U])
    clinic = retrieval("clinic")
    assert tenant_engine.check_stream(clinic, streamed[:3], CERTIFIED) is None
    outcome = tenant_engine.check_stream(clinic, streamed, CERTIFIED)
    assert outcome is not None and outcome.decision is Decision.BLOCK
    assert [r.code for r in outcome.reasons] == ["profile.medical", "strict-unsupported-claim"]
    assert outcome.escalate
    assert "• The Louvre is a museum." in (outcome.rewritten_answer or "")
    # without certified chunks the medical profile offers no "verified" facts
    uncertified = tenant_engine.check_stream(clinic, streamed, None)
    assert uncertified is not None
    assert (uncertified.rewritten_answer or "").startswith("The retrieved context does not")
    assert tenant_engine.check_stream(retrieval("corp"), streamed, CERTIFIED) is None


def test_remove_unsupported_keeps_structure() -> None:
    answer = (
        "Overview:\n"
        "- Aspirin reduces fever and is effective for mild pain.\n"
        "- The dose is 500mg.\n"
        "Is it safe? Aspirin inhibits COX enzymes."
    )
    claims = results(answer, [S, U, U, S])
    assert remove_unsupported(answer, claims) == (
        "Overview:\n- Aspirin reduces fever.\nIs it safe? Aspirin inhibits COX enzymes."
    )
    assert remove_unsupported(answer, results(answer, [S, S, S, S])) == answer


def test_verified_only_or_refusal() -> None:
    claims = results(ONE_IN_FOUR, [S, U, C, U])
    text, ok = verified_only(claims, "Intro:", "Outro.", "No.")
    assert ok and text == "Intro:\n• Paris is the capital of France.\n\nOutro."
    assert verified_only(results(ONE_IN_FOUR, [U, U, C, U]), "I", "O", "No.") == ("No.", False)


def test_the_policy_fingerprint_tells_two_files_with_one_version_apart(
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Two replicas on policy files that differ in one threshold, both ``version: "1"``,
    decided 55 requests allow and 93 caveat, with identical policy names and model
    versions in their verdicts (helper-14); ``model_versions["policy"]`` now differs."""
    shipped = REPO / "models" / "policy" / "default.yaml"
    text = shipped.read_text(encoding="utf-8")
    assert "caveat_below: 0.5" in text
    edited = tmp_path / "edited.yaml"
    edited.write_text(text.replace("caveat_below: 0.5", "caveat_below: 0.45", 1), "utf-8")
    search = [shipped.parent]
    a = PolicyEngine.from_file(shipped, search=search)
    b = PolicyEngine.from_file(edited, search=search)
    assert a.name == b.name
    assert a.fingerprint != b.fingerprint
    assert a.fingerprint.startswith(f"{a.name}@")
    assert PolicyEngine.from_file(shipped, search=search).fingerprint == a.fingerprint
    processor = Processor(settings_factory(), a)
    ref = InputRef("r", 0, 0)
    processor.on_message(InputKind.RETRIEVAL, dumps(retrieval_event("req-f")), None, ref, 0.0)
    step = processor.on_message(
        InputKind.GENERATION, dumps(final_event("req-f")), None, InputRef("g", 0, 0), 0.0
    )
    [out] = [o for o in step.outputs if o.destination is Destination.VERDICTS]
    assert orjson.loads(out.value)["model_versions"]["policy"] == a.fingerprint


@pytest.mark.parametrize("newline", ["\r\n", "\r", "\u2028"])
def test_remove_unsupported_keeps_the_answers_line_ends(newline: str) -> None:
    """The rewrite trimmed each "\\n"-line with ``rstrip()``, which also ate the "\\r" of a
    CRLF answer (and spaces before a lone "\\r" or U+2028 stayed): a Windows-style answer
    came back with "\\n" line ends. Only the spaces a dropped sentence left go now."""
    answer = newline.join(
        ["Overview:", "- Aspirin reduces fever.", "- The dose is 500mg.", "Aspirin inhibits COX."]
    )
    claims = results(answer, [S, U, S])
    expected = newline.join(["Overview:", "- Aspirin reduces fever.", "Aspirin inhibits COX."])
    assert remove_unsupported(answer, claims) == expected
    spaced = newline.join(
        ["Overview:", "- Aspirin reduces fever. The dose is 500mg.  ", "Aspirin inhibits COX."]
    )
    got = remove_unsupported(spaced, results(spaced, [S, U, S]))
    assert got == expected


def test_remove_unsupported_takes_linear_time_on_a_long_run_of_spaces() -> None:
    """The line-end trim was a regex (spaces, then a line end ahead), which backtracked over
    a run of spaces from each of its characters: an answer with 20,000 spaces in a kept
    sentence took 8 s on the worker (40,000: 34 s; a 1 MiB answer, hours), the processor
    held while the watchdog counted. Split at the line ends, it is one pass (~1 ms)."""
    first = "Paris is in Germany."
    answer = f"{first} Lyon{' ' * 20_000}is big.\n  - Lyon is a city.  \r\nEnd."
    claims = [ClaimResult(0, (0, len(first)), first, U, 0.1)]
    started = time.perf_counter()
    got = remove_unsupported(answer, claims)
    elapsed = time.perf_counter() - started
    assert got == f"Lyon{' ' * 20_000}is big.\n  - Lyon is a city.\r\nEnd."
    assert elapsed < 1.0, f"{elapsed:.2f} s for 20,000 spaces"
