"""Reads of a whole stream with format `nats`: the driver side (the stream reader, which uses
these ranges, is in `stream_reader.py`).

A read covers a range of stream sequences, resolved on the driver from stream info (and, for
`time:` positions, a lookup of the first message at a time), and split into contiguous ranges,
one Spark input partition each. Nothing is acked and no consumer or group is touched here;
streaming offsets are stream sequences, so a re-run of a batch reads the same range again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    InputPartition,
)

from nats_spark.client import NatsClient, shared_client
from nats_spark.errors import ConfigurationError, NotFound, stream_missing
from nats_spark.jetstream.replies import StreamInfo
from nats_spark.loop import run_sync
from nats_spark.spark.shared.failures import one_line_errors
from nats_spark.spark.shared.options import StartingPosition
from nats_spark.spark.stream_source.options import ReadOptions
from nats_spark.spark.stream_source.pushdown import PushedFilters, push_filters, rfc3339
from nats_spark.spark.stream_source.range_read import RangePartition, read_range

log = logging.getLogger(__name__)

# nats-server looks a time up as int64 nanoseconds since 1970; a time outside these wraps
# around (a lookup of 2300-01-01 answers with the first message), so they are answered here.
EARLIEST_LOOKUP = datetime(1678, 1, 1, tzinfo=UTC)
LATEST_LOOKUP = datetime(2262, 1, 1, tzinfo=UTC)
# Default split: a few seconds of work per task; fewer, larger tasks for small ranges.
MESSAGES_PER_PARTITION = 500_000


def split_range(first: int, last: int, parts: int) -> list[tuple[int, int]]:
    """`[first, last]` as at most `parts` contiguous, near-equal, non-empty ranges."""
    count = last - first + 1
    if count <= 0:
        return []
    parts = max(1, min(parts, count))
    size, extra = divmod(count, parts)
    ranges = []
    start = first
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0) - 1
        ranges.append((start, stop))
        start = stop + 1
    return ranges


def partition_count(requested: int | None, count: int) -> int:
    return requested or max(1, math.ceil(count / MESSAGES_PER_PARTITION))


def next_microsecond(stamp: str) -> str:
    """RFC 3339 one microsecond after `stamp`: an end time is inclusive at the precision of the
    `timestamp` column, so a read ends before the first message stored at or after this."""
    return rfc3339(datetime.fromisoformat(stamp) + timedelta(microseconds=1))


class StreamRanges:
    """Driver-side resolution of a read's options (and pushed filters) against the stream."""

    def __init__(
        self, options: ReadOptions, client: NatsClient, pushed: PushedFilters | None = None
    ) -> None:
        self.pushed = pushed or PushedFilters()
        if self.pushed.subjects is not None:
            options = dataclasses.replace(options, subjects=self.pushed.subjects)
        self.options = options
        self.client = client
        self._direct: bool | None = None

    async def stream_info(self) -> StreamInfo:
        try:
            return await self.client.api.stream_info(self.options.stream)
        except NotFound as error:
            if not error.stream_missing:
                raise
            raise stream_missing(self.options.stream, self.options.connection.described()) from None

    async def _first_at(self, stamp: str, last_seq: int) -> int:
        """Sequence of the first message stored at or after `stamp`; `last_seq + 1` if none."""
        when = datetime.fromisoformat(stamp)
        if when < EARLIEST_LOOKUP:
            return 1
        if when >= LATEST_LOOKUP:
            return last_seq + 1
        try:
            found = await self.client.api.get_message(
                self.options.stream, 0, next_by_subject=">", start_time=stamp
            )
        except NotFound:
            return last_seq + 1
        return found.seq

    async def start_seq(self, info: StreamInfo) -> int:
        """The first sequence a read covers (`last_seq + 1` when it covers nothing yet)."""
        first, last = max(1, info.first_seq, self.pushed.min_seq), info.last_seq
        deliver = self.options.starting_position.deliver
        if "opt_start_seq" in deliver:
            start = max(first, deliver["opt_start_seq"])
        elif "opt_start_time" in deliver:
            start = max(first, await self._first_at(deliver["opt_start_time"], last))
        else:
            start = last + 1 if deliver["deliver_policy"] == "new" else first
        if self.pushed.start_time is not None and start <= last:
            start = max(start, await self._first_at(rfc3339(self.pushed.start_time), last))
        return start

    async def end_seq(self, info: StreamInfo) -> int:
        """The last sequence a batch read covers, inclusive."""
        last = info.last_seq
        ending: StartingPosition | None = self.options.ending_position
        deliver = ending.deliver if ending else {}
        if "opt_start_seq" in deliver:
            last = min(last, deliver["opt_start_seq"])
        elif "opt_start_time" in deliver:
            last = await self._first_at(next_microsecond(deliver["opt_start_time"]), last) - 1
        if self.pushed.max_seq is not None:
            last = min(last, self.pushed.max_seq)
        if self.pushed.stop_time is not None:
            last = min(last, await self._first_at(rfc3339(self.pushed.stop_time), last) - 1)
        return last

    def use_direct(self, info: StreamInfo) -> bool:
        """Batch direct get only on request (`readPath=direct`): the ephemeral consumer measured
        faster (bench/batch_read.py). A direct get takes one filter subject at most."""
        if self.options.read_path != "direct":
            return False
        allowed = info.allow_direct
        if not allowed or len(self.options.subjects) > 1:
            why = "a direct get takes one filter subject" if allowed else "allow_direct is false"
            raise ConfigurationError(
                f"option readPath=direct cannot read stream {self.options.stream!r}: {why}; use "
                "readPath=auto"
            )
        return True

    async def partitions(self, first: int, last: int) -> list[RangePartition]:
        if self._direct is None:
            self._direct = self.use_direct(await self.stream_info())
        o = self.options
        parts = partition_count(o.num_partitions, last - first + 1)
        return [
            RangePartition(
                o.connection,
                o.stream,
                start,
                stop,
                o.subjects,
                self._direct,
                o.include_headers,
                o.fetch_batch_size,
            )
            for start, stop in split_range(first, last, parts)
        ]


def read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, RangePartition)
    return read_range(partition)


class RangeReader(DataSourceReader):
    """`spark.read.format("nats")`: a bounded read, planned once on the driver."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.pushed = PushedFilters()

    @one_line_errors
    def partitions(self) -> Sequence[InputPartition]:
        ranges = StreamRanges(self.options, shared_client(self.options.connection), self.pushed)

        async def plan() -> list[RangePartition]:
            info = await ranges.stream_info()
            if self.pushed.matches_nothing:
                return []
            first, last = await ranges.start_seq(info), await ranges.end_seq(info)
            return await ranges.partitions(first, last)

        # Spark needs at least one partition: an empty range is one that reads nothing.
        planned = run_sync(plan())
        return planned or [
            RangePartition(self.options.connection, self.options.stream, 1, 0, (), True, True, 1)
        ]

    @one_line_errors
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(partition)


class FilteringRangeReader(RangeReader):
    """A batch read that applies what it can of the query's filters in NATS (pyspark 4.1+,
    `spark.sql.python.filterPushdown.enabled`; see `pushdown.py`)."""

    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:
        direct = self.options.read_path == "direct"
        self.pushed, kept = push_filters(filters, self.options.subjects, direct)
        log.info("read of stream %s: %s", self.options.stream, self.pushed.describe())
        return kept
