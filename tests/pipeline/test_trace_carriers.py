"""Which inputs' headers a verdict's span continues and links (``PendingRequest``).

The headerless case returns at once (no input carried a header: tracing is off
upstream); these hold that shortcut to the full walk's answers in every case.
"""

from __future__ import annotations

from sidecar.pipeline.join import InputRef, PendingRequest

PARENT = ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
OTHER = ("traceparent", b"00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01")
BROKEN = ("traceparent", b"not-a-traceparent")


def _entry(*headers: tuple[tuple[str, bytes], ...], final: int | None = None) -> PendingRequest:
    entry = PendingRequest(request_id="r", first_seen_ms=0.0)
    entry.refs = [InputRef("t", 0, n, h) for n, h in enumerate(headers)]
    if final is not None:
        entry.final_headers = headers[final]
    return entry


def test_a_request_whose_inputs_carry_no_header_has_no_parent_and_no_links() -> None:
    entry = _entry((), (), (), final=2)
    assert entry.trace_parent() == ()
    assert entry.trace_links(entry.trace_parent()) == ()
    assert _entry().trace_parent() == ()


def test_a_header_on_any_input_is_still_found() -> None:
    entry = _entry((PARENT,), (), (), final=2)  # only the retrieval is traced
    assert entry.trace_parent() == (PARENT,)
    assert entry.trace_links((PARENT,)) == ()
    other = _entry((OTHER,), (), (PARENT,), final=2)  # two traces: the other one is linked
    assert other.trace_parent() == (PARENT,)
    assert other.trace_links((PARENT,)) == ((OTHER,),)


def test_an_unreadable_final_parent_gives_way_to_a_readable_input() -> None:
    entry = _entry((PARENT,), (), (BROKEN,), final=2)
    assert entry.trace_parent() == (PARENT,)
    only_broken = _entry((), (), (BROKEN,), final=2)
    assert only_broken.trace_parent() == (BROKEN,)
    assert only_broken.trace_links(only_broken.trace_parent()) == ()
    untraced_headers = _entry((("x-other", b"1"),), (), (), final=2)
    assert untraced_headers.trace_parent() == ()
