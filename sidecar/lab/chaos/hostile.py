"""Every class of hostile record, each with what must come of it (issue #20).

A hostile producer sends valid-shaped events with finite but absurd numbers,
bytes that are not UTF-8 (in values and in header values), records just under,
at and over every size limit, another tenant's request ids, floods of labels,
late re-sends and request ids such as ``..``. Every generated record says what
the sidecar must do with it (``Outcome``): dead-letter it (with one of a set of
reasons), answer its request with a verdict, either of the two, or consume it
silently (a label). The chaos runner tags each record with a ``x-chaos-id``
header (dead letters keep the original headers) and checks the outcome.

Tenancy is ``header``: every record carries the trusted tenant header, except
the records that test its absence. The sizes follow the sidecar's configured
limits (``LimitSettings``), so the same generator serves the quick scenario and
the soak.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import orjson

from sidecar.contracts.events import FLOAT16_MAX
from sidecar.lab.chaos.builder import RecordBuilder, pad_to
from sidecar.lab.chaos.corpus import delta, retrieval
from sidecar.lab.chaos.expectations import (
    OTHER_TENANT,
    TENANT,
    HostileRecord,
    Outcome,
)
from sidecar.lab.replay import Record
from sidecar.pipeline.intake import HELD_EVENT_OVERHEAD, HELD_HIT_OVERHEAD

_SIDE = {-1: "-under", 0: "-at", 1: "-over"}  # request ids allow no "+"


class HostileFactory(RecordBuilder):
    """Builds ordinary requests and hostile records for one set of topics and limits."""

    # ------------------------------------------------------------------ the classes

    def absurd_numbers(self, p: str) -> Iterator[list[HostileRecord]]:
        """Finite but absurd values in every numeric field a producer controls."""
        out_of_range = ["score-out-of-range"]
        schema = ["schema-violation", "malformed-json"]
        for name, score in (("1e308", 1e308), ("-1e308", -1e308), ("1e30", 1e30)):
            rid = f"{p}score{name}"
            yield self._pair(
                f"score={name}", rid, self._scores(rid, score), self._fin(rid),
                bad="retrieval", reasons=out_of_range,
            )  # fmt: skip
        rid = f"{p}score-denormal"
        yield self._pair(
            "score=5e-324", rid, self._scores(rid, 5e-324), self._fin(rid), outcome=Outcome.ANSWER
        )
        rid = f"{p}k1024"
        yield self._pair(
            "k=1024", rid, self._ret_k(rid, 1024), self._fin(rid), outcome=Outcome.ANSWER
        )
        for name, k in (("1025", 1025), ("0", 0), ("-1", -1), ("2e63", 2**63 - 1)):
            rid = f"{p}k{name}"
            yield self._pair(
                f"k={name}", rid, self._ret_k(rid, k), self._fin(rid), bad="retrieval",
                reasons=schema,
            )  # fmt: skip
        rid = f"{p}k2e64"  # beyond 64 bits: orjson reads it as a float
        raw = self._ret(rid).replace(b'"k":5', b'"k":18446744073709551616', 1)
        yield self._pair("k=2**64", rid, raw, self._fin(rid), bad="retrieval", reasons=schema)
        # seq: the limit, over it, negative, 2**63
        g = self.topics.generation
        for name, seq, outcome in (
            ("1000000", 1_000_000, Outcome.ANSWER),
            ("1000001", 1_000_001, Outcome.DLQ),
            ("-1", -1, Outcome.DLQ),
            ("2e63", 2**63 - 1, Outcome.DLQ),
        ):
            rid = f"{p}seq{name}"
            group = self._pair(f"seq={name}", rid, self._ret(rid), None)
            group.append(
                HostileRecord(
                    f"seq={name}",
                    self._rec(g, rid, orjson.dumps(delta(rid, seq, "Piece. "))),
                    outcome,
                    (TENANT, rid),
                    frozenset(schema) if outcome is Outcome.DLQ else frozenset(),
                )
            )
            group += self._pair(f"seq={name}", rid, None, self._fin(rid, "Piece. "))
            yield [replace(h, complete=True) for h in group]
        # the final's numbers: logprob, deltas, attention summary extremes
        for name, logprob, outcome in (
            ("-1e308", -1e308, Outcome.ANSWER),
            ("-5e-324", -5e-324, Outcome.ANSWER),
            ("0", 0.0, Outcome.ANSWER),
            ("1e-300", 1e-300, Outcome.DLQ),
        ):
            rid = f"{p}logprob{name}"
            yield self._pair(
                f"logprob={name}", rid, self._ret(rid), self._fin(rid, mean_token_logprob=logprob),
                bad="final", outcome=outcome, reasons=schema,
            )  # fmt: skip
        rid = f"{p}deltas2e62"
        yield self._pair(
            "deltas=2**62", rid, self._ret(rid), self._fin(rid, deltas=2**62),
            outcome=Outcome.ANSWER,
        )  # fmt: skip
        for name, when in (("9999", "9999-12-31T23:59:59Z"), ("0001", "0001-01-01T00:00:00Z")):
            rid = f"{p}created{name}"
            yield self._pair(
                f"created_at={name}", rid, self._ret(rid, created_at=when), self._fin(rid),
                outcome=Outcome.ANSWER,
            )  # fmt: skip
        if self.attention is not None:
            model = self.attention.generator_model
            for name, values in (
                ("zeros", np.zeros(1)),
                ("+65504", np.full(1, FLOAT16_MAX)),
                ("-65504", np.full(1, -FLOAT16_MAX)),
                ("alternating", np.array([FLOAT16_MAX, -FLOAT16_MAX, 0.0])),
            ):
                rid = f"{p}att{name.strip('+-')}{'n' if name.startswith('-') else ''}"
                fin = self._fin(rid, generator_model=model, attention=self._attention(values))
                if (values < 0).any():  # lookback ratios are >= 0 (eq. 8): refused
                    yield self._pair(
                        f"attention={name}", rid, self._ret(rid, k=self.attention.chunks), fin,
                        bad="final", reasons=["schema-violation"],
                    )  # fmt: skip
                    continue
                yield self._pair(
                    f"attention={name}", rid, self._ret(rid, k=self.attention.chunks), fin,
                    outcome=Outcome.ANSWER,
                )  # fmt: skip
            rid = f"{p}att-layers0"
            bad_shape = {**self._attention(np.zeros(1)), "layers": 0}
            yield self._pair(
                "attention-layers=0", rid, self._ret(rid),
                self._fin(rid, generator_model=model, attention=bad_shape),
                bad="final", reasons=["schema-violation"],
            )  # fmt: skip

    def bad_bytes(self, p: str) -> Iterator[list[HostileRecord]]:
        """Bytes that are not UTF-8 in values and in header values."""
        rid = f"{p}utf8-value"
        fin = self._fin(rid, "Answer XX here.").replace(b"XX", b"\xff\xfe", 1)
        yield self._pair(
            "invalid-utf8-value", rid, self._ret(rid), fin, bad="final", reasons=["invalid-utf8"]
        )
        rid = f"{p}utf8-overlong"
        fin = self._fin(rid, "Answer XX here.").replace(b"XX", b"\xc0\xaf", 1)
        yield self._pair(
            "overlong-utf8-value", rid, self._ret(rid), fin, bad="final", reasons=["invalid-utf8"]
        )
        rid = f"{p}surrogate"
        fin = self._fin(rid, "Answer XX here.").replace(b"XX", b"\\ud800", 1)
        yield self._pair(
            "lone-surrogate-escape", rid, self._ret(rid), fin, bad="final",
            reasons=["malformed-json"],
        )  # fmt: skip
        # header values that are not UTF-8: an ordinary request must still be answered
        rid = f"{p}hdr-junk"
        junk = self._headers(x_junk=b"\xff\xfe\x00")
        yield self._pair(
            "header-not-utf8", rid, self._ret(rid), self._fin(rid), outcome=Outcome.ANSWER,
            bad="final", headers=junk,
        )  # fmt: skip
        rid = f"{p}hdr-trace"
        trace = self._headers(traceparent=b"00-\xff\xfe-\x80-01")
        yield self._pair(
            "traceparent-not-utf8", rid, self._ret(rid), self._fin(rid),
            outcome=Outcome.ANSWER, bad="final", headers=trace,
        )  # fmt: skip
        rid = f"{p}hdr-tenant"
        yield self._pair(
            "tenant-header-not-utf8", rid, self._ret(rid), self._fin(rid), bad="retrieval",
            reasons=["untrusted-tenant"], headers=[(self.tenant_header, b"\xffacme")],
        )  # fmt: skip

    def sizes(self, p: str) -> Iterator[list[HostileRecord]]:
        """Records just under, at and over every size limit."""
        lim = self.limits
        for d in (-1, 0, 1):
            yield self.message_bytes(f"{p}msg{_SIDE[d]}", d)
        for d in (-1, 0, 1):
            rid = f"{p}hits{_SIDE[d]}"
            n = lim.max_hits + d
            yield self._pair(
                f"hits{d:+d}", rid, self._ret(rid, k=n), self._fin(rid),
                bad="retrieval", outcome=Outcome.DLQ if d > 0 else Outcome.ANSWER,
                reasons=["too-many-hits", "schema-violation"],
            )  # fmt: skip
        for d in (-1, 0, 1):
            rid = f"{p}answer{_SIDE[d]}"
            fin = self._fin(rid, "a" * (lim.max_answer_chars + d))
            yield self._pair(
                f"answer-chars{d:+d}", rid, self._ret(rid), fin, bad="final",
                outcome=Outcome.DLQ if d > 0 else Outcome.ANSWER,
                reasons=["answer-too-long", "oversize", "schema-violation"],
            )  # fmt: skip
        # a streamed answer that crosses the limit: the crossing delta is dead-lettered
        rid = f"{p}stream-long"
        half = lim.max_answer_chars // 2 + 1
        group = self._pair("streamed-chars+1", rid, self._ret(rid), None)
        g = self.topics.generation
        for seq, outcome in ((0, Outcome.ANSWER), (1, Outcome.DLQ)):
            raw = orjson.dumps(delta(rid, seq, "s" * half))
            group.append(
                HostileRecord(
                    "streamed-chars+1",
                    self._rec(g, rid, raw),
                    outcome,
                    (TENANT, rid),
                    frozenset({"answer-too-long"}) if outcome is Outcome.DLQ else frozenset(),
                )
            )
        group += self._pair("streamed-chars+1", rid, None, self._fin(rid, "s" * half))
        yield [replace(h, complete=True) for h in group]
        for d in (-1, 0, 1):
            yield self.request_bytes(f"{p}reqbytes{_SIDE[d]}", d)

    def message_bytes(self, rid: str, d: int) -> list[HostileRecord]:
        """A retrieval of the message limit + ``d`` bytes, and its final."""

        def big(pad: int) -> bytes:
            event = retrieval(rid)  # seeded by the id: the same bytes on every call
            event["hits"][0]["text"] = "p" * pad
            return orjson.dumps(event)

        ret = pad_to(big, self.limits.max_message_bytes + d)
        return self._pair(
            f"message-bytes{d:+d}", rid, ret, self._fin(rid), bad="retrieval",
            outcome=Outcome.DLQ if d > 0 else Outcome.ANSWER, reasons=["oversize"],
        )  # fmt: skip

    def request_bytes(self, rid: str, d: int) -> list[HostileRecord]:
        """A retrieval and a final that together hold the request's byte budget + ``d``."""
        lim = self.limits
        fin = self._fin(rid, "f" * min(lim.max_answer_chars, 8_000))

        def big(pad: int) -> bytes:
            event = retrieval(rid)  # seeded by the id: the same bytes on every call
            event["hits"][0]["text"] = "r" * pad
            return orjson.dumps(event)

        # each held event also counts a fixed overhead against the budget, and each retrieval
        # hit its decoded model's (intake.held_bytes)
        hits = len(retrieval(rid)["hits"])
        overhead = 2 * HELD_EVENT_OVERHEAD + hits * HELD_HIT_OVERHEAD
        target = lim.max_request_bytes - len(fin) - overhead + d
        if target > lim.max_message_bytes:
            raise ValueError(
                f"max_request_bytes ({lim.max_request_bytes}) must be within max_message_bytes "
                f"({lim.max_message_bytes}) plus a final of {len(fin)} bytes for this case"
            )
        group = self._pair(f"request-bytes{d:+d}", rid, pad_to(big, target), fin)
        if d <= 0:
            return group
        crossing = frozenset({"request-too-large"})
        return [replace(h, outcome=Outcome.ONE_OF, reasons=crossing, complete=False) for h in group]

    def request_ids(self, p: str) -> Iterator[list[HostileRecord]]:
        """Request ids that are path tricks, too long, or not ids at all."""
        schema = ["schema-violation"]
        for name, rid in (("dotdot", ".."), ("dot", "."), ("path", f"../{p}etc")):
            yield self._pair(
                f"request-id={name}", rid, self._ret(rid), None, bad="retrieval", reasons=schema
            )
        rid = f"{p}" + "x" * (128 - len(p))
        yield self._pair(
            "request-id-128", rid, self._ret(rid), self._fin(rid), outcome=Outcome.ANSWER
        )
        rid = f"{p}" + "y" * (129 - len(p))
        yield self._pair(
            "request-id-129", rid, self._ret(rid), None, bad="retrieval", reasons=schema
        )
        rid = f"{p}nl\n"
        yield self._pair(
            "request-id-newline", rid, self._ret(rid), None, bad="retrieval", reasons=schema
        )
        # A second retrieval: the final is on the other topic and may be read before it,
        # completing the request; the second copy is then a late re-send (after-final).
        rid = f"{p}dup"
        [ret, fin] = self._pair("duplicate-identical", rid, self._ret(rid), self._fin(rid))
        late = frozenset({"after-final"})
        yield [ret, replace(ret, outcome=Outcome.EITHER, reasons=late), fin]
        rid = f"{p}conflict"
        [ret, fin] = self._pair("duplicate-conflicting", rid, self._ret(rid), self._fin(rid))
        other = self._pair(
            "duplicate-conflicting", rid, self._ret(rid, query="another question"), None,
            bad="retrieval", reasons=["duplicate-conflict", "after-final"],
        )  # fmt: skip
        yield [ret, *other, fin]
        rid = f"{p}key"
        yield [
            HostileRecord(
                "key-mismatch",
                Record(self.topics.retrieval, b"someone-else", self._ret(rid), self._headers()),
                Outcome.DLQ,
                None,
                frozenset({"key-mismatch"}),
            )
        ]

    def tenancy(self, p: str, victims: Sequence[str]) -> Iterator[list[HostileRecord]]:
        """Another tenant's request ids, a mismatching header, and no header at all."""
        for rid in victims[:2]:  # a whole request of the other tenant under a victim's id
            yield self._pair(
                "other-tenant-same-id", rid,
                orjson.dumps(retrieval(rid, rng=self.rng, tenant=OTHER_TENANT)),
                self._fin(rid, "Not yours."), outcome=Outcome.ANSWER, tenant=OTHER_TENANT,
            )  # fmt: skip
        for rid in victims[2:4]:  # only a final: it must never complete the victim's request
            yield self._pair(
                "other-tenant-final-only", rid, None, self._fin(rid, "Hijack."),
                outcome=Outcome.ANSWER, tenant=OTHER_TENANT,
            )  # fmt: skip
        rid = f"{p}mismatch"
        yield self._pair(
            "tenant-mismatch", rid,
            orjson.dumps(retrieval(rid, rng=self.rng, tenant=OTHER_TENANT)), self._fin(rid),
            bad="retrieval", reasons=["tenant-mismatch"],
        )  # fmt: skip
        rid = f"{p}no-header"
        yield self._pair(
            "tenant-header-missing", rid, self._ret(rid), self._fin(rid), bad="retrieval",
            reasons=["untrusted-tenant"], headers=[],
        )  # fmt: skip

    def labels(self, p: str, rids: Sequence[str], n: int) -> list[HostileRecord]:
        """A flood of labels: for ordinary requests, unknown ids, another tenant, broken ones."""
        f = self.topics.feedback
        out: list[HostileRecord] = []
        for i in range(n):
            choice = i % 5
            rid = rids[i % len(rids)] if choice < 3 else f"{p}unknown{i}"
            tenant = OTHER_TENANT if choice == 2 else TENANT
            event = {
                "schema_version": 1,
                "event_type": "feedback",
                "request_id": rid,
                "correct": self.rng.random() < 0.5,
                "source": "chaos",
            }
            if choice == 4 and i % 10 == 4:  # broken: a label must be a bool
                event["correct"] = "maybe"
                out.append(
                    HostileRecord(
                        "label-schema",
                        self._rec(f, rid, orjson.dumps(event), self._headers(tenant)),
                        Outcome.DLQ,
                        None,
                        frozenset({"schema-violation"}),
                    )
                )
                continue
            out.append(
                HostileRecord(
                    "label-flood",
                    self._rec(f, rid, orjson.dumps(event), self._headers(tenant)),
                    Outcome.CONSUME,
                )
            )
        return out

    def late_resends(self, case: str, records: Sequence[Record]) -> list[HostileRecord]:
        """Decided requests' records sent again (identical bytes): dead-lettered after-final."""
        return [
            HostileRecord(case, r, Outcome.DLQ, None, frozenset({"after-final"}))
            for r in records
            if r.topic != self.topics.feedback
        ]

    def join_flood(self, p: str, n: int) -> list[HostileRecord]:
        """Half-requests of nearly a whole message each: the join store's byte budget evicts."""
        out: list[HostileRecord] = []
        for i in range(n):
            rid = f"{p}half{i}"

            def big(pad: int, rid: str = rid) -> bytes:
                event = retrieval(rid)  # seeded by the id: the same bytes on every call
                event["hits"][0]["text"] = "h" * pad
                return orjson.dumps(event)

            raw = pad_to(big, self.limits.max_message_bytes - 1024)
            out += self._pair("join-byte-budget", rid, raw, None, outcome=Outcome.ANSWER)
        return out

    # ------------------------------------------------------------------ mixes

    def phase_one(self, p: str, victims: Sequence[str]) -> list[list[HostileRecord]]:
        """Every class that needs no earlier verdict, one group per case."""
        return [
            *self.absurd_numbers(p),
            *self.bad_bytes(p),
            *self.sizes(p),
            *self.request_ids(p),
            *self.tenancy(p, victims),
        ]

    def poison(self, p: str, victims: Sequence[str]) -> list[HostileRecord]:
        """One hostile case drawn at random (the soak's poison)."""
        classes = [self.absurd_numbers(p), self.bad_bytes(p), self.request_ids(p)]
        if len(victims) >= 4:
            classes.append(self.tenancy(p, victims))
            classes.append(iter([self.labels(p, victims, 20)]))
        return self.rng.choice(list(self.rng.choice(classes)))

    def oversize(self, p: str) -> list[HostileRecord]:
        """Over the message limit, or over the request's byte budget (the soak's oversize)."""
        if self.rng.random() < 0.5:
            return self.message_bytes(f"{p}msg", 1)
        return self.request_bytes(f"{p}reqbytes", 1)
