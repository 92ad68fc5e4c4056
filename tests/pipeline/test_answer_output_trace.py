"""A verdict's trace record continues and links what ``PendingRequest`` says it should.

``answer_output`` asks for the links only when the request has a parent (no input's
trace context could be read otherwise, so none could be linked): these hold that
shortcut to the full walk's answer for any mix of headers on any inputs.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.pipeline.join import InputRef, PendingRequest
from sidecar.pipeline.outputs import answer_output

PARENT = ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
OTHER = ("traceparent", b"00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01")
THIRD = ("traceparent", b"00-2cf7651916cd43dd8448eb211c80319c-d7ad6b7169203331-01")
BROKEN = ("traceparent", b"not-a-traceparent")
UNTRACED = ("x-other", b"1")
HEADERS = st.lists(st.sampled_from([PARENT, OTHER, THIRD, BROKEN, UNTRACED]), max_size=3).map(tuple)


def _entry(headers: list[tuple[tuple[str, bytes], ...]], final: int | None) -> PendingRequest:
    entry = PendingRequest(request_id="r", first_seen_ms=0.0)
    entry.refs = [InputRef("t", 0, n, h) for n, h in enumerate(headers)]
    if final is not None and headers:
        entry.final_headers = headers[final % len(headers)]
    return entry


@given(st.lists(HEADERS, max_size=5), st.none() | st.integers(0, 4))
def test_the_verdict_continues_and_links_what_the_full_walk_finds(
    headers: list[tuple[tuple[str, bytes], ...]], final: int | None
) -> None:
    entry = _entry(headers, final)
    parent = entry.trace_parent()
    trace = answer_output(entry, b"{}", "k", attributes={}, end_ns=1).outputs[0].trace
    assert trace is not None
    assert trace.parent == parent
    assert trace.links == entry.trace_links(parent)


def test_inputs_in_other_traces_than_the_parent_are_linked() -> None:
    entry = _entry([(OTHER,), (THIRD,), (PARENT,)], final=2)
    trace = answer_output(entry, b"{}", "k", attributes={}, end_ns=1).outputs[0].trace
    assert trace is not None
    assert trace.parent == (PARENT,)
    assert trace.links == ((OTHER,), (THIRD,))
