"""The join store makes room tenant by tenant: whoever holds the most gives up its oldest."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.pipeline.join import JoinStore, PendingRequest

TENANTS = ("acme", "evil", "zeta", None)

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["hold", "close", "expire"]),
        st.integers(0, 11),  # request
        st.sampled_from(TENANTS),
        st.integers(1, 400),  # bytes
    ),
    max_size=80,
)


def _key(request: int, tenant: str | None) -> str:
    return f"r{request}" if tenant is None else f"{tenant}/r{request}"


@settings(max_examples=400, deadline=None)
@given(ops=_OPS)
def test_room_is_made_from_the_largest_tenant_oldest_first(
    ops: list[tuple[str, int, str | None, int]],
) -> None:
    store = JoinStore(max_entries=5, ttl_ms=20.0, max_bytes=1_000)
    opened: dict[str, float] = {}  # key -> when (open order)
    for now, (op, request, tenant, size) in enumerate(ops):
        key = _key(request, tenant)
        if op == "hold":
            entry = store.open(key, float(now), request_id=f"r{request}", tenant=tenant)
            opened.setdefault(key, float(now))
            counts = Counter(_owner(e) for e in _open(store))  # the new one included
            for gone in store.make_room(entry):
                _check_oldest_of_its_tenant(gone, entry, opened, store)
                assert counts[_owner(gone)] == max(counts.values())
                counts[_owner(gone)] -= 1
                del opened[gone.key]
            weights: Counter[str] = Counter()
            for e in _open(store):
                weights[_owner(e)] += e.bytes_held
            weights[_owner(entry)] += size
            for gone in store.hold_bytes(entry, size):
                _check_oldest_of_its_tenant(gone, entry, opened, store)
                heavier = [o for o, w in weights.items() if w > weights[_owner(gone)]]
                # a heavier tenant is passed over only when all it holds is ``entry``
                assert all(all(e is entry for e in _open(store) if _owner(e) == o) for o in heavier)
                weights[_owner(gone)] -= gone.bytes_held
                del opened[gone.key]
        elif op == "close":
            if store.close(key, float(now)) is not None:
                del opened[key]
        else:
            for gone in store.expire(float(now)):
                del opened[gone.key]
        assert _keys(store) == set(opened)
        assert len(store) <= 5
        assert store.bytes_held == sum(e.bytes_held for e in _open(store))
        held: Counter[str] = Counter()
        for e in _open(store):
            held[_owner(e)] += e.bytes_held
        assert store._owner_bytes == {o: held[o] for o in {_owner(e) for e in _open(store)}}
        assert store.bytes_held <= 1_000 or len(store) == 1


def _open(store: JoinStore) -> list[PendingRequest]:
    return list(store._open.values())


def _keys(store: JoinStore) -> set[str]:
    return set(store._open)


def _owner(entry: PendingRequest) -> str:
    return entry.tenant or ""


def _check_oldest_of_its_tenant(
    gone: PendingRequest, entry: PendingRequest, opened: dict[str, float], store: JoinStore
) -> None:
    """``gone`` is never ``entry``, and the oldest of its tenant's other open requests."""
    assert gone is not entry and gone.key not in store._open
    rivals = [e.key for e in _open(store) if _owner(e) == _owner(gone) and e is not entry]
    assert all(opened[gone.key] <= opened[k] for k in rivals)
