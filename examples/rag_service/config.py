"""The reference service's settings: one frozen pydantic-settings model (``RAG_SERVICE_*``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from guardrail_client import OnTimeout


class ServiceSettings(BaseSettings):
    """Where the service listens, which topics it uses, and what it says on each verdict."""

    model_config = SettingsConfigDict(env_prefix="RAG_SERVICE_", frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    bootstrap_servers: str = "127.0.0.1:9092"
    retrieval_topic: str = "rag.retrieval"
    generation_topic: str = "rag.generation"
    verdict_topic: str = "rag.verdicts"
    verdict_timeout_ms: int = Field(default=20_000, ge=1, le=600_000)
    fail_open: bool = Field(
        default=False,
        description="hold mode, no verdict in time: true shows the answer marked unverified, "
        "false shows the unverified text instead of the answer (the VerdictClient's "
        "on_timeout: allow / block)",
    )
    tenant: str = "default"
    collection: str = "nq-open"
    retriever: str = "qdrant-minilm-l6"
    k: int = Field(default=3, ge=1, le=32)
    refusal_text: str = (
        "I cannot answer this reliably from the retrieved documents, so I will not guess."
    )
    caveat_text: str = "Note: parts of this answer could not be verified against the sources."
    unverified_text: str = (
        "The answer could not be checked in time (no guardrail verdict); it is withheld."
    )

    @property
    def on_timeout(self) -> OnTimeout:
        """``fail_open`` as the kit's ``VerdictClient(on_timeout=...)``."""
        return "allow" if self.fail_open else "block"
