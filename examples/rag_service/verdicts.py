"""What the reference service shows for a verdict: its own policy of presentation.

Waiting for the verdict is the kit's job (:class:`guardrail_client.VerdictClient`);
this module only turns the result into the text a user sees in hold mode, and
is pure. From the sidecar: block -> the policy's verified-only text or the
refusal, caveat -> the (rewritten) answer followed by the caveat, allow -> the
answer. No verdict in time (the client's fallback, ``source`` not
``sidecar``): a ``block`` fallback (fail closed) withholds the answer, an
``allow`` fallback (fail open) shows it marked unverified.
"""

from __future__ import annotations

from examples.rag_service.config import ServiceSettings
from guardrail_client import Decision, VerdictResult

__all__ = ["apply_verdict"]


def apply_verdict(answer: str, result: VerdictResult, settings: ServiceSettings) -> str:
    """The text a user sees in hold mode."""
    verdict = result.verdict
    if verdict is None:
        if result.decision is Decision.BLOCK:
            return settings.unverified_text
        return f"{answer}\n\n({settings.unverified_text})"
    if verdict.decision is Decision.BLOCK:
        return verdict.rewritten_answer or settings.refusal_text
    if verdict.decision is Decision.CAVEAT:
        body = verdict.rewritten_answer or answer
        return f"{body}\n\n{verdict.caveat_text or settings.caveat_text}"
    return answer
