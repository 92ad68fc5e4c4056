"""The hang report of ``tests/conftest.py``: a test about to time out prints its loop's tasks.

In a CI run a test hung for 300 s and printed no tasks: the report scanned every object
with ``isinstance``, a deprecated torch object warned on ``__class__``, and under
``filterwarnings = error`` the warning ended the report (and became a teardown error).
"""

from __future__ import annotations

import asyncio
import warnings

from tests.conftest import _running_loops


class _WarnsOnClass:
    """Like ``torch.distributed.reduce_op``: reading ``__class__`` warns."""

    def __getattribute__(self, name: str) -> object:
        if name == "__class__":
            warnings.warn("deprecated", FutureWarning, stacklevel=2)
        return object.__getattribute__(self, name)


async def test_the_running_loop_is_found_past_an_object_that_warns_on_its_class() -> None:
    deprecated = _WarnsOnClass()
    assert asyncio.get_running_loop() in _running_loops()
    assert type(deprecated) is _WarnsOnClass  # kept alive through the scan
