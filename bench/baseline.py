"""Baseline: a plain nats-py pull loop in one process (fetch 1000, ack every message), through
a consumer of the whole stream without a filter (the cheapest kind for the server)."""

from __future__ import annotations

import time

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import ConsumerConfig


async def nats_py_pull_loop(
    url: str,
    stream: str,
    count: int,
    durable: str = "baseline",
    batch: int = 1000,
    max_ack_pending: int | None = None,
) -> dict:
    """Read and ack `count` messages of `stream` with `fetch(batch)`, as the new unfiltered
    durable consumer `durable` (`max_ack_pending`: the server's default when None, -1 for
    unbounded)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        config = ConsumerConfig(
            durable_name=durable, ack_policy="explicit", max_ack_pending=max_ack_pending
        )
        await js.add_consumer(stream, config)
        sub = await js.pull_subscribe_bind(durable, stream)
        got = 0
        payload = 0
        start = time.perf_counter()
        while got < count:
            try:
                messages = await sub.fetch(batch, timeout=5)
            except NatsTimeout:
                break
            for msg in messages:
                payload += len(msg.data)
                await msg.ack()
            got += len(messages)
        await nc.flush()
        elapsed = time.perf_counter() - start
        return {
            "messages": got,
            "seconds": round(elapsed, 3),
            "msgs_per_s": round(got / elapsed),
            "mib_per_s": round(payload / elapsed / 2**20, 1),
        }
    finally:
        await nc.close()
