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
from nats_spark.spark.group_source.entry_deliveries import EntryDeliveries
from nats_spark.spark.group_source.slot_partition import SlotPartition
from nats_spark.spark.group_source.task.columns import SlotColumns
from nats_spark.spark.shared.columns import text_timestamps

log = logging.getLogger(__name__)

_REPLAY_WINDOW = 256  # stored-message requests in flight while replaying


class DataLoss(NatsSparkError):
    """Messages of an uncommitted batch were removed from the stream before the batch committed."""


class Replay:
    """Reads recorded deliveries back; `lost` counts those the stream no longer holds."""

    def __init__(self, client: NatsClient, partition: SlotPartition) -> None:
        self.client = client
        self.partition = partition
        self.lost = 0

    async def record_batches(self, recorded: EntryDeliveries) -> AsyncIterator[pa.RecordBatch]:
        """The rows of `recorded`, a pull's worth (`fetchBatchSize`) at a time."""
        step = self.partition.reading.fetch_batch_size
        for start in range(0, len(recorded), step):
            batch = await self.record_batch(recorded.part(start, start + step))
            if batch.num_rows:
                yield batch

    async def record_batch(self, deliveries: EntryDeliveries) -> pa.RecordBatch:
        """Rows for recorded deliveries, read back from the stream by sequence, a window of
        requests at a time (the server's API queue is shared); their time is the stored one,
        which their ack subjects carried too."""
        seqs = deliveries.stream_seq
        stored: list[StoredMessage | None] = []
        for start in range(0, len(seqs), _REPLAY_WINDOW):
            window = seqs[start : start + _REPLAY_WINDOW]
            stored += await asyncio.gather(*(self._stored(seq) for seq in window))
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

    async def _stored(self, seq: int) -> StoredMessage | None:
        stream = self.partition.stream
        try:
            return await self.client.api.get_message(stream, seq)
        except NotFound:
            if self.partition.reading.fail_on_data_loss:
                raise DataLoss(
                    f"message {seq} of stream {stream} was removed (retention or purge) "
                    "before its batch was committed; raise the stream's limits, or set "
                    "failOnDataLoss=false to skip lost messages"
                ) from None
            self.lost += 1
            log.warning("skipping message %d of %s: removed before commit", seq, stream)
            return None
