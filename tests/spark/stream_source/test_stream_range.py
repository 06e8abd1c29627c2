"""Pure logic of format `nats` reads: options, range splitting, offsets, Arrow columns."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from nats_spark.errors import ConfigurationError
from nats_spark.spark.shared.columns import ARROW_SCHEMA
from nats_spark.spark.stream_source.options import parse_read_options
from nats_spark.spark.stream_source.range_read import RangeColumns
from nats_spark.spark.stream_source.stream_range import (
    MESSAGES_PER_PARTITION,
    StreamRanges,
    next_microsecond,
    partition_count,
    split_range,
)
from nats_spark.spark.stream_source.stream_reader import RangeOffset

pytestmark = pytest.mark.unit

BASE = {"servers": "nats://127.0.0.1:1", "stream": "S"}


def test_split_range_small_cases() -> None:
    assert split_range(1, 10, 3) == [(1, 4), (5, 7), (8, 10)]
    assert split_range(5, 5, 4) == [(5, 5)]
    assert split_range(3, 2, 4) == []


@pytest.mark.parametrize(("first", "last", "parts"), [(1, 1000, 7), (17, 18, 5), (1, 99, 1)])
def test_split_range_covers_first_to_last_in_near_equal_parts(
    first: int, last: int, parts: int
) -> None:
    ranges = split_range(first, last, parts)
    assert ranges[0][0] == first and ranges[-1][1] == last
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    sizes = [stop - start + 1 for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_partition_count_default_follows_range_size() -> None:
    assert partition_count(None, 0) == 1
    assert partition_count(None, MESSAGES_PER_PARTITION) == 1
    assert partition_count(None, MESSAGES_PER_PARTITION + 1) == 2
    assert partition_count(7, 10) == 7


def test_offset_round_trip_and_refusals() -> None:
    offset = RangeOffset("S", 42)
    assert RangeOffset.from_json(offset.to_json(), "S") == offset
    assert RangeOffset.from_json('{"v": 1, "stream": "S", "seq": 42}', "S") == offset
    with pytest.raises(ConfigurationError, match="new checkpoint location"):
        RangeOffset.from_json({"lineage": "x", "gen": 3}, "S")
    with pytest.raises(ConfigurationError, match="reads stream 'S', not 'T'"):
        RangeOffset.from_json(offset.to_json(), "T")


def test_next_microsecond() -> None:
    assert next_microsecond("2026-11-23T08:00:00Z") == "2026-11-23T08:00:00.000001Z"
    assert next_microsecond("2026-11-23T23:59:59.999999Z") == "2026-11-24T00:00:00Z"


def test_times_nats_server_cannot_look_up_are_answered_without_it() -> None:
    options = parse_read_options(BASE, streaming=False)
    ranges = StreamRanges(options, None)  # type: ignore[arg-type]  # never asked
    assert asyncio.run(ranges._first_at("1000-01-01T00:00:00Z", 9)) == 1
    assert asyncio.run(ranges._first_at("2300-01-01T00:00:00Z", 9)) == 10


def test_read_options_defaults_and_values() -> None:
    options = parse_read_options(BASE, streaming=False)
    assert options.starting_position.deliver == {"deliver_policy": "all"}
    assert options.ending_position is None and options.subjects == ()
    assert options.read_path == "auto" and options.num_partitions is None
    options = parse_read_options(
        {
            **BASE,
            "subjects": "a.*, b.>",
            "startingPosition": "sequence:5",
            "endingPosition": "time:2026-01-01T00:00:00",
            "READPATH": "Consumer",
            "numPartitions": "3",
        },
        streaming=False,
    )
    assert options.subjects == ("a.*", "b.>")
    assert options.starting_position.deliver["opt_start_seq"] == 5
    assert options.ending_position is not None
    assert options.ending_position.deliver["opt_start_time"] == "2026-01-01T00:00:00Z"
    assert options.read_path == "consumer" and options.num_partitions == 3


def test_columns_from_direct_get_text_and_from_deliveries() -> None:
    text = RangeColumns("S", text_stamps=True)
    text.subjects += [b"a.1", b"a.2"]
    text.data += [b"x", b""]
    text.headers += [b"NATS/1.0\r\nk: v1\r\nk: v2\r\n\r\n", None]
    text.seqs += [7, 9]
    text.stamps += [b"2026-11-23T08:00:00.123456789Z", b"2026-11-23T08:00:01Z"]  # type: ignore[list-item]
    batch = text.record_batch(include_headers=True)
    assert batch.schema == ARROW_SCHEMA
    rows = batch.to_pylist()
    assert [r["subject"] for r in rows] == ["a.1", "a.2"]
    assert rows[0]["headers"] == [("k", ["v1", "v2"])] and rows[1]["headers"] == []
    assert [r["stream_seq"] for r in rows] == [7, 9]
    assert rows[0]["timestamp"] == dt.datetime(2026, 11, 23, 8, 0, 0, 123456, tzinfo=dt.UTC)
    assert {r["partition"] for r in rows} == {None} and {r["member"] for r in rows} == {None}
    assert {r["consumer_seq"] for r in rows} == {None} and {r["delivered"] for r in rows} == {1}
    assert {r["stream"] for r in rows} == {"S"}
    numbers = RangeColumns("S", text_stamps=False)
    numbers.subjects.append(b"a.1")
    numbers.data.append(b"x")
    numbers.headers.append(None)
    numbers.seqs.append(3)
    numbers.stamps.append(1_795_470_217_517_514_520)  # type: ignore[arg-type]
    row = numbers.record_batch(include_headers=False).to_pylist()[0]
    assert row["headers"] is None
    assert row["timestamp"] == dt.datetime.fromtimestamp(1_795_470_217.517514, dt.UTC)
