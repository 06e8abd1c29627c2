"""The source schema's Arrow columns, built per record batch: one home for what both formats'
readers emit (rows are gathered as Python lists; every conversion runs once per batch, from
buffers: see `nats_spark.arrays`)."""

from __future__ import annotations

import contextlib
import math
from array import array
from collections.abc import Sequence
from functools import lru_cache

import pyarrow as pa
import pyarrow.compute as pc

from nats_spark import clock
from nats_spark.arrays import TYPECODES, bytes_array, int_array
from nats_spark.errors import NatsSparkError
from nats_spark.jetstream.pull import PIN_ID_HEADER, Deliveries, header_values
from nats_spark.pcg.partitioning import strip_partition
from nats_spark.spark.shared.schema import SCHEMA_FIELDS

# Rows per record batch; the group source's ledger stores a task's deliveries in chunks of as
# many (384 KB raw at most, below the 1 MB payload limit).
CHUNK_MESSAGES = 16384
EMIT_BYTES = 4 << 20  # payload bytes that close a record batch early (large messages)
# Spark's type of each column of `SCHEMA_FIELDS` as Arrow holds it in the record batches
# `read()` yields: the schema is named once, there.
_ARROW_TYPES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "map<string,array<string>>": pa.map_(pa.string(), pa.list_(pa.string())),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in SCHEMA_FIELDS])
HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
TIMESTAMP_TYPE = ARROW_SCHEMA.field("timestamp").type
_NANOS_TYPE = pa.timestamp("ns", tz="UTC")
_INT32_MAX = 2**31 - 1


@lru_cache(maxsize=256)
def header_column(raw: bytes | None) -> tuple[tuple[bytes, tuple[bytes, ...]], ...]:
    """A message's entry in the `headers` column, UTF-8 encoded. Cached: most messages of a pull
    carry the same block (often just the pin)."""
    # Nats-Pin-Id is added per delivery, not stored: leaving it out keeps replays exact.
    return tuple(
        (key.encode(), tuple(value.encode() for value in values))
        for key, values in header_values(raw)
        if key != PIN_ID_HEADER
    )


def headers_array(blocks: Sequence[bytes | None], include: bool) -> pa.Array:
    """The `headers` map column from each row's raw header block (null when not `include`)."""
    if not include:
        return pa.nulls(len(blocks), HEADERS_TYPE)
    row_offsets, keys, values, value_offsets = [0], list[bytes](), list[bytes](), [0]
    # The usual pull carries no headers but the pin, the same block on every row: a map with
    # no entries per row, decided per distinct block rather than row by row.
    if not any(header_column(raw) for raw in set(blocks)):
        offsets = constant(0, len(blocks) + 1, pa.int32())
    else:
        for raw in blocks:
            if raw is not None:
                for key, items in header_column(raw):
                    keys.append(key)
                    values.extend(items)
                    value_offsets.append(len(values))
            row_offsets.append(len(keys))
        offsets = int_array(row_offsets, pa.int32())
    items_array = pa.ListArray.from_arrays(
        int_array(value_offsets, pa.int32()), bytes_array(values, pa.string())
    )
    key_array = bytes_array(keys, pa.string())
    return pa.MapArray.from_arrays(offsets, key_array, items_array, type=HEADERS_TYPE)


def timestamps_from_nanos(nanos: Sequence[int]) -> pa.Array:
    """The `timestamp` column from Unix nanoseconds (Spark keeps microseconds, truncated)."""
    return int_array(nanos).view(_NANOS_TYPE).cast(TIMESTAMP_TYPE, safe=False)


def timestamps_from_text(stamps: Sequence[bytes]) -> pa.Array:
    """The `timestamp` column from RFC 3339 times (nanoseconds), truncated to microseconds."""
    return text_timestamps(stamps).cast(TIMESTAMP_TYPE, safe=False)


def text_timestamps(stamps: Sequence[bytes]) -> pa.Array:
    """RFC 3339 times (nanoseconds, as JetStream writes them) as an Arrow timestamp column."""
    return bytes_array(stamps, pa.string()).cast(_NANOS_TYPE)


def constant(value: str | int | None, n: int, kind: pa.DataType) -> pa.Array:
    """A column with the same value (or null) in each of `n` rows."""
    if value is None:
        return pa.nulls(n, kind)
    if isinstance(value, int):
        return int_array(array(TYPECODES[kind], (value,)) * n, kind)
    raw = value.encode()  # a str: UTF-8 by construction
    offsets = (
        array("i", range(0, len(raw) * n + 1, len(raw))) if raw else array("i", (0,)) * (n + 1)
    )
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def record_batch(
    *,
    subject: pa.Array,
    data: Sequence[bytes],
    headers: pa.Array,
    partition: pa.Array,
    member: str | None,
    stream: str,
    stream_seq: Sequence[int],
    consumer_seq: pa.Array,
    delivered: pa.Array,
    timestamp: pa.Array,
) -> pa.RecordBatch:
    """One record batch of the source schema, its columns named rather than placed."""
    n = len(stream_seq)
    return pa.record_batch(
        [
            subject,
            bytes_array(data),
            headers,
            partition,
            constant(member, n, pa.string()),
            constant(stream, n, pa.string()),
            int_array(stream_seq),
            consumer_seq,
            delivered,
            timestamp,
        ],
        schema=ARROW_SCHEMA,
    )


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
        self.nbytes = 0
        # For the ack wait of what the rows took (siblings): the earliest the server may have
        # sent one of them (when its pull request went out) and when the last were taken in.
        self.requested = math.inf
        self.last_taken = -math.inf

    def __len__(self) -> int:
        return len(self.stream_seq)

    def taken_from(self, requested: float) -> None:
        """Rows were just taken from deliveries of a pull request sent at `requested`: a process
        paused between the server's send and this take makes them older than they look."""
        self.requested = min(self.requested, requested)
        self.last_taken = clock.monotonic()

    def full(self) -> bool:
        return len(self.stream_seq) >= CHUNK_MESSAGES or self.nbytes >= EMIT_BYTES

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
        self.nbytes += len(data)
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
        self.nbytes += sum(map(len, deliveries.data))
        self.headers += deliveries.headers
        self.stream_seq += stream_seq
        self.consumer_seq += consumer_seq
        self.delivered += delivered
        self.timestamp += timestamp

    def _subjects(self, n: int) -> tuple[pa.Array, pa.Array]:
        """The `subject` and `partition` columns; a group's stored `<partition>.<subject>` is
        split in Arrow, not row by row."""
        subjects = bytes_array(self.subject, pa.string())
        if not (self.partitioned and n):
            return subjects, pa.nulls(n, pa.int32())
        # A partition's consumer reads one partition: its token is cut off by position.
        number, _ = strip_partition(self.subject[0].decode())
        token = f"{number}."
        if number <= _INT32_MAX and pc.all(pc.starts_with(subjects, token)).as_py():
            return pc.utf8_slice_codeunits(subjects, len(token)), constant(number, n, pa.int32())
        parts = pc.extract_regex(subjects, r"^(?P<partition>[0-9]+)\.(?P<subject>.*)$")
        if not parts.null_count:
            with contextlib.suppress(pa.ArrowInvalid):  # a number too large for int32
                return parts.field("subject"), parts.field("partition").cast(pa.int32())
        for subject in self.subject:
            strip_partition(subject.decode())  # raises the error that explains the bad one
        raise NatsSparkError("a subject's partition token does not fit a 32-bit partition number")

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
