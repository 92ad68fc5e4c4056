"""The LLM service's side of the guardrail: publish a request's events, wait for its verdict.

Depends on aiokafka, pydantic and the sidecar's contracts only (never the
sidecar's serving modules, FastStream, onnxruntime or torch)::

    async with GuardrailPublisher(BOOTSTRAP, generator_model="my-llm") as pub, \\
            VerdictClient(BOOTSTRAP, on_timeout="allow") as verdicts:
        verdicts.expect(rid)  # kept for this replica, whatever the fleet's traffic
        await pub.retrieval(rid, query, hits, tenant="acme", collection="wiki")
        await pub.final(rid, answer)
        result = await verdicts.verdict(rid, timeout=2.0)

``SyncGuardrailPublisher`` and ``SyncVerdictClient`` take the same arguments and make the
same calls, blocking only the calling thread, for threaded services.

``calm_kafka_logs()`` (opt-in: the client touches no logger unless asked) puts aiokafka's
ERROR lines for what it retries (a broker restarting, a bootstrap server down) at WARNING.

``guardrail_client.hf.LookbackRecorder`` (needs torch + transformers, imported
only from that module) records the attention summary of a Hugging Face model.
"""

from guardrail_client.events import EventBuilder, OutgoingRecord, SidecarLimits, trace_headers
from guardrail_client.exceptions import (
    ClientAlreadyStartedError,
    ClientBrokerError,
    ClientError,
    ClientNotStartedError,
    InvalidArgumentError,
    InvalidEventError,
    PartitionerWarning,
    VerdictTimeoutError,
)
from guardrail_client.keys import partition_for, request_key
from guardrail_client.publisher import GuardrailPublisher, PublisherStats
from guardrail_client.sync import SyncGuardrailPublisher
from guardrail_client.sync_verdicts import SyncVerdictClient
from guardrail_client.verdicts import OnTimeout, Source, VerdictClient, VerdictResult
from sidecar.contracts.events import (
    AnswerVerdict,
    AttentionSummary,
    ClaimVerdict,
    Decision,
    RetrievalHit,
)
from sidecar.kafka_logs import calm_kafka_logs

__all__ = [
    "AnswerVerdict",
    "AttentionSummary",
    "ClaimVerdict",
    "ClientAlreadyStartedError",
    "ClientBrokerError",
    "ClientError",
    "ClientNotStartedError",
    "Decision",
    "EventBuilder",
    "GuardrailPublisher",
    "InvalidArgumentError",
    "InvalidEventError",
    "OnTimeout",
    "OutgoingRecord",
    "PartitionerWarning",
    "PublisherStats",
    "RetrievalHit",
    "SidecarLimits",
    "Source",
    "SyncGuardrailPublisher",
    "SyncVerdictClient",
    "VerdictClient",
    "VerdictResult",
    "VerdictTimeoutError",
    "calm_kafka_logs",
    "partition_for",
    "request_key",
    "trace_headers",
]
