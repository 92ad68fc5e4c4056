"""The no-op floor publishing verdicts of the sidecar's own size, with its header (#22).

The no-op (``floors noop``) answers each request with a constant verdict of ~1.2 KB and
no header; on the bench's load the sidecar publishes ~2.8 KB verdicts with an
``x-idempotency-key`` header. Is the sidecar's heavier loop (its event loop thread's
CPU a request over the no-op's: ~16-25 us in session 67's split drains) the bytes it
publishes, or its own code? This process is the no-op with the sidecar's verdict for a
request of the bench's load as the template (the request id and time stamped in as the
no-op does) and a 32-byte key header, so paired against the no-op it measures what the
bigger verdicts alone cost the loop::

    PYTHONPATH=. .venv/bin/python bench/paired_drains.py --pairs 4 --requests 40000 \\
        --a-argv "-m sidecar.lab.bench.floors noop" --b-argv "-m bench.sized_noop" \\
        --placement split --out bench/results/sized_noop_drains.json
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from typing import Any

import orjson

from sidecar import runtime
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.lab.bench import floors
from sidecar.lab.bench.e2e import LoadShape, answer_events
from sidecar.lab.bench.stages import request_items
from sidecar.pipeline.outputs import IDEMPOTENCY_HEADER, Destination, Output


def sidecar_verdict(settings: Settings) -> tuple[dict[str, Any], int]:
    """The sidecar's verdict for one request of the bench's load, decided in process
    (the served models, the settings of the drain), and its size in bytes."""
    processor = runtime.build_processor(settings)
    rid = "bench-sized-0"
    step = processor.on_batch(request_items(answer_events(rid, LoadShape()), rid, 0), 1000.0)
    (verdict,) = [o.value for o in step.outputs if o.destination is Destination.VERDICTS]
    return orjson.loads(verdict), len(verdict)


class SizedNoop(floors.ConstantVerdictProcessor):
    """The no-op with the sidecar's verdict as its template and a key header."""

    def _answer(self, kind: InputKind, raw: bytes | None, key: bytes | None) -> Output | None:
        out = super()._answer(kind, raw, key)
        if out is None or key is None:
            return out
        digest = hashlib.blake2b(key, digest_size=16).hexdigest().encode()
        return Output(out.destination, out.key, out.value, [(IDEMPOTENCY_HEADER, digest)])


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    for noisy in ("aiokafka", "faststream", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = Settings.load()
    fields, size = sidecar_verdict(settings)
    logging.getLogger("bench.sized_noop").info("verdict template: %d bytes", size)
    asyncio.run(runtime.serve(settings, SizedNoop(settings, fields)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
