"""Baseline: a plain nats-py pull loop in one process (fetch 1000, ack every message)."""

from __future__ import annotations

import time

import nats
from nats.errors import TimeoutError as NatsTimeout


async def nats_py_pull_loop(
    url: str, stream: str, count: int, durable: str = "baseline", batch: int = 1000
) -> dict:
    """Read and ack `count` messages of `stream` with `js.pull_subscribe` + `fetch(batch)`, as
    the new durable consumer `durable`."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(f"*.{stream}.*", durable=durable, stream=stream)
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
