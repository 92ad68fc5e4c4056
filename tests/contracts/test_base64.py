"""The attention summary's base64 decoder answers exactly as ``base64.b64decode(validate=True)``.

``b64decode_strict`` hands the text to pydantic-core's decoder when only one reading
is possible and to the stdlib otherwise: the same bytes or the same error (type and
message, which reach the dead letter's detail) on every text, valid or not.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.contracts.inputs import b64decode_strict


def _outcome(decode: Callable[[str], bytes], text: str) -> tuple[str, object]:
    try:
        return "bytes", decode(text)
    except (binascii.Error, ValueError) as exc:
        return type(exc).__name__, str(exc)


def _stdlib(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


# A (0), Q, g, w: the four top-two-bit patterns, so padded ends are canonical or not;
# + and / (standard), - and _ (url-safe), the padding, JSON's escape and quote, space,
# a newline, a non-ASCII letter
_SYMBOLS = 'AQgw09+/-_=\\" \né'


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(st.text(alphabet=_SYMBOLS, max_size=16))
@example("")
@example("AB==")  # a non-canonical last symbol: the stdlib reads it, pydantic-core does not
@example("A\\u0041AA")  # a JSON escape would spell "AAAA"
@example("AA=A")
@example("====")
@example("QUI=-A==")
def test_every_text_decodes_as_the_stdlib_does(text: str) -> None:
    assert _outcome(b64decode_strict, text) == _outcome(_stdlib, text)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    data=st.binary(max_size=64),
    at=st.integers(min_value=0, max_value=200),
    symbol=st.sampled_from(_SYMBOLS),
    how=st.sampled_from(["keep", "replace", "insert", "drop"]),
)
def test_encodings_and_their_one_symbol_mutations_decode_as_the_stdlib_does(
    data: bytes, at: int, symbol: str, how: str
) -> None:
    text = base64.b64encode(data).decode("ascii")
    i = at % (len(text) + 1)
    if how == "replace" and i < len(text):
        text = text[:i] + symbol + text[i + 1 :]
    elif how == "insert":
        text = text[:i] + symbol + text[i:]
    elif how == "drop" and i < len(text):
        text = text[:i] + text[i + 1 :]
    assert _outcome(b64decode_strict, text) == _outcome(_stdlib, text)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 1620, 3 * 1024 * 30 * 9])
def test_summaries_of_every_size_decode_to_their_bytes(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    assert b64decode_strict(base64.b64encode(data).decode("ascii")) == data
