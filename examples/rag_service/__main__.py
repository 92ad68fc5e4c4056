"""``python -m examples.rag_service``: the reference service with SmolLM2 (env RAG_SERVICE_*)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from examples.rag_service.config import ServiceSettings
from examples.rag_service.server import serve
from guardrail_client import calm_kafka_logs

DEFAULT_CORPUS = Path("../shared/data/nq-open/nq-open-oracle.dev.jsonl.gz")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.rag_service", description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="NQ-open passages")
    parser.add_argument(
        "--qdrant-path", type=Path, default=Path("out/rag_service/qdrant"),
        help="embedded Qdrant directory (built on the first run, reused after)",
    )  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    from examples.rag_service.smollm2 import SmolLM2Answerer  # noqa: PLC0415 - the ml extra

    settings = ServiceSettings()
    calm_kafka_logs()  # a broker restart: aiokafka's retried errors at WARNING, not ERROR
    answerer = SmolLM2Answerer(
        args.corpus,
        k=settings.k,
        qdrant_path=args.qdrant_path,
        max_new_tokens=args.max_new_tokens,
        threads=args.threads,
    )
    asyncio.run(serve(settings, answerer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
