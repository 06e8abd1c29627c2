"""Where a delivered message's microseconds go in a reader, stage by stage, without a server:
one synthetic pull (the bytes nats-server sends for `--messages` deliveries of `--size` bytes
over `--keys` subjects of one partition, each with its ack subject and the pin header) is pushed
through the steps a group slot's task runs, and each step's CPU per message is printed (best of
`--rounds`: the machine's other load only ever adds).

    python bench/stages.py [--messages 4096] [--keys 1000] [--size 100] [--read 32768]

The steps: the connection's parse into the inbox's columns (reads of `--read` bytes, as
nats-py reads its socket), the hand-out of the inbox to a pull's deliveries, the numbers of
their ack subjects, the slot's columns, the Arrow record batch, the ledger chunk's stored form,
and the acks' PUB commands at commit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats_spark.jetstream.pull import PIN_ID_HEADER, Deliveries  # noqa: E402
from nats_spark.jetstream.subjects import ack_numbers  # noqa: E402
from nats_spark.nats_py import RawInbox, RoutingParser  # noqa: E402
from nats_spark.spark.group_source.ledger import EntryDeliveries, encode_chunk  # noqa: E402
from nats_spark.spark.group_source.task.columns import SlotColumns  # noqa: E402

STREAM, CONSUMER, SID = "STAGES", "STAGES-g-m0", 7


def pull_wire(messages: int, keys: int, size: int, partition: int = 3) -> bytes:
    """What the server writes for one pull's deliveries: `HMSG`s with the pin header."""
    pin = f"NATS/1.0\r\n{PIN_ID_HEADER}: 4Mdn1pYbQxGGrVh2XkQ6Cz\r\n\r\n".encode()
    payload = os.urandom(size)
    stamp = time.time_ns()
    return b"".join(
        b"HMSG %d.%b.k%d %d $JS.ACK.%b.%b.1.%d.%d.%d.%d %d %d\r\n%b%b\r\n"
        % (
            partition,
            STREAM.encode(),
            i % keys,
            SID,
            STREAM.encode(),
            CONSUMER.encode(),
            1000 + i,
            1 + i,
            stamp + i,
            messages - i - 1,
            len(pin),
            len(pin) + size,
            pin,
            payload,
        )
        for i in range(messages)
    )


def _parse(wire: bytes, read: int) -> RawInbox:
    """The pull's bytes through the connection's parser, `read` bytes at a time."""
    parser = RoutingParser(None)  # type: ignore[arg-type]  # routed messages only
    inbox = RawInbox(lambda: None)
    parser.routes[SID] = inbox
    feed = parser.parse
    for start in range(0, len(wire), read):
        # Nothing in a routed message's parse awaits: each call ends at its first step.
        with contextlib.suppress(StopIteration):
            feed(wire[start : start + read]).send(None)
    return inbox


def _deliveries(inbox: RawInbox) -> Deliveries:
    chunk = Deliveries()
    chunk.extend(inbox.take(len(inbox)))
    return chunk


def _columns(deliveries: Deliveries) -> SlotColumns:
    columns = SlotColumns(STREAM, "m0", partitioned=True, include_headers=True)
    columns.extend(deliveries)
    return columns


def _best(
    step: Callable[[Any], Any], rounds: int, messages: int, given: Callable[[], Any]
) -> float:
    """The least CPU time of `rounds` runs of `step` on what `given()` makes (untimed), in µs
    per message."""
    best = float("inf")
    for _ in range(rounds):
        made = given()
        started = time.process_time()
        step(made)
        best = min(best, time.process_time() - started)
    return round(best / messages * 1e6, 3)


def stages(messages: int, keys: int, size: int, read: int, rounds: int) -> dict[str, float]:
    wire = pull_wire(messages, keys, size)
    deliveries = _deliveries(_parse(wire, read))
    columns = _columns(deliveries)
    recorded = EntryDeliveries.from_replies(deliveries.replies)
    assert columns.record_batch().num_rows == messages

    def timed(step: Callable[[Any], Any], given: Callable[[], Any] = lambda: None) -> float:
        return _best(step, rounds, messages, given)

    figures = {
        "parse": timed(lambda _: _parse(wire, read)),
        "hand_out": timed(_deliveries, lambda: _parse(wire, read)),
        "ack_numbers": timed(lambda _: ack_numbers(deliveries.replies)),
        "slot_columns": timed(lambda _: _columns(deliveries)),
        "record_batch": timed(lambda _: columns.record_batch()),
        "ledger_chunk": timed(lambda _: encode_chunk(recorded)),
        "ack_commands": timed(lambda _: recorded.ack_commands()),
    }
    figures["in_all"] = round(sum(figures.values()), 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=4096, help="deliveries in the pull")
    parser.add_argument("--keys", type=int, default=1000, help="distinct subjects")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--read", type=int, default=32768, help="bytes per socket read")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    figures = stages(args.messages, args.keys, args.size, args.read, args.rounds)
    print(json.dumps({"bench": "stages_cpu_us_per_msg", **vars(args), **figures}), flush=True)


if __name__ == "__main__":
    main()
