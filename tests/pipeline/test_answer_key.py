"""``answer_key`` hashes one joined buffer: the key ``idempotency_key`` writes, byte for byte."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sidecar.pipeline.outputs import answer_key, idempotency_key

DIGESTS = [None, b"", hashlib.blake2b(b"r", digest_size=16).digest(), b"\x00-\x00"]


@pytest.mark.parametrize("request_id", ["req-1", "", "r\u00e9q\x00\u4e2d"])
@pytest.mark.parametrize("retrieval_digest", DIGESTS)
@pytest.mark.parametrize("final_digest", DIGESTS)
def test_answer_key_is_idempotency_key_of_both_digests(
    request_id: str, retrieval_digest: bytes | None, final_digest: bytes | None
) -> None:
    entry = SimpleNamespace(
        request_id=request_id, retrieval_digest=retrieval_digest, final_digest=final_digest
    )
    expected = idempotency_key(request_id, retrieval_digest, final_digest)
    assert answer_key(cast(Any, entry)) == expected
