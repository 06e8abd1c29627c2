"""The Arrow columns of a group slot's record batches, gathered as deliveries come in."""

from __future__ import annotations

import contextlib
import math

import pyarrow as pa
import pyarrow.compute as pc

from nats_spark import clock
from nats_spark.arrays import ARROW_FROM, bytes_array, int_array
from nats_spark.errors import NatsSparkError
from nats_spark.jetstream.pull import Deliveries
from nats_spark.pcg.partitioning import strip_partition
from nats_spark.spark.group_source.slot_partition import SlotPartition
from nats_spark.spark.shared.columns import (
    constant,
    headers_array,
    record_batch,
    timestamps_from_nanos,
)

_INT32_MAX = 2**31 - 1


class SlotColumns:
    """What the rows of one record batch of a group slot are made of, gathered as they come
    in; `partitioned`: subjects carry the group's partition token, split off here."""

    def __init__(
        self, stream: str, member: str | None, partitioned: bool, include_headers: bool
    ) -> None:
        self.stream, self.member = stream, member
        self.partitioned, self.include_headers = partitioned, include_headers
        self.subject: list[bytes] = []
        self.data: list[bytes] = []
        self.headers: list[bytes | None] = []  # raw header blocks
        self.stream_seq: list[int] = []
        self.consumer_seq: list[int] = []
        self.delivered: list[int] = []
        self.timestamp: list[int] = []
        # For the ack wait of what the rows took (siblings): the earliest the server may have
        # sent one of them (when its pull request went out) and when the last were taken in.
        self.requested = math.inf
        self.last_taken = -math.inf

    @classmethod
    def of(cls, partition: SlotPartition) -> SlotColumns:
        """Empty columns for the rows of `partition`'s slot."""
        return cls(
            partition.stream,
            partition.member,
            partition.partitioned,
            partition.reading.include_headers,
        )

    def __len__(self) -> int:
        return len(self.stream_seq)

    def taken_from(self, requested: float) -> None:
        """Rows were just taken from deliveries of a pull request sent at `requested`: a process
        paused between the server's send and this take makes them older than they look."""
        self.requested = min(self.requested, requested)
        self.last_taken = clock.monotonic()

    def add(
        self,
        subject: bytes,
        data: bytes,
        headers: bytes | None,
        delivered: int,
        stream_seq: int,
        consumer_seq: int,
        timestamp_ns: int,
    ) -> None:
        self.subject.append(subject)
        self.data.append(data)
        self.headers.append(headers)
        self.stream_seq.append(stream_seq)
        self.consumer_seq.append(consumer_seq)
        self.delivered.append(delivered)
        self.timestamp.append(timestamp_ns)

    def extend(self, deliveries: Deliveries) -> None:
        """Add all of `deliveries` (their ack subjects' numbers parsed), a column at a time."""
        delivered, stream_seq, consumer_seq, timestamp = deliveries.numbers
        self.subject += deliveries.subjects
        self.data += deliveries.data
        self.headers += deliveries.headers
        self.stream_seq += stream_seq
        self.consumer_seq += consumer_seq
        self.delivered += delivered
        self.timestamp += timestamp

    def take(self, deliveries: Deliveries, rows: list[int] | None) -> None:
        """Add `rows` of `deliveries` (None: all of them, a column at a time)."""
        if rows is None:
            self.extend(deliveries)
            return
        delivered, stream_seq, consumer_seq, timestamp = deliveries.numbers
        for i in rows:
            self.add(
                deliveries.subjects[i],
                deliveries.data[i],
                deliveries.headers[i],
                delivered[i],
                stream_seq[i],
                consumer_seq[i],
                timestamp[i],
            )

    def _subjects(self, n: int) -> tuple[pa.Array, pa.Array]:
        """The `subject` and `partition` columns; a group's stored `<partition>.<subject>` is
        split as a column (`_without_token`, else Arrow's regex), not subject by subject."""
        if not (self.partitioned and n):
            return bytes_array(self.subject, pa.string()), pa.nulls(n, pa.int32())
        # A partition's consumer reads one partition: its token is cut off by position.
        number, _ = strip_partition(self.subject[0].decode())
        if number <= _INT32_MAX:
            cut = self._without_token(f"{number}.".encode())
            if cut is not None:
                return cut, constant(number, n, pa.int32())
        subjects = bytes_array(self.subject, pa.string())
        parts = pc.extract_regex(subjects, r"^(?P<partition>[0-9]+)\.(?P<subject>.*)$")
        if not parts.null_count:
            with contextlib.suppress(pa.ArrowInvalid):  # a number too large for int32
                return parts.field("subject"), parts.field("partition").cast(pa.int32())
        for subject in self.subject:
            strip_partition(subject.decode())  # raises the error that explains the bad one
        raise NatsSparkError("a subject's partition token does not fit a 32-bit partition number")

    def _without_token(self, token: bytes) -> pa.Array | None:
        """The subjects without their first `token` (ASCII), None unless every one begins with
        it: cut in Python below `ARROW_FROM` rows, where Arrow's three kernel calls
        (about 45 µs each) cost more than the rows (at 256 partitions and a steady rate, a
        slot's batch of a few rows spent a tenth of its task's CPU on them)."""
        if len(self.subject) < ARROW_FROM:
            if not all(subject.startswith(token) for subject in self.subject):
                return None
            return bytes_array([subject[len(token) :] for subject in self.subject], pa.string())
        subjects = bytes_array(self.subject, pa.string())
        if not pc.all(pc.starts_with(subjects, token.decode())).as_py():
            return None
        return pc.utf8_slice_codeunits(subjects, len(token))

    def record_batch(self) -> pa.RecordBatch:
        subject, partition = self._subjects(len(self))
        return record_batch(
            subject=subject,
            data=self.data,
            headers=headers_array(self.headers, self.include_headers),
            partition=partition,
            member=self.member,
            stream=self.stream,
            stream_seq=self.stream_seq,
            consumer_seq=int_array(self.consumer_seq),
            delivered=int_array(self.delivered, pa.int32()),
            timestamp=timestamps_from_nanos(self.timestamp),
        )
