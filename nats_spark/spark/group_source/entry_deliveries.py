"""The deliveries a ledger entry records, and their stored form (see `ledger` for the layout).

Pure: no I/O; unit tests in tests/spark/group_source/test_ledger_codec.py.
"""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, pairwise

import pyarrow as pa
import pyarrow.compute as pc

from nats_spark.arrays import int_array, string_scalar
from nats_spark.jetstream.acks import ACK, ack_commands, ack_prefix
from nats_spark.jetstream.subjects import ack_numbers
from nats_spark.spark.shared.columns import BATCH_ROWS

# The ledger stores a task's deliveries in chunks of a record batch's rows (384 KB raw at most,
# below the 1 MB payload limit).
CHUNK_MESSAGES = BATCH_ROWS
_CODEC = pa.Codec("zstd", compression_level=3)  # level 1 barely shortens long repeats
_COLUMNS = 3  # stream sequence and consumer sequence (as differences), delivery count
_WORD = 8
# Deliveries from which `EntryDeliveries.ack_commands` formats with Arrow (about where both ways
# cost the same); the ack subject's timestamp and pending, which the server does not read.
ARROW_FROM = 400
_UNREAD = b"0.0"


@dataclass
class EntryDeliveries:
    """Deliveries a ledger entry recorded, in the order they were taken: the numbers of each
    one's ack subject, and the subject's prefix up to the delivery count (the same for all
    deliveries of one consumer)."""

    prefix: bytes = b""
    stream_seq: list[int] = field(default_factory=list)
    consumer_seq: list[int] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.stream_seq)

    def extend(self, other: EntryDeliveries) -> None:
        if other.prefix and self.prefix and other.prefix != self.prefix:
            raise ValueError(f"deliveries of {other.prefix!r} added to {self.prefix!r}")
        self.prefix = self.prefix or other.prefix
        self.stream_seq += other.stream_seq
        self.consumer_seq += other.consumer_seq
        self.delivered += other.delivered

    def without(self, dropped: set[int]) -> EntryDeliveries:
        """The deliveries whose stream sequence is not in `dropped`."""
        rows = [i for i, seq in enumerate(self.stream_seq) if seq not in dropped]
        return EntryDeliveries(
            self.prefix,
            [self.stream_seq[i] for i in rows],
            [self.consumer_seq[i] for i in rows],
            [self.delivered[i] for i in rows],
        )

    def part(self, start: int, stop: int) -> EntryDeliveries:
        return EntryDeliveries(
            self.prefix,
            self.stream_seq[start:stop],
            self.consumer_seq[start:stop],
            self.delivered[start:stop],
        )

    def ack_commands(self, kind: bytes = ACK, block: int = 4096) -> list[bytes]:
        """`ack_commands` for these deliveries (`kind`: or restart their ack wait), their ack
        subjects rebuilt from the prefix and the numbers the server reads; timestamp and pending
        are 0, which it does not. Many are formatted by Arrow's string kernels: a block's
        commands end to end in one buffer, no Python step per delivery; a few in Python, where
        the kernels' fixed cost (tens of microseconds) is more than the steps."""
        columns = (self.delivered, self.stream_seq, self.consumer_seq)
        if len(self) < ARROW_FROM:
            subjects = [
                b"%b.%d.%d.%d.%b" % (self.prefix, *numbers, _UNREAD)
                for numbers in zip(*columns, strict=True)
            ]
            return ack_commands(subjects, kind, block)
        numbers = (int_array(column).cast(pa.string()) for column in columns)
        head = string_scalar(b"PUB " + self.prefix)
        tail = string_scalar(_UNREAD + b" 4\r\n%b\r\n" % kind)
        commands = pc.binary_join_element_wise(head, *numbers, tail, string_scalar(b"."))
        offsets, data = (memoryview(buffer) for buffer in commands.buffers()[1:])
        ends = [*range(0, len(commands), block), len(commands)]
        return [
            data[offsets.cast("i")[start] : offsets.cast("i")[end]].tobytes()
            for start, end in pairwise(ends)
        ]

    @classmethod
    def from_replies(cls, replies: Sequence[bytes]) -> EntryDeliveries:
        """From ack reply subjects as the server sent them (one consumer's)."""
        delivered, stream_seq, consumer_seq, _ = ack_numbers(replies)
        return cls(ack_prefix(replies[0]) if replies else b"", stream_seq, consumer_seq, delivered)


def encode_chunk(found: EntryDeliveries) -> bytes:
    """A chunk's stored form (format 2): the count, then the columns, zstd-compressed."""
    columns = array("q", _differences(found.stream_seq))
    columns += array("q", _differences(found.consumer_seq))
    columns += array("q", found.delivered)
    if sys.byteorder == "big":
        columns.byteswap()
    return len(found).to_bytes(4, "little") + _CODEC.compress(columns.tobytes(), asbytes=True)


def decode_chunk(data: bytes, prefix: bytes) -> EntryDeliveries:
    count = int.from_bytes(data[:4], "little")
    if not count:
        return EntryDeliveries(prefix)
    columns = array("q")
    columns.frombytes(_CODEC.decompress(data[4:], count * _COLUMNS * _WORD, asbytes=True))
    if sys.byteorder == "big":
        columns.byteswap()
    return EntryDeliveries(
        prefix,
        list(accumulate(columns[:count])),
        list(accumulate(columns[count : 2 * count])),
        columns[2 * count :].tolist(),
    )


def _differences(values: list[int]) -> map[int]:
    return map(operator.sub, values, chain((0,), values))


def decode_replies(data: bytes) -> list[bytes]:
    """A format 1 chunk's reply subjects (releases before format 2 wrote those)."""
    size = int.from_bytes(data[:4], "little")
    if not size:
        return []
    return _CODEC.decompress(data[4:], size, asbytes=True).split(b"\n")
