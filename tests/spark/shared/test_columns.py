"""The Arrow columns both formats' readers emit (columns), against pyarrow's own conversion of
the same rows, and built without importing pandas into the worker."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from nats_spark.arrays import ARROW_FROM
from nats_spark.errors import NatsSparkError
from nats_spark.jetstream.pull import Deliveries
from nats_spark.spark.group_source.task.columns import SlotColumns
from nats_spark.spark.shared.columns import (
    HEADERS_TYPE,
    KERNEL_FROM,
    TIMESTAMP_TYPE,
    bytes_array,
    constant,
    headers_array,
    int_array,
    timestamps_from_nanos,
    timestamps_from_text,
)

pytestmark = pytest.mark.unit

PIN = b"NATS/1.0\r\nNats-Pin-Id: p1\r\n\r\n"
BLOCK = b"NATS/1.0\r\nA: 1\r\nA: 2\r\nB: \xc3\xa9\r\nNats-Pin-Id: p1\r\n\r\n"


def test_int_and_bytes_columns_equal_pyarrows_conversion() -> None:
    numbers = [0, 1, -5, 2**40]
    assert int_array(numbers).equals(pa.array(numbers, pa.int64()))
    assert int_array([1, 2], pa.int32()).equals(pa.array([1, 2], pa.int32()))
    rows = [b"", b"a.b", "é".encode(), b"\x00\xff"]
    assert bytes_array(rows).equals(pa.array(rows, pa.binary()))
    assert bytes_array(rows[:3], pa.string()).equals(pa.array(["", "a.b", "é"], pa.string()))
    assert len(bytes_array([])) == 0 and len(int_array([])) == 0


@pytest.mark.parametrize("count", [ARROW_FROM - 1, ARROW_FROM, 5000])
def test_offsets_summed_in_python_or_by_arrow_are_the_same(count) -> None:
    """Below `ARROW_FROM` values a column's offsets are summed in Python, from it by
    Arrow."""
    rows = [b"x" * (i % 7) + "é".encode() * (i % 2) for i in range(count)]
    assert bytes_array(rows).equals(pa.array(rows, pa.binary()))
    texts = [row.decode() for row in rows]
    assert bytes_array(rows, pa.string()).equals(pa.array(texts, pa.string()))


def test_a_string_column_refuses_what_is_not_utf8() -> None:
    with pytest.raises(pa.ArrowInvalid, match="UTF8"):
        bytes_array([b"ok", b"\xff\xfe"], pa.string())


def test_constants_and_timestamps() -> None:
    for text in ("m1", "", "é"):
        assert constant(text, 3, pa.string()).equals(pa.array([text] * 3, pa.string()))
    assert len(constant("m1", 0, pa.string())) == 0
    assert constant(1, 2, pa.int32()).equals(pa.array([1, 1], pa.int32()))
    assert constant(None, 2, pa.int64()).null_count == 2
    nanos = 1_700_000_000_123_456_789
    expected = [datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)]
    assert timestamps_from_nanos([nanos]).to_pylist() == expected
    assert timestamps_from_text([b"2023-11-14T22:13:20.123456789Z"]).to_pylist() == expected


@pytest.mark.parametrize("rows", [KERNEL_FROM - 1, KERNEL_FROM])
def test_constants_and_timestamps_in_python_or_by_arrow_are_the_same(rows: int) -> None:
    """Below `KERNEL_FROM` rows constants and timestamps are built in Python, from it by Arrow's
    kernels; both truncate nanoseconds toward zero."""
    for text in ("m1", "", "é"):
        assert constant(text, rows, pa.string()).equals(pa.array([text] * rows, pa.string()))
    nanos = [(i - rows // 2) * 1_000_999 + 1 for i in range(rows)]
    in_nanos = pa.array(nanos, pa.int64()).cast(pa.timestamp("ns", tz="UTC"))
    assert timestamps_from_nanos(nanos).equals(in_nanos.cast(TIMESTAMP_TYPE, safe=False))


def test_headers_leave_the_pin_out_and_keep_every_value() -> None:
    column = headers_array([BLOCK, None, PIN], include=True)
    assert column.type == HEADERS_TYPE
    assert column.to_pylist() == [[("A", ["1", "2"]), ("B", ["é"])], [], []]
    assert headers_array([None, None], include=True).to_pylist() == [[], []]
    none = headers_array([None, PIN, None], include=True)  # built from buffers, no entries
    none.validate(full=True)
    assert none.equals(pa.array([[], [], []], HEADERS_TYPE))
    assert headers_array([BLOCK], include=False).to_pylist() == [None]


def _partitioned(*subjects: bytes) -> list[dict]:
    columns = SlotColumns("S", "m1", partitioned=True, include_headers=True)
    for i, subject in enumerate(subjects):
        columns.add(subject, b"x", BLOCK, 1, 10 + i, 7 + i, 1_000_000_000)
    return columns.record_batch().to_pylist()


def test_slot_columns_split_the_partition_token() -> None:
    # One partition's consumer (all rows share the token), then a member's (several).
    for subjects in ([b"3.orders.k1", b"3.orders.3.x"], [b"3.orders.k1", b"12.3.x", b"03.y"]):
        rows = _partitioned(*subjects)
        split = [(row["partition"], row["subject"]) for row in rows]
        expected = [(int(s.split(b".")[0]), s.split(b".", 1)[1].decode()) for s in subjects]
        assert split == expected, split
    row = rows[0]
    assert (row["member"], row["stream_seq"], row["consumer_seq"], row["delivered"]) == (
        "m1",
        10,
        7,
        1,
    )


@pytest.mark.parametrize("rows", [2, ARROW_FROM - 1, ARROW_FROM, 1000])
@pytest.mark.parametrize("other", [None, b"12.3.x", b"30.y", "3.é".encode()])
def test_the_partition_token_is_split_alike_in_python_or_by_arrow(rows: int, other) -> None:
    """Below `ARROW_FROM` rows one partition's token is cut off in Python, from it by Arrow;
    a batch with another token (or none that matches the first's bytes) takes the regex."""
    subjects = [f"3.orders.k{i % 9}".encode() for i in range(rows)]
    if other is not None:
        subjects[-1] = other
    split = [(row["partition"], row["subject"]) for row in _partitioned(*subjects)]
    assert split == [(int(s.split(b".")[0]), s.split(b".", 1)[1].decode()) for s in subjects]


@pytest.mark.parametrize("subject", [b"orders.k1", b"x3.orders", b"3"])
def test_a_subject_without_a_partition_token_is_named(subject: bytes) -> None:
    with pytest.raises(ValueError, match="has no partition token"):
        _partitioned(b"3.ok", subject)
    with pytest.raises(ValueError, match="has no partition token"):
        _partitioned(subject)


def test_a_partition_number_beyond_32_bits_is_refused() -> None:
    with pytest.raises(NatsSparkError, match="32-bit"):
        _partitioned(b"4294967296.orders")


BUILD = r"""
import sys
from nats_spark.jetstream.pull import Deliveries
from nats_spark.spark.group_source.task.columns import SlotColumns
from nats_spark.spark.shared.columns import record_batch, constant, bytes_array
from nats_spark.spark.shared.columns import headers_array, timestamps_from_text
import pyarrow as pa
block = b"NATS/1.0\r\nA: 1\r\n\r\n"
columns = SlotColumns("S", "m1", partitioned=True, include_headers=True)
columns.add(b"1.a", b"x", block, 1, 1, 1, 5)
columns.add(b"2.b", b"y", None, 2, 2, 2, 6)
columns.record_batch()  # a member's slot: several partitions
columns = SlotColumns("S", None, partitioned=True, include_headers=True)
columns.add(b"1.a", b"x", b"NATS/1.0\r\nNats-Pin-Id: p\r\n\r\n", 1, 1, 1, 5)
columns.record_batch()  # a partition's slot, pinned
record_batch(
    subject=bytes_array([b"a"], pa.string()), data=[b"x"], headers=headers_array([block], True),
    partition=pa.nulls(1, pa.int32()), member=None, stream="S", stream_seq=[1],
    consumer_seq=pa.nulls(1, pa.int64()), delivered=constant(1, 1, pa.int32()),
    timestamp=timestamps_from_text([b"2024-01-01T00:00:00Z"]),
)
assert "pandas" not in sys.modules, "building the columns imported pandas"
"""


def test_columns_are_built_without_importing_pandas() -> None:
    # pyarrow imports pandas on its first conversion of Python objects (0.3 CPU-s, ~29,000
    # objects in every worker); the readers' columns never ask for one.
    pytest.importorskip("pandas")  # what would be imported, were a conversion left
    subprocess.run([sys.executable, "-c", BUILD], check=True, timeout=60)


def test_deliveries_extend_a_batch_by_column() -> None:
    columns = SlotColumns("S", None, partitioned=False, include_headers=False)
    columns.extend(Deliveries())
    assert len(columns) == 0 and columns.record_batch().num_rows == 0
