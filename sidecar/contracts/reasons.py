"""Every reason code a verdict can carry, with what it means: the catalogue a consumer of
``rag.verdicts`` reads (it is the ``Reason.code`` description of the published schema).

A consumer matches on codes, never on messages. New codes may come within
schema_version 1: treat a code it does not know as information, and take the
decision from ``decision``, never from the codes.
"""

from __future__ import annotations

from typing import Final

PROFILE_REASON_PREFIX: Final = "profile."
"""``profile.<name>``: the risk profile of the policy that decided (its own reason)."""

REASON_CODES: Final[dict[str, str]] = {
    # the pipeline (signal "pipeline")
    "incomplete": "block: the request never completed (join TTL, evicted for room, too many "
    "records read after it, or a half of it was dead-lettered); the message names what is "
    "missing",
    "internal-error": "block, escalate: the sidecar could not decide this answer",
    # the policy itself (signal "policy")
    "profile.<name>": "the risk profile that decided; first on every decided verdict",
    "checks-passed": "no signal found anything",
    "escalate": "a human should look (escalate is true)",
    "answer-verified-only": "block: rewritten_answer holds only the claims verified "
    "against the retrieved context",
    "answer-refused": "block: nothing was verified; rewritten_answer is the refusal text",
    "claims-detail-unavailable": "unsupported claims, but no per-claim results: no rewrite",
    "no-signals-configured": "the placeholder policy (tests, bench floors; never `guardrail "
    "run`): caveat",
    # retrieval certification (signal "retrieval")
    "retrieval-not-configured": "no retrieval calibration is served",
    "retrieval-unavailable": "the retrieval signal could not be computed for this request",
    "retrieval-scores-rising": "the retriever's scores rise down its hit list (distances): "
    "nothing is certified",
    "retrieval-not-certifiable": "no conformal threshold exists at this alpha (k > n)",
    "retrieval-no-trusted-chunk": "no retrieved chunk passed the threshold (m1 = false)",
    "retrieval-low-trusted-fraction": "m2 is below the profile's min_trusted_fraction",
    "retrieval-calibration-fallback": "no calibration for this key: the global one was used "
    "(information; see signals.retrieval.fallback_reason)",
    "exchangeability-broken": "the rolling mean of m1 is significantly below 1 - alpha: "
    "recalibrate",
    # lookback-ratio factuality (signal "lookback")
    "lookback-not-configured": "no lookback model is served",
    "lookback-unavailable": "no lookback score for this answer (e.g. no attention summary)",
    "lookback-very-low": "p_factual below the profile's block_below",
    "lookback-low": "p_factual below the profile's caveat_below",
    # claim verification (signal "claims")
    "claims-not-configured": "claim verification is off (GUARDRAIL_SIGNALS__CLAIMS)",
    "claims-unavailable": "the claims could not be verified for this request",
    "claims-evidence-untrusted": "claims were checked against all retrieved chunks (none trusted)",
    "stream-final-mismatch": "the final answer is not the streamed text; the final answer "
    "was verified (signals.claims.superseded_claims)",
    "claims-over-limit": "claims past the per-answer limit were not verified "
    "(signals.claims.unchecked)",
    "claims-unreadable": "sentences in a script the checker does not read, or code lines, "
    "were not verified (signals.claims.unreadable)",
    "claims-none": "the answer holds no checkable claim",
    "claims-hallucination-rate-exceeded": "block: the hallucination rate is above the "
    "profile's max_hallucination_rate",
    "claims-reliability-high": "reliability tier HIGH",
    "claims-reliability-medium": "reliability tier MEDIUM",
    "claims-reliability-low": "reliability tier LOW",
    "claims-unsupported-present": "caveat: at least one claim is unsupported",
    "strict-unsupported-claim": "block: a strict profile and an unsupported claim (also the "
    "reason of a stage=stream verdict)",
    # calibrated confidence and certified allow (signal "confidence")
    "confidence-not-configured": "the profile reads the calibrated confidence and no "
    "confidence model is served",
    "confidence-unavailable": "the profile reads the calibrated confidence and the served "
    "model gave none for this answer (it failed, or its value was not finite)",
    "confidence-very-low": "confidence below the profile's block_below",
    "confidence-low": "confidence below the profile's caveat_below",
    "certified-allow": "confidence at or above the certified threshold (certified_risk, "
    "certified_delta, certificate); the message ends 'overruled: ...' when another reason "
    "decided",
    "confidence-below-certified": "confidence below the certified threshold: the profile's "
    "allow.below action",
    "certificate-no-confidence": "no confidence for this answer: it cannot be certified",
    "certificate-key-mismatch": "the certificate is for another calibration key",
    "certificate-not-applicable": "the certificate does not apply to the signals served",
    "certificate-violated": "the certificate failed its online re-test (or was withdrawn "
    "for the fleet)",
}


def reason_code_description() -> str:
    """``Reason.code``'s description in the published schema: the catalogue, one per line."""
    lines = [
        "Machine-readable reason; match on it, never on message. New codes may come within "
        "schema_version 1: treat an unknown code as information (the decision is "
        "`decision`). Codes:"
    ]
    lines += [f"`{code}`: {meaning}" for code, meaning in REASON_CODES.items()]
    return "\n".join(lines)
