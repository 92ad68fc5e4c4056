"""FastStream's parsing made harmless: no consumed record may fail before the handler tracks it.

FastStream decodes header values as UTF-8 and bodies as JSON before a handler
runs; a message that never reached the handler would never be tracked, and a
later commit could pass over it. The parser here survives header values that
are not UTF-8 and the decoder hands the handler the raw bytes: validation is
the pipeline's, with dead-letter reasons.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any


async def tolerant_parser(record: Any, original: Callable[[Any], Awaitable[Any]]) -> Any:
    """FastStream's parser, but header values that are not UTF-8, or null, do not kill
    the message (in batch mode: the whole poll).

    ``record`` is one consumer record or, in batch mode, a tuple of them. FastStream
    decodes every header value as UTF-8; when one is not, it parses copies whose
    header values are made text, and the handler still gets the consumer's own
    records (``raw_message``), header bytes untouched: nothing here mutates them.
    """
    try:
        return await original(record)
    except (UnicodeDecodeError, AttributeError):  # not UTF-8; a null value (None.decode)
        pass
    if isinstance(record, tuple | list):
        message = await original(tuple(_text_headers(r) for r in record))
    else:
        message = await original(_text_headers(record))
    message.raw_message = record
    return message


def _text_headers(record: Any) -> Any:
    """A shallow copy of ``record`` whose header values decode as UTF-8 (for FastStream only)."""
    clone = copy.copy(record)
    clone.headers = [
        (name, (value or b"").decode("utf-8", errors="replace").encode("utf-8"))
        for name, value in record.headers or ()
    ]
    return clone


async def raw_decoder(message: Any) -> Any:
    """Hand the handler the consumer's own records (``raw_message``: one, or a batch's
    tuple), bytes untouched: validation is ours, with DLQ reasons.

    The handler then takes them as its body, its only parameter. A handler that also
    asked for the message (``msg: KafkaMessage``, a context field) had FastStream's
    dependency injection resolve it per call with a synchronous ``Context.use``, which
    fast-depends runs in anyio's worker thread: a thread round trip for every poll, on
    the loop's path, competing for the GIL with the processor's thread.
    """
    return message.raw_message
