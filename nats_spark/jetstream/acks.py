"""Ack reply subjects: what they say about a delivery, and acks published in bulk."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from nats.aio.client import Client as NATS

ACK = b"+ACK"


class Delivery(NamedTuple):
    """The metadata a JetStream delivery carries in its reply subject."""

    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    pending: int


def parse_reply(reply: str) -> Delivery:
    """Parse `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` (v1, 9
    tokens) or the v2 form with domain and account hash before the stream (11+ tokens)."""
    tokens = reply.split(".")
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        raise ValueError(f"{reply!r} is not a JetStream ack subject")
    at = 2 if len(tokens) == 9 else 4
    return Delivery(
        tokens[at],
        tokens[at + 1],
        int(tokens[at + 2]),
        int(tokens[at + 3]),
        int(tokens[at + 4]),
        int(tokens[at + 5]),
        int(tokens[at + 6]),
    )


async def publish_acks(nc: NATS, replies: Iterable[str]) -> int:
    """Ack every delivery in `replies` and wait until the server has them all; returns the count.

    Acks are plain publishes pipelined on the connection; one flush at the end confirms that the
    server received all of them.
    """
    count = 0
    for reply in replies:
        await nc.publish(reply, ACK)
        count += 1
    if count:
        await nc.flush(timeout=30)
    return count
