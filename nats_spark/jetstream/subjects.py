"""What ack subjects say about deliveries (subject names and patterns: `subject_names.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from nats_spark.jetstream.acks import delivered_at


class AckNumbers(NamedTuple):
    """What rows need from a run of deliveries' ack subjects, as columns in their order."""

    delivered: list[int]
    stream_seq: list[int]
    consumer_seq: list[int]
    timestamp_ns: list[int]


def ack_numbers(replies: Sequence[bytes]) -> AckNumbers:
    """Delivery count, stream and consumer sequence and time of each ack subject in `replies`:
    `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` (v1, 9 tokens) or the
    v2 form with domain and account hash before the stream (11+). Subjects of one consumer (the
    first one's tokens before the numbers, as many tokens in all) are parsed together: one join,
    one split, a conversion per column, no Python step per subject. Any other mix is parsed one
    by one; a subject that is no ack subject raises ValueError naming it."""
    n = len(replies)
    if not n:
        return AckNumbers([], [], [], [])
    first = replies[0].split(b".")
    at = delivered_at(first, replies[0])
    prefix = b".".join(first[:at]) + b"."
    joined = b"\n".join(replies)  # subjects hold no whitespace
    if joined.startswith(prefix) and joined.count(b"\n" + prefix) == n - 1:
        # Every subject starts with the prefix: keep their numbers, set apart by a lone space.
        tokens = joined[len(prefix) :].replace(b"\n" + prefix, b". .").split(b".")
        stride = len(first) - at + 1
        if len(tokens) == stride * n - 1 and tokens[stride - 1 :: stride].count(b" ") == n - 1:
            return AckNumbers(*(list(map(int, tokens[k::stride])) for k in range(4)))
    numbers = AckNumbers([], [], [], [])
    for reply in replies:
        tokens = reply.split(b".")
        at = delivered_at(tokens, reply)
        for column, token in zip(numbers, tokens[at : at + 4], strict=True):
            column.append(int(token))
    return numbers
