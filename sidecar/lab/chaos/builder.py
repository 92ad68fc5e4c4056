"""Building chaos records: ordinary requests, hostile request halves, tenant headers, attention.

:class:`RecordBuilder` owns the topics, the limits, the trusted tenant header
and the seeded RNG; :class:`~sidecar.lab.chaos.hostile.HostileFactory` builds
every class of hostile record on top of it.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from sidecar.config import LimitSettings, TopicSettings
from sidecar.lab.chaos.corpus import delta, final, retrieval
from sidecar.lab.chaos.expectations import (
    TENANT,
    HostileRecord,
    Outcome,
)
from sidecar.lab.replay import Record


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """What the served lookback model takes (from its metadata.json)."""

    generator_model: str
    layers: int
    heads: int
    chunks: int


def pad_to(build: Any, target: int) -> bytes:
    """``build(pad)`` -> bytes; the ASCII padding length that makes it exactly ``target`` bytes."""
    base = len(build(0))
    raw: bytes = build(max(0, target - base))
    if len(raw) != target:
        raise ValueError(f"cannot pad a {base}-byte record to {target} bytes")
    return raw


class RecordBuilder:
    """Ordinary requests and the halves of hostile ones, for one set of topics and limits."""

    def __init__(
        self,
        topics: TopicSettings,
        limits: LimitSettings,
        *,
        tenant_header: str,
        attention: AttentionShape | None,
        seed: int = 7,
    ) -> None:
        self.topics = topics
        self.limits = limits
        self.tenant_header = tenant_header
        self.attention = attention
        self.rng = random.Random(seed)  # noqa: S311 - reproducible synthetic traffic

    # ------------------------------------------------------------------ building blocks

    def _headers(self, tenant: str | None = TENANT, **extra: bytes) -> list[tuple[str, bytes]]:
        headers = [] if tenant is None else [(self.tenant_header, tenant.encode())]
        return headers + [(k.replace("_", "-"), v) for k, v in extra.items()]

    def _rec(
        self, topic: str, rid: str, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> Record:
        key = rid.encode("utf-8", "surrogatepass")
        return Record(topic, key, value, self._headers() if headers is None else headers)

    def ordinary(self, rid: str, deltas: int = 2, k: int = 5, tenant: str = TENANT) -> list[Record]:
        """A whole well-formed request with the trusted tenant header on every record."""
        headers = self._headers(tenant)
        pieces = [f"Part {i} of the answer to {rid}. " for i in range(deltas)]
        r, g = self.topics.retrieval, self.topics.generation
        out = [self._rec(r, rid, orjson.dumps(retrieval(rid, k, tenant=tenant)), headers)]
        out += [
            self._rec(g, rid, orjson.dumps(delta(rid, i, p)), headers) for i, p in enumerate(pieces)
        ]
        out.append(self._rec(g, rid, orjson.dumps(final(rid, "".join(pieces))), headers))
        return out

    def _pair(
        self,
        case: str,
        rid: str,
        ret: bytes | None,
        fin: bytes | None,
        *,
        bad: str | None = None,
        reasons: Sequence[str] = (),
        outcome: Outcome = Outcome.DLQ,
        tenant: str = TENANT,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> list[HostileRecord]:
        """A request whose retrieval or final (``bad``) is the hostile part.

        The good half must be answered: with a verdict when the bad half is
        admitted, else by the TTL (``block``/``incomplete``).
        """
        out: list[HostileRecord] = []
        request = (tenant, rid)
        complete = (
            ret is not None and fin is not None and (bad is None or outcome is Outcome.ANSWER)
        )
        for part, raw, topic in (
            ("retrieval", ret, self.topics.retrieval),
            ("final", fin, self.topics.generation),
        ):
            if raw is None:
                continue
            hostile = part == bad
            out.append(
                HostileRecord(
                    case=case,
                    record=self._rec(
                        topic, rid, raw, headers if hostile else self._headers(tenant)
                    ),
                    outcome=outcome if hostile else Outcome.ANSWER,
                    request=request,
                    reasons=frozenset(reasons) if hostile else frozenset(),
                    complete=complete,
                )
            )
        return out

    def _ret(self, rid: str, **over: Any) -> bytes:
        return orjson.dumps(retrieval(rid, rng=self.rng, **over))

    def _fin(self, rid: str, answer: str = "A short answer.", **over: Any) -> bytes:
        return orjson.dumps(final(rid, answer, **over))

    def _ret_k(self, rid: str, k: int) -> bytes:
        """Five hits, whatever ``k`` claims."""
        event = retrieval(rid, rng=self.rng)
        event["k"] = k
        return orjson.dumps(event)

    def _scores(self, rid: str, score: float) -> bytes:
        event = retrieval(rid, rng=self.rng)
        event["hits"][0]["score"] = score
        return orjson.dumps(event)

    def _attention(self, values: np.ndarray[Any, Any]) -> dict[str, Any]:
        shape = self.attention
        assert shape is not None  # noqa: S101 - callers check
        arr = np.resize(values, (shape.layers, shape.heads, shape.chunks)).astype("<f2")
        return {
            "layers": shape.layers,
            "heads": shape.heads,
            "chunks": shape.chunks,
            "values": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii"),
        }
