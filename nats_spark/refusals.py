"""The publishes a server refused on one connection.

nats-server answers a publish the user may not send with an asynchronous `-ERR 'Permissions
Violation for Publish to "<subject>"'` and nothing else: a request to such a subject would wait
out its whole timeout. `Refusals` keeps them in order (callers check what was refused since a
point, after a flush) and wakes a request waiting on a subject as soon as it is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Refusals(list[str]):
    """The connection's permission violations, as nats-py reports them (lowercased)."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting: dict[str, set[asyncio.Future[str]]] = {}
        self._listeners: list[Callable[[str], None]] = []

    def append(self, refusal: str) -> None:
        super().append(refusal)
        for listener in self._listeners:
            listener(refusal)
        for subject, waiters in self._waiting.items():
            if f'"{subject}"' in refusal:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(refusal)

    def watch(self, subject: str) -> asyncio.Future[str]:
        """A future set to the next refusal of a publish to `subject` (`unwatch` it after)."""
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(subject.lower(), set()).add(waiter)
        return waiter

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call `listener` with every refusal from now on (requests that keep their subjects
        themselves, `RoutedRequests`, instead of a future per request)."""
        self._listeners.append(listener)

    def unwatch(self, subject: str, waiter: asyncio.Future[str]) -> None:
        waiters = self._waiting.get(subject.lower(), set())
        waiters.discard(waiter)
        if not waiters:
            self._waiting.pop(subject.lower(), None)
