"""A fast path built on plain dicts, sketched as a floor: what a rewrite could cost at best (#22).

The sidecar's processor costs ~0.14 ms per request, spread over many steps;
``fast_drain_vs_noop`` >= 0.8 leaves it ~0.02 ms. :class:`DictFloor` takes whole requests
through only the work any fast path must do, in the cheapest CPython this project could
write, and the served models:

* each record: ``orjson.loads``, the envelope's fields and types checked by hand, every
  hit's fields and score range, the attention summary's base64 decoded and its float16
  values checked finite, the record's digest for duplicates (the sidecar's
  ``blake2b``), the request joined in a plain dict; a record it refuses costs that record
  (counted in ``refused`` by reason; the sketch dead-letters nothing);
* each batch of completed requests: conformal trust by a threshold compare; the
  lookback matrix (the sidecar's ``summary_rows``) and the served ONNX model, one call;
  each chunk's attention share in one numpy pass; the two served confidence models'
  numpy passes (``predict_rows``), one each;
* each request: a decision from a few comparisons and the verdict as one dict literal
  of the sidecar's verdict's shape (its key paths, six reasons, the chunk forecasts),
  encoded with ``orjson.dumps``.

It skips what the sidecar does beyond that (tenancy, byte budgets, per-stage timings,
trace attributes, the monitors, claim sessions, dead-letter reasons, bounded memory of
what it joins) and its values are approximations, not the sidecar's verdicts: a lower
bound on a rewrite's cost, not a candidate. ``bench/dict_floor.py`` times it against the
processor in one process; ``python -m sidecar.lab.bench.floors dict`` serves it in the
sidecar's loop, for drains against the other floors.
"""

from __future__ import annotations

import binascii
import math
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np
import orjson

from sidecar.confidence.features import ANSWER_FEATURES, CHUNK_FEATURES
from sidecar.lookback.features import summary_rows
from sidecar.pipeline.intake import digest
from sidecar.pipeline.processor import BatchItem, Processor

__all__ = ["Bad", "DictFloor"]

_SEEN = 1_000_000
_RETRIEVAL, _DELTA, _FINAL = "retrieval", "generation.delta", "generation.final"
_REASON = {"code": "lookback-very-low", "message": "p(factual) = 0.00 < 0.1", "signal": "lookback"}


class Bad(Exception):
    """A record the sketch refuses (the real path would dead-letter it with a reason)."""


def _str(event: dict[str, Any], name: str) -> str:
    value = event.get(name)
    if type(value) is not str or not value:
        raise Bad(name)
    return value


def _hits(event: dict[str, Any]) -> list[tuple[str, float]]:
    hits = event.get("hits")
    if type(hits) is not list or not hits:  # the sketch scores answers with evidence only
        raise Bad("hits")
    out = []
    for hit in hits:
        if type(hit) is not dict:
            raise Bad("hit")
        score = hit.get("score")
        if type(score) is not float or not -1.0 <= score <= 1.0:
            raise Bad("score")
        if type(hit.get("text")) is not str or type(hit.get("doc_id")) is not str:
            raise Bad("hit fields")
        out.append((_str(hit, "chunk_id"), score))
    return out


def _attention(event: dict[str, Any], shape: tuple[int, int, int]) -> tuple[bytes, int]:
    """The summary's bytes and chunk count; ``shape``: the served model's (layers, heads,
    chunks at most)."""
    summary = event.get("attention")
    if type(summary) is not dict:
        raise Bad("attention")
    layers, heads, chunks = summary.get("layers"), summary.get("heads"), summary.get("chunks")
    if type(chunks) is not int or (layers, heads) != shape[:2] or not 0 < chunks <= shape[2]:
        raise Bad("shape")
    raw = binascii.a2b_base64(_str(summary, "values"), strict_mode=True)
    values = np.frombuffer(raw, dtype=np.float16)
    if values.size != shape[0] * shape[1] * chunks or not np.isfinite(values).all():
        raise Bad("values")
    return raw, chunks


