"""Running a stream reader's driver calls (coroutines) to the end from Spark's synchronous calls.

Spark makes the stream readers in processes that never call them (the processes that create a
source and plan its read): the event loop, and asyncio with it, are imported on the first call.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def wait(coroutine: Coroutine[Any, Any, T]) -> T:
    """`coroutine`'s result, run on this process's event loop."""
    from nats_spark.loop import run_sync

    return run_sync(coroutine)
