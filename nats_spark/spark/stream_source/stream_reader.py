"""`spark.readStream.format("nats")`: the stream reader and its offsets (stream sequences).

Spark makes the stream reader in the process that plans the query too, which never calls it:
what its calls need (the stream's ranges, through a connection, and the range reader) is
imported where they are made, so that process imports neither nats-py nor pyarrow's compute.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from nats_spark.errors import ConfigurationError, foreign_checkpoint
from nats_spark.spark.shared.compat import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from nats_spark.spark.shared.driver_calls import wait
from nats_spark.spark.shared.failures import one_line_errors
from nats_spark.spark.shared.pacing import TriggerPacing
from nats_spark.spark.stream_source.options import ReadOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from nats_spark.spark.stream_source.stream_range import StreamRanges

OFFSET_VERSION = 1


@dataclass(frozen=True)
class RangeOffset:
    """A streaming offset: the next stream sequence to read."""

    stream: str
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {"v": OFFSET_VERSION, "stream": self.stream, "seq": self.seq}

    @classmethod
    def from_json(cls, value: dict[str, Any] | str, stream: str) -> RangeOffset:
        data = json.loads(value) if isinstance(value, str) else value
        if data.get("v") != OFFSET_VERSION or not isinstance(data.get("seq"), int):
            raise foreign_checkpoint(data, "format nats's stream reader")
        if data.get("stream") != stream:
            raise ConfigurationError(
                f"the checkpoint reads stream {data.get('stream')!r}, not {stream!r}; use a new "
                "checkpoint location to read another stream"
            )
        return cls(stream, data["seq"])


class RangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("nats")`: offsets are stream sequences; `commit` acks nothing."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._ranges: StreamRanges | None = None
        self.available_now_end: int | None = None
        self.known_start: int | None = None  # for Spark 4.0/4.1, whose latestOffset has none
        self.pacing = TriggerPacing(options.min_messages_per_trigger, options.max_trigger_delay)
        self.stream_end: int | None = None  # the stream's next sequence at the last latestOffset

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ranges": None}

    @property
    def ranges(self) -> StreamRanges:
        """Made on first use, outside the event loop (connecting blocks on it)."""
        if self._ranges is None:
            from nats_spark.client import shared_client
            from nats_spark.spark.stream_source.stream_range import StreamRanges

            self._ranges = StreamRanges(self.options, shared_client(self.options.connection))
        return self._ranges

    def _offset(self, value: dict[str, Any] | str) -> RangeOffset:
        return RangeOffset.from_json(value, self.options.stream)

    @one_line_errors
    def initialOffset(self) -> dict[str, Any]:
        seq = wait(self.ranges.start_seq(wait(self.ranges.stream_info())))
        self.known_start = seq
        return RangeOffset(self.options.stream, seq).to_json()

    def getDefaultReadLimit(self) -> Any:
        """Spark 4.2+ only (older versions never call it)."""
        if self.options.max_messages_per_trigger:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    @one_line_errors
    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_end = wait(self.ranges.stream_info()).last_seq + 1

    @one_line_errors
    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict[str, Any]:
        begin = self._offset(start).seq if start else self.known_start
        if begin is None:  # Spark 4.0/4.1 ask before the first batch without saying its start
            begin = self._offset(self.initialOffset()).seq
        end = self.stream_end = wait(self.ranges.stream_info()).last_seq + 1
        if self.available_now_end is not None:
            end = min(end, self.available_now_end)
        caps = (getattr(limit, "max_rows", None), self.options.max_messages_per_trigger)
        cap = min((c for c in caps if c), default=None)
        if begin is not None:
            if self.available_now_end is None and self.pacing.holds_back(end - begin):
                end = begin
            if cap:
                end = min(end, begin + cap)
            end = max(end, begin)  # a start past the stream's end waits there
            if end > begin:
                self.pacing.batch_planned()
        self.known_start = end
        return RangeOffset(self.options.stream, end).to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """For Spark's progress: the stream's end and how many sequences later batches still
        have to read (`lag.total.behindLatest`, as for `nats-pcg`)."""
        if self.stream_end is None or self.known_start is None:
            return None
        behind = max(self.stream_end - self.known_start, 0)
        return {
            **RangeOffset(self.options.stream, self.stream_end).to_json(),
            "lag": {"total": {"behindLatest": behind}},
        }

    @one_line_errors
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, stop = self._offset(start).seq, self._offset(end).seq
        self.known_start = max(self.known_start or 0, stop)
        return wait(self.ranges.partitions(first, stop - 1))

    @one_line_errors
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from nats_spark.spark.stream_source.stream_range import read_partition

        yield from read_partition(partition)

    def commit(self, end: dict) -> None:
        """Nothing to ack: the checkpointed offset is the whole position."""
