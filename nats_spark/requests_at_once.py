"""Independent requests to the server kept in flight together, a bounded number at a time: one
after the other, a batch's planning or a packed task paid a round trip per slot."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")

AT_ONCE = 64  # requests one caller keeps in flight


async def all_results(steps: Iterable[Awaitable[T]], at_once: int = AT_ONCE) -> list[T]:
    """The results of `steps` in their order, `at_once` at a time; the first failure once all
    have ended (none left running on the loop)."""
    pending = list(steps)
    results: list[T | BaseException] = []
    for start in range(0, len(pending), at_once):
        results += await asyncio.gather(*pending[start : start + at_once], return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]  # no exceptions among them
