"""One asyncio event loop per process, on a daemon thread, for synchronous callers (Spark tasks).

Spark forks Python workers from a daemon process, so the loop is keyed by pid: a forked child gets
a loop of its own instead of inheriting a dead thread.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None


def _new_lock_in_child() -> None:
    # A parent thread may have held the lock while another forked; nothing releases it here.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def event_loop() -> asyncio.AbstractEventLoop:
    """This process's background event loop, started on first use."""
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="nats-spark-loop", daemon=True).start()
            ready.wait()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run `coro` on the process loop and wait for its result (from any thread but the loop's)."""
    loop = event_loop()
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise


class Blocking(Generic[T]):
    """Synchronous view of an async object: its coroutine methods run on the process loop."""

    def __init__(self, target: T) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.target, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: run_sync(attr(*args, **kwargs))
        return attr
