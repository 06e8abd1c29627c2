"""How a pull hands out its deliveries: a few buffered ones wait a moment for more (each chunk
costs its reader about the same whatever it holds), a status is taken at once. The parser's
appends are simulated on the process loop; no server."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from nats_spark.jetstream import pull as pull_module
from nats_spark.jetstream.pull import Pull, PullConsumer
from nats_spark.loop import run_sync

pytestmark = pytest.mark.unit

REPLY = "_INBOX.test.1"
TIMEOUT = b"NATS/1.0 408 Request Timeout\r\n\r\n"


def arrive(consumer: PullConsumer, count: int, status: bytes | None = None) -> None:
    """What the parser does after a read: append to the inbox, then wake its reader."""
    inbox = consumer._received
    for i in range(count):
        inbox.subjects.append(b"S.k")
        inbox.replies.append(b"$JS.ACK.S.c.1.%d.%d.0.0" % (i + 1, i + 1))
        inbox.data.append(b"x")
        inbox.headers.append(None)
    if status is not None:
        inbox.subjects.append(REPLY.encode())
        inbox.replies.append(b"")
        inbox.data.append(b"")
        inbox.headers.append(status)
    inbox.arrived()


async def chunks(script: list[tuple[float, int, bytes | None]]) -> list[tuple[int, float]]:
    """Run `script` (after seconds, deliveries, status) against one pull of 1,000: the size of
    each chunk it hands out and when."""
    consumer = PullConsumer(
        SimpleNamespace(new_inbox=lambda: "_INBOX.test", is_closed=False), "S", "c"
    )  # type: ignore[arg-type]
    consumer._live[REPLY.encode()] = time.monotonic() + 10
    loop = asyncio.get_running_loop()
    for after, count, status in script:
        loop.call_later(after, arrive, consumer, count, status)
    started = time.monotonic()
    pull = Pull(consumer, REPLY, 1000, expires=1.0, quiet=None)
    return [(len(chunk), time.monotonic() - started) async for chunk in pull]


def test_a_few_deliveries_wait_a_moment_for_more() -> None:
    got = run_sync(chunks([(0, 3, None), (0.0005, 2, None), (0.05, 4, TIMEOUT)]))
    assert [size for size, _ in got] == [5, 4]
    assert got[0][1] < 0.04, "the first chunk waited for more than a moment"


def test_a_status_is_taken_at_once() -> None:
    got = run_sync(chunks([(0, 2, TIMEOUT)]))
    assert [size for size, _ in got] == [2]
    assert got[0][1] < pull_module.GATHER_SECONDS


def test_a_full_chunk_is_handed_out_at_once() -> None:
    full = pull_module.GATHER_DELIVERIES
    got = run_sync(chunks([(0, full, None), (0.05, 1, TIMEOUT)]))
    assert [size for size, _ in got] == [full, 1]
    assert got[0][1] < pull_module.GATHER_SECONDS
