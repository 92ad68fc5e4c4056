"""Generate ``schemas/``: one JSON Schema per event, an AsyncAPI 3.0 document, and the
JSON Schema of the decision policy's document.

Consumers in other languages read these; ``guardrail schemas check`` (and a
test) fails when they drift from the pydantic models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from sidecar import __version__
from sidecar.config import TopicSettings
from sidecar.contracts.events import (
    SCHEMA_VERSION,
    AnswerVerdict,
    CertificateWithdrawal,
    ClaimVerdict,
    CoverageReport,
    DeadLetterRecord,
    FeedbackEvent,
    GenerationDelta,
    GenerationFinal,
    RetrievalEvent,
)

MODELS: dict[str, type[BaseModel]] = {
    "retrieval": RetrievalEvent,
    "generation.delta": GenerationDelta,
    "generation.final": GenerationFinal,
    "claim.verdict": ClaimVerdict,
    "answer.verdict": AnswerVerdict,
    "dead-letter": DeadLetterRecord,
    "feedback": FeedbackEvent,
    "coverage.report": CoverageReport,
    "certificate.withdrawn": CertificateWithdrawal,
}


def _dump(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"


def json_schema(name: str, model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"urn:guardrail-sidecar:schema:{name}:v{SCHEMA_VERSION}"
    return schema


def policy_schema() -> dict[str, Any]:
    """The decision policy's YAML document (every field, its range and default): a reference
    for policy authors, and what an editor validates a policy against."""
    from sidecar.policy.config import PolicyConfig  # noqa: PLC0415 - not an event contract

    schema = PolicyConfig.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "urn:guardrail-sidecar:schema:policy:v1"
    return schema


# What every producer of the input topics must do: the sidecar's group assignment puts
# partition p of every input topic on one member, which joins a request only if its
# events landed on the same partition number of each topic.
INPUT_PARTITIONING = (
    "Key every record with its request_id (its UTF-8 bytes) and partition with Kafka's "
    "default murmur2 partitioner (murmur2 of the key modulo the partition count, as the "
    "Java client, aiokafka, franz-go and KafkaJS 2 do); the input topics (retrieval, "
    "generation, feedback) must have equal partition counts. Clients whose default differs "
    "send a request's events to other partition numbers: librdkafka-based ones "
    "(confluent-kafka, kcat, node-rdkafka, confluent-kafka-go, .NET) default to "
    "`consistent_random` (CRC32): set `partitioner=murmur2_random`; segmentio/kafka-go "
    "defaults to round-robin: set `Balancer: &kafka.Murmur2Balancer{}`; Sarama hashes with "
    "FNV-1a: give `NewCustomHashPartitioner` a murmur2 hasher; KafkaJS 1 needs "
    "`Partitioners.JavaCompatiblePartitioner`. A record off its murmur2 partition is "
    "rerouted by the sidecar (sent, keyed, to that partition of its topic, with an "
    "x-guardrail-rerouted-from header; GUARDRAIL_JOIN__REROUTE), a produce and a fetch "
    "later, and counted in guardrail.join.rerouted."
)


def asyncapi() -> dict[str, Any]:
    topics = TopicSettings()
    ref = {name: {"$ref": f"./{name}.schema.json"} for name in MODELS}
    by_request = {
        "type": "string",
        "description": "request_id (the input topics are co-partitioned by it: murmur2)",
    }
    # reports and withdrawals are per calibration key (pipeline/outputs.py), not per request
    by_calibration_key = {
        "type": "string",
        "description": "calibration_key: the key of the window reported or of the "
        "certificate withdrawn (rag.certificates is compacted by it)",
    }

    def message(name: str, title: str, key: dict[str, str] = by_request) -> dict[str, Any]:
        return {
            "name": name,
            "title": title,
            "contentType": "application/json",
            "payload": ref[name],
            "bindings": {"kafka": {"key": key}},
        }

    channels = {
        "retrieval": {
            "address": topics.retrieval,
            "description": INPUT_PARTITIONING,
            "messages": {"retrieval": message("retrieval", "Retrieved chunks with raw scores")},
        },
        "generation": {
            "address": topics.generation,
            "description": INPUT_PARTITIONING,
            "messages": {
                "delta": message("generation.delta", "A streamed piece of the answer"),
                "final": message(
                    "generation.final", "The whole answer, optional attention summary"
                ),
            },
        },
        "claims": {
            "address": topics.claims,
            "messages": {
                "claimVerdict": message("claim.verdict", "One claim's verdict, mid-stream")
            },
        },
        "verdicts": {
            "address": topics.verdicts,
            "description": "Keyed by request id. Each replica also reads its tail back at "
            "start, and a partition's requests when it is newly assigned one, without a "
            "consumer group (the warm start: the exchangeability monitor's windows, and the "
            "requests feedback labels name).",
            "messages": {
                "answerVerdict": message("answer.verdict", "allow / caveat / block for one answer")
            },
        },
        "feedback": {
            "address": topics.feedback,
            "description": INPUT_PARTITIONING,
            "messages": {
                "feedback": message("feedback", "Whether an answered request was correct")
            },
        },
        "reports": {
            "address": topics.reports,
            "messages": {
                "coverageReport": message(
                    "coverage.report",
                    "Fleet coverage bound per calibration key (periodic)",
                    by_calibration_key,
                )
            },
        },
        "certificates": {
            "address": topics.certificates,
            "description": "Compacted, keyed by calibration key: the latest withdrawal of the "
            "key's certified allow, or a tombstone (reinstated). Every replica whose policy "
            "certifies an allow reads it from its start before serving, and writes it.",
            "messages": {
                "certificateWithdrawn": message(
                    "certificate.withdrawn",
                    "An allow certificate withdrawn for the fleet",
                    by_calibration_key,
                )
            },
        },
        "dlq": {
            "address": topics.dlq,
            "messages": {
                "deadLetter": {
                    "name": "dead-letter",
                    "title": "The original bytes; the error in x-dlq-* headers",
                    "payload": {"type": "string", "format": "binary"},
                    "headers": {
                        "type": "object",
                        "description": "x-dlq-<field> for each field of the record",
                        "x-record": ref["dead-letter"],
                    },
                }
            },
        },
    }

    def op(action: str, channel: str) -> dict[str, Any]:
        return {"action": action, "channel": {"$ref": f"#/channels/{channel}"}}

    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "RAG guardrail sidecar",
            "version": __version__,
            "description": "Events the LLM service writes and the verdicts the sidecar publishes. "
            f"schema_version {SCHEMA_VERSION}. Producers of the input topics: "
            + INPUT_PARTITIONING,
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": {
            "consumeRetrieval": op("receive", "retrieval"),
            "consumeGeneration": op("receive", "generation"),
            "consumeFeedback": op("receive", "feedback"),
            "publishReports": op("send", "reports"),
            "publishCertificates": op("send", "certificates"),
            "consumeCertificates": op("receive", "certificates"),
            "publishClaims": op("send", "claims"),
            "publishVerdicts": op("send", "verdicts"),
            "consumeVerdicts": op("receive", "verdicts"),
            "publishDeadLetters": op("send", "dlq"),
        },
    }


def render() -> dict[str, str]:
    files = {
        f"{name}.schema.json": _dump(json_schema(name, model)) for name, model in MODELS.items()
    }
    files["asyncapi.json"] = _dump(asyncapi())
    files["policy.schema.json"] = _dump(policy_schema())
    return files


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_files(out: Path, rendered: dict[str, str]) -> list[str]:
    stale = []
    for name, text in rendered.items():
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale
