"""Executor side: the rows of what an earlier attempt of a slot recorded, read back from the
stream by sequence (a later attempt emits exactly them again)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pyarrow as pa

from nats_spark.client import NatsClient
from nats_spark.errors import NatsSparkError, NotFound
from nats_spark.jetstream.api import StoredMessage
from nats_spark.spark.group_source.ledger import EntryDeliveries
from nats_spark.spark.group_source.slot_partition import SlotPartition
from nats_spark.spark.group_source.task.columns import SlotColumns
from nats_spark.spark.shared.columns import text_timestamps

log = logging.getLogger(__name__)

_REPLAY_WINDOW = 256  # stored-message requests in flight while replaying


_NAMED_RANGES = 5  # sequence ranges an error or warning names (then how many more)


class DataLoss(NatsSparkError):
    """Messages of an uncommitted batch were removed from the stream before the batch committed."""


class Replayer:
    """Reads recorded deliveries back for a replay; `lost` holds the sequences the stream no
    longer holds (acked by another client on a work-queue or interest stream, purged, or past its
    limits)."""

    def __init__(self, client: NatsClient, partition: SlotPartition) -> None:
        self.client = client
        self.partition = partition
        self.lost: list[int] = []

    async def record_batches(self, recorded: EntryDeliveries) -> AsyncIterator[pa.RecordBatch]:
        """The rows of `recorded`, a pull's worth (`fetchBatchSize`) at a time. With
        failOnDataLoss, a loss stops the task once it knows all that is lost (the rest is only
        looked up), so that its error names it whole."""
        step = self.partition.reading.fetch_batch_size
        for start in range(0, len(recorded), step):
            batch = await self.record_batch(recorded.part(start, start + step))
            if self.lost and self.partition.reading.fail_on_data_loss:
                rest = recorded.stream_seq[start + step :]
                self.lost += _missing(rest, await self._look_up(rest))
                raise DataLoss(self.loss_line(len(recorded)))
            if batch.num_rows:
                yield batch

    def loss_line(self, recorded: int) -> str:
        """What was lost and how to go on, in one line."""
        partition, lost = self.partition, self.lost
        return (
            f"message {min(lost)} of stream {partition.stream} was removed (retention or purge) "
            f"before its batch was committed: {len(lost)} of the {recorded} messages slot "
            f"{partition.slot} took in batch {partition.gen} are gone (sequences "
            f"{sequence_ranges(lost)}; on a work-queue or interest stream an ack by another "
            "client removes them too), and a re-run of the batch cannot replay them; restart "
            "the query with failOnDataLoss=false to re-run it without them and go on (a "
            "warning names them), and raise the stream's limits if they removed them"
        )

    def skipped(self) -> None:
        """Warn of what `lost` skipped (failOnDataLoss=false)."""
        if self.lost:
            log.warning(
                "slot %s of batch %d: skipped %d messages of stream %s (sequences %s) removed "
                "before the batch was committed (failOnDataLoss=false); the batch goes on "
                "without them",
                self.partition.slot,
                self.partition.gen,
                len(self.lost),
                self.partition.stream,
                sequence_ranges(self.lost),
            )

    async def record_batch(self, deliveries: EntryDeliveries) -> pa.RecordBatch:
        """Rows for recorded deliveries, read back from the stream by sequence, a window of
        requests at a time (the server's API queue is shared); their time is the stored one,
        which their ack subjects carried too."""
        seqs = deliveries.stream_seq
        stored = await self._look_up(seqs)
        self.lost += _missing(seqs, stored)
        found = [msg for msg in stored if msg is not None]
        stamps = text_timestamps([msg.time.encode() for msg in found])
        times = iter(stamps.cast(pa.int64()).to_pylist())
        columns = SlotColumns.of(self.partition)
        for delivered, seq, consumer_seq, msg in zip(
            deliveries.delivered, seqs, deliveries.consumer_seq, stored, strict=True
        ):
            if msg is not None:
                columns.add(
                    msg.subject.encode(),
                    msg.data,
                    msg.headers,
                    delivered,
                    seq,
                    consumer_seq,
                    next(times),
                )
        return columns.record_batch()

    async def _look_up(self, seqs: list[int]) -> list[StoredMessage | None]:
        """The stored messages of `seqs` (None: no longer in the stream)."""
        stored: list[StoredMessage | None] = []
        for start in range(0, len(seqs), _REPLAY_WINDOW):
            window = seqs[start : start + _REPLAY_WINDOW]
            stored += await asyncio.gather(*(self._stored(seq) for seq in window))
        return stored

    async def _stored(self, seq: int) -> StoredMessage | None:
        try:
            return await self.client.api.get_message(self.partition.stream, seq)
        except NotFound:
            return None


def _missing(seqs: list[int], stored: list[StoredMessage | None]) -> list[int]:
    return [seq for seq, msg in zip(seqs, stored, strict=True) if msg is None]


def sequence_ranges(seqs: list[int]) -> str:
    """`seqs` as ascending ranges, `1-4, 9`, the first few of them."""
    ranges: list[list[int]] = []
    for seq in sorted(seqs):
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1][1] = seq
        else:
            ranges.append([seq, seq])
    named = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:_NAMED_RANGES]]
    more = len(ranges) - _NAMED_RANGES
    return ", ".join(named) + (f" and {more} more ranges" if more > 0 else "")
