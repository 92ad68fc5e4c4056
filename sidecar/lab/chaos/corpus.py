"""Requests and a corpus of hostile input for chaos runs (deterministic, seeded)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

from sidecar.config import TopicSettings
from sidecar.lab.replay import Record


def retrieval(
    rid: str, k: int = 5, rng: random.Random | None = None, **over: Any
) -> dict[str, Any]:
    rng = rng or random.Random(rid)  # noqa: S311 - synthetic traffic, not crypto
    event: dict[str, Any] = {
        "schema_version": 1,
        "event_type": "retrieval",
        "request_id": rid,
        "tenant": "acme",
        "collection": "wiki",
        "retriever": "qdrant-minilm-l6",
        "query": f"question {rid}",
        "k": k,
        "hits": [
            {
                "chunk_id": f"{rid}#{i}",
                "doc_id": f"doc-{rng.randrange(1000)}",
                "score": round(rng.uniform(0.1, 0.9), 4),
                "text": f"Passage {i} for {rid}: the answer is {rng.randrange(10_000)}.",
            }
            for i in range(k)
        ],
    }
    event["hits"].sort(key=lambda h: -h["score"])  # best first, as a vector store returns them
    event.update(over)
    return event


def delta(rid: str, seq: int, text: str) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_type": "generation.delta",
        "request_id": rid,
        "seq": seq,
        "text": text,
    }


def final(rid: str, answer: str, **over: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "schema_version": 1,
        "event_type": "generation.final",
        "request_id": rid,
        "answer": answer,
        "generator_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
    event.update(over)
    return event


def request_records(topics: TopicSettings, rid: str, deltas: int = 2, k: int = 5) -> list[Record]:
    """One whole request: retrieval, ``deltas`` streamed pieces, final."""
    key = rid.encode()
    pieces = [f"Part {i} of the answer to {rid}. " for i in range(deltas)]
    out = [Record(topics.retrieval, key, orjson.dumps(retrieval(rid, k)))]
    out += [
        Record(topics.generation, key, orjson.dumps(delta(rid, i, p))) for i, p in enumerate(pieces)
    ]
    out.append(Record(topics.generation, key, orjson.dumps(final(rid, "".join(pieces)))))
    return out


@dataclass(frozen=True, slots=True)
class Case:
    """One hostile input and what must come of it."""

    name: str
    records: list[Record]
    dead_letters: int  # how many of its messages must reach the DLQ
    verdict_for: str | None  # a request id that must still get a verdict


def hostile_corpus(topics: TopicSettings) -> list[Case]:
    r, g = topics.retrieval, topics.generation

    def rec(topic: str, rid: str | None, value: bytes) -> Record:
        return Record(topic, rid.encode() if rid else None, value)

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    nested: Any = 1
    for _ in range(200):
        nested = [nested]
    bad_shape = {"layers": 2, "heads": 2, "chunks": 2, "values": "AAAAAAAA"}
    cases = [
        Case("truncated-json", [rec(g, "x-trunc", dumps(final("x-trunc", "a"))[:25])], 1, None),
        Case(
            "wrong-types", [rec(r, "x-types", dumps({**retrieval("x-types"), "k": "ten"}))], 1, None
        ),
        Case(
            "missing-request-id",
            [rec(r, None, dumps({**retrieval("x"), "request_id": None}))],
            1,
            None,
        ),
        Case(
            "nan-score",
            [
                rec(
                    r,
                    "x-nan",
                    dumps(retrieval("x-nan")).replace(b'"score":0', b'"score":NaN,"s":0', 1),
                )
            ],
            1,
            None,
        ),
        Case(
            "inf-score",
            [
                rec(
                    r,
                    "x-inf",
                    dumps(retrieval("x-inf")).replace(b'"score":0', b'"score":1e999,"s":0', 1),
                )
            ],
            1,
            None,
        ),
        Case(
            "negative-score-is-a-valid-raw-score",
            [
                rec(
                    r,
                    "x-neg",
                    dumps(
                        retrieval(
                            "x-neg",
                            hits=[{"chunk_id": "c", "doc_id": "d", "score": -0.2, "text": "t"}],
                        )
                    ),
                ),
                rec(g, "x-neg", dumps(final("x-neg", "An answer."))),
            ],
            0,
            "x-neg",
        ),
        Case(
            "attention-wrong-shape",
            [
                rec(r, "x-att", dumps(retrieval("x-att"))),
                rec(g, "x-att", dumps(final("x-att", "a", attention=bad_shape))),
            ],
            1,
            "x-att",  # the final is dead-lettered; the request ends incomplete
        ),
        Case(
            "ten-megabytes",
            [rec(r, "x-big", dumps(retrieval("x-big", query="q" * 10_000_000)))],
            1,
            None,
        ),
        Case(
            "deeply-nested",
            [rec(r, "x-deep", dumps({**retrieval("x-deep"), "query": nested}))],
            1,
            None,
        ),
        Case(
            "invalid-utf8",
            [rec(g, "x-utf8", b'{"schema_version": 1, "answer": "\xff\xfe"}')],
            1,
            None,
        ),
        Case(
            "unknown-schema-version",
            [rec(r, "x-ver", dumps(retrieval("x-ver", schema_version=3)))],
            1,
            None,
        ),
        Case("not-an-object", [rec(g, "x-list", b"[1, 2, 3]")], 1, None),
        Case("tombstone", [Record(g, b"x-tomb", b"")], 1, None),
        Case("key-mismatch", [rec(r, "someone-else", dumps(retrieval("x-key")))], 1, None),
        Case(
            "duplicate-conflicting",
            [
                rec(r, "x-dup", dumps(retrieval("x-dup"))),
                rec(r, "x-dup", dumps(retrieval("x-dup", query="other"))),
                rec(g, "x-dup", dumps(final("x-dup", "An answer."))),
            ],
            1,
            "x-dup",
        ),
        Case(
            "deltas-out-of-order",
            [
                rec(r, "x-ooo", dumps(retrieval("x-ooo"))),
                rec(g, "x-ooo", dumps(delta("x-ooo", 1, "world. "))),
                rec(g, "x-ooo", dumps(delta("x-ooo", 0, "Hello "))),
                rec(g, "x-ooo", dumps(final("x-ooo", "Hello world. "))),
            ],
            0,
            "x-ooo",
        ),
        Case(
            "delta-after-final",
            [
                rec(r, "x-late", dumps(retrieval("x-late"))),
                rec(g, "x-late", dumps(final("x-late", "Done."))),
                rec(g, "x-late", dumps(delta("x-late", 0, "late"))),
            ],
            1,
            "x-late",
        ),
        Case(
            "final-without-retrieval",
            [rec(g, "x-orphan", dumps(final("x-orphan", "Orphan.")))],
            0,
            "x-orphan",
        ),
    ]
    return cases