class DictFloor:
    """The sketch: plain dicts in, verdict bytes out; the served ONNX and numpy models."""

    def __init__(self, processor: Processor) -> None:
        signals = processor.signals
        if signals.lookback is None or signals.confidence is None:
            raise ValueError(
                "the dict floor scores with the served lookback and confidence models: "
                "configure both (GUARDRAIL_SIGNALS__LOOKBACK, GUARDRAIL_SIGNALS__CONFIDENCE)"
            )
        self.lookback = cast(Any, signals.lookback)  # the ONNX scorer: its metadata, _run
        self.confidence = cast(Any, signals.confidence)
        meta = self.lookback.metadata
        self.shape: tuple[int, int, int] = (meta.layers, meta.heads, meta.chunks)
        self.q_hat = 0.586
        self.seen: set[bytes] = set()
        self.store: dict[str, list[Any]] = {}
        self.refused: Counter[str] = Counter()

    def on_batch(self, items: Sequence[BatchItem]) -> list[tuple[str, bytes, bytes]]:
        """The verdicts of the requests ``items`` complete: (request id, key, value)."""
        done: list[tuple[str, list[Any]]] = []
        for _kind, raw, key, _ref in items:
            if raw is None:
                continue
            try:
                rid, entry = self._admit(raw, key)
            except Bad as exc:
                self.refused[str(exc)] += 1
                continue
            except (orjson.JSONDecodeError, binascii.Error, UnicodeDecodeError):
                self.refused["unreadable"] += 1
                continue
            if entry is not None and entry[0] is not None and entry[2] is not None:
                done.append((rid, self.store.pop(rid)))
        return self._decide(done) if done else []

    def _admit(self, raw: bytes, key: bytes | None) -> tuple[str, list[Any] | None]:
        """One record read, checked and joined; its request's entry (``None``: seen)."""
        mark = digest(raw)
        if mark in self.seen:
            return "", None
        if len(self.seen) >= _SEEN:  # a floor's memory: bounded, not the sidecar's
            self.seen.clear()
        self.seen.add(mark)
        event = orjson.loads(raw)
        if type(event) is not dict or event.get("schema_version") != 1:
            raise Bad("envelope")
        rid = _str(event, "request_id")
        if key is not None and key.decode() != rid:
            raise Bad("key")
        entry = self.store.get(rid)
        if entry is None:
            entry = self.store[rid] = [None, [], None]
        kind = event.get("event_type")
        if kind == _DELTA:
            if type(event.get("seq")) is not int:
                raise Bad("seq")
            entry[1].append(_str(event, "text"))
        elif kind == _RETRIEVAL:
            entry[0] = (_str(event, "tenant"), _hits(event))
        elif kind == _FINAL:
            answer, model = _str(event, "answer"), _str(event, "generator_model")
            entry[2] = (answer, model, _attention(event, self.shape))
        else:
            raise Bad("event_type")
        return rid, entry

    def _decide(self, done: list[tuple[str, list[Any]]]) -> list[tuple[str, bytes, bytes]]:
        meta = self.lookback.metadata
        q_hat = self.q_hat
        trusted = []
        for _rid, (retrieval, _deltas, _final) in done:
            trusted.append([i for i, (_c, s) in enumerate(retrieval[1]) if s >= q_hat])
        rows = summary_rows(
            [final[2][0] for _r, (_t, _d, final) in done],
            [final[2][1] for _r, (_t, _d, final) in done],
            [None] * len(done),
            layers=meta.layers,
            heads=meta.heads,
            k=meta.chunks,
        )
        p_factual = self.lookback._run(rows).tolist()
        # each chunk's share of the attention: its mean over layers and heads, normalised
        # (one numpy pass over the batch's summaries when they have one chunk count)
        summaries = [f[2] for _r, (_t, _d, f) in done]
        groups = (  # (the summaries' bytes, how many answers they hold)
            [(b"".join(raw for raw, _k in summaries), len(summaries))]
            if len({k for _r, k in summaries}) == 1
            else [(raw, 1) for raw, _k in summaries]
        )
        shares: list[list[float]] = []
        for raw, n in groups:
            halves = np.frombuffer(raw, dtype="<f2").astype(np.float32)
            means = halves.reshape(n, meta.layers * meta.heads, -1).mean(axis=1)
            shares += (means / means.sum(axis=1, keepdims=True)).tolist()
        answer_rows, chunk_rows = [], []
        for (_rid, (retrieval, _d, final)), keep, p, share in zip(
            done, trusted, p_factual, shares, strict=True
        ):
            scores = [s for _c, s in retrieval[1]]
            top = max(scores)
            m2 = len(keep) / len(scores)
            answer_rows.append(
                (top, top - sorted(scores)[-2] if len(scores) > 1 else 0.0,
                 sum(scores) / len(scores), 1.0, m2, p, None,
                 None, None, math.log1p(len(final[0].split())))
            )  # fmt: skip
            chunk_rows.extend(
                [
                    (
                        scores[i],
                        top - scores[i],
                        1.0 / (i + 1),
                        1.0,
                        share[i] if i < len(share) else None,
                    )
                    for i in keep
                ]  # a chunk the summary lacks: its share missing
            )
        p_correct = self.confidence.answer.predict_rows(answer_rows, _ANSWER).tolist()
        p_useful = self.confidence.chunks.predict_rows(chunk_rows, _CHUNK).tolist()
        out: list[tuple[str, bytes, bytes]] = []
        at = 0
        for (rid, (retrieval, _d, final)), keep, p, c in zip(
            done, trusted, p_factual, p_correct, strict=True
        ):
            hits = retrieval[1]
            forecast = [
                {"chunk_id": hits[i][0], "p_useful": p_useful[at + j], "retrieval_rank": j}
                for j, i in enumerate(keep)
            ]
            at += len(keep)
            decision = "block" if p < 0.1 or c < 0.1 else "caveat" if c < 0.5 else "allow"
            verdict = {
                "schema_version": 1, "event_type": "answer.verdict", "request_id": rid,
                "idempotency_key": rid, "tenant": retrieval[0], "decision": decision,
                "reasons": [_REASON] * 6, "stage": "final", "escalate": False,
                "policy": "default/1",
                "signals": {
                    "retrieval": {
                        "status": "ok", "trusted_chunk_ids": [hits[i][0] for i in keep],
                        "m1": bool(keep), "m2": len(keep) / len(hits), "q_hat": self.q_hat,
                        "alpha": 0.1, "certifiable": True, "calibration_version": "v",
                        "calibration_key": "global", "fallback": True,
                        "fallback_reason": "unknown-collection", "clipped_scores": 1,
                        "monitor": "warming-up", "m1_mean": None,
                    },
                    "lookback": {"status": "ok", "p_factual": p, "model_version": "v"},
                    "claims": {
                        "status": "not-configured", "n": 0, "supported": 0, "unsupported": 0,
                        "uncertain": 0, "irrelevant": 0, "reliability": None,
                        "reliability_level": None, "hallucination_rate": None,
                        "evidence_scope": None, "stream_mismatch": False,
                        "superseded_claims": [], "unchecked": 0, "unreadable": 0,
                        "unjudged": 0,
                    },
                },
                "confidence": c,
                "confidence_features": dict(zip(_ANSWER, answer_rows[len(out)], strict=True)),
                "chunk_forecast": forecast, "advice": None, "certified_risk": None,
                "certified_delta": None, "certificate": None, "caveat_text": None,
                "rewritten_answer": None,
                "model_versions": {
                    "generator": final[1], "certifier": "v", "lookback": "v",
                    "confidence": "v", "policy": "default/1",
                },
                "timings_ms": {"join_wait": 0.0, "signals": 0.9, "policy": 0.07},
                "produced_at": datetime.now(UTC).isoformat(), "sidecar_version": "0.1.0",
            }  # fmt: skip
            out.append(("rag.verdicts", rid.encode(), orjson.dumps(verdict)))
        return out


_ANSWER, _CHUNK = ANSWER_FEATURES, CHUNK_FEATURES
