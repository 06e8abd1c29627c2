"""The source schema's Arrow columns, built per record batch, and how large a batch gets: one
home for what both formats' readers emit (rows are gathered as Python lists; every conversion
runs once per batch, from buffers: see `nats_spark.arrays`)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import lru_cache

import pyarrow as pa

from nats_spark.arrays import TYPECODES, bytes_array, int_array
from nats_spark.jetstream.pull import PIN_ID_HEADER, header_values
from nats_spark.spark.shared.schema import SCHEMA_FIELDS

BATCH_ROWS = 16384  # rows per record batch
BATCH_BYTES = 4 << 20  # payload bytes that close a record batch early (large messages)
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
# Rows from which a column is converted by an Arrow kernel: below, its fixed cost (several
# microseconds a call) is more than Python's steps, which give the same column.
KERNEL_FROM = 128


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
    # The usual pull carries no headers but the pin, the same block on every row: a map with
    # no entries per row, decided per distinct block rather than row by row.
    if not any(header_column(raw) for raw in set(blocks)):
        offsets = constant(0, len(blocks) + 1, pa.int32()).buffers()[1]
        return pa.Array.from_buffers(
            HEADERS_TYPE, len(blocks), [None, offsets], children=[_NO_ENTRIES]
        )
    row_offsets, keys, values, value_offsets = [0], list[bytes](), list[bytes](), [0]
    for raw in blocks:
        if raw is not None:
            for key, items in header_column(raw):
                keys.append(key)
                values.extend(items)
                value_offsets.append(len(values))
        row_offsets.append(len(keys))
    return _headers(row_offsets, keys, values, value_offsets)


def _headers(
    row_offsets: list[int], keys: list[bytes], values: list[bytes], value_offsets: list[int]
) -> pa.MapArray:
    """A `headers` column: row i's entries are `keys[row_offsets[i]:row_offsets[i + 1]]`, key
    j's values `values[value_offsets[j]:value_offsets[j + 1]]`."""
    items = pa.ListArray.from_arrays(
        int_array(value_offsets, pa.int32()), bytes_array(values, pa.string())
    )
    keys_array = bytes_array(keys, pa.string())
    offsets = int_array(row_offsets, pa.int32())
    return pa.MapArray.from_arrays(offsets, keys_array, items, type=HEADERS_TYPE)


# The entries of a `headers` column none of whose rows has any: its map offsets are all 0.
_NO_ENTRIES = _headers([0], [], [], [0]).values


def batch_full(rows: int, nbytes: int) -> bool:
    """Whether a record batch of `rows` rows and `nbytes` payload bytes is as large as one gets."""
    return rows >= BATCH_ROWS or nbytes >= BATCH_BYTES


def timestamps_from_nanos(nanos: Sequence[int]) -> pa.Array:
    """The `timestamp` column from Unix nanoseconds (Spark keeps microseconds, truncated toward
    zero, as Arrow's cast does)."""
    if len(nanos) >= KERNEL_FROM:
        return int_array(nanos).view(_NANOS_TYPE).cast(TIMESTAMP_TYPE, safe=False)
    return int_array(t // 1000 if t >= 0 else -(-t // 1000) for t in nanos).view(TIMESTAMP_TYPE)


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
    # A str, UTF-8 by construction: one value taken n times (Arrow copies it in C; offsets made
    # from a Python range cost 15 ns a row), or for a few rows repeated in Python.
    encoded = value.encode()
    if n >= KERNEL_FROM:
        return bytes_array([encoded], kind).take(constant(0, n, pa.int32()))
    return bytes_array([encoded] * n, kind)


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
