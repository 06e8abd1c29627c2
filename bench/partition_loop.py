"""The plainest reader of a partitioned stream, for `bench/latency.py`: a tuned nats-py loop that
reads every partition through a consumer of its own, as a micro-batch of the connector does.

Each round (every `trigger` seconds; 0: back to back) pulls from all P partitions' consumers at
once (a `no_wait` pull request each, answered with what is there and a status), acks each
message and flushes. What it costs at P partitions, against what the connector's batch costs
there, separates what every reader of P consumers pays (the server keeps and scans per
consumer) from the connector's own per-partition work.

Raw pull requests, not nats-py's `fetch`: `fetch` sends its first pull with `expires`, which
makes the server keep it open; what that pull gets after `fetch` returned waits in the
subscription for the next round, a second later.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import nats
from nats.js.api import ConsumerConfig


class _Partition:
    """One partition's consumer and the inbox its pulls are answered on."""

    def __init__(self, stream: str, consumer: str) -> None:
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.messages: list[Any] = []
        self.batch = 0
        self.ended: asyncio.Future[None] | None = None

    async def on_message(self, message: Any) -> None:
        status = message.headers and message.headers.get("Status")  # 404/408: nothing more
        if not status:
            self.messages.append(message)
        if (status or len(self.messages) == self.batch) and self.ended and not self.ended.done():
            self.ended.set_result(None)

    async def pull(self, nc: Any, inbox: str, batch: int) -> list[Any]:
        """What a `no_wait` pull of `batch` gets: messages until the server's status ends it
        (or the batch is full, which ends it without one)."""
        self.messages, self.batch = [], batch
        self.ended = asyncio.get_running_loop().create_future()
        request = json.dumps({"batch": batch, "no_wait": True}).encode()
        await nc.publish(self.subject, request, inbox)
        await self.ended
        return self.messages


async def read_rounds(
    url: str,
    stream: str,
    partitions: int,
    trigger: float,
    batch: int,
    until: Callable[[int], bool],
) -> tuple[list[tuple[float, float, float]], list[float]]:
    """Read `stream`'s `partitions` in rounds until `until(messages read)` says stop; returns
    (stored, in hand, acked) per message and the seconds of each round that read some."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    readers: list[tuple[_Partition, str]] = []
    for partition in range(partitions):
        config = ConsumerConfig(
            durable_name=f"p{partition}",
            filter_subject=f"{partition}.>",
            ack_policy="explicit",
            max_ack_pending=-1,
        )
        await js.add_consumer(stream, config)
        reader, inbox = _Partition(stream, f"p{partition}"), nc.new_inbox()
        await nc.subscribe(inbox, cb=reader.on_message)
        readers.append((reader, inbox))
    times: list[tuple[float, float, float]] = []
    rounds: list[float] = []
    try:
        while not until(len(times)):
            started = time.time()
            pulled = await asyncio.gather(*(r.pull(nc, inbox, batch) for r, inbox in readers))
            in_hand = time.time()
            messages = [m for ms in pulled for m in ms]
            for message in messages:
                await message.ack()
            await nc.flush()
            acked = time.time()
            if messages:
                rounds.append(acked - started)
            times += [(m.metadata.timestamp.timestamp(), in_hand, acked) for m in messages]
            await asyncio.sleep(max(0.0, started + trigger - time.time()))
    finally:
        await nc.close()
    return times, rounds
