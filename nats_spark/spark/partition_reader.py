"""Executor side: read one input partition (one slot of one batch) into Arrow record batches.

A slot's first attempt pulls from NATS and records every message in the ack ledger before its
rows leave the task. A later attempt of the same slot replays what the ledger holds (sealed: all
of it and nothing more; open: what was recorded, then it goes on pulling).
"""

from __future__ import annotations

import logging
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from pyspark.sql.datasource import InputPartition

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NatsSparkError, NotFound
from nats_spark.jetstream.acks import ACK, Delivery, parse_reply
from nats_spark.jetstream.pull import PIN_ID_HEADER, PullConsumer, PullStatus
from nats_spark.loop import run_sync
from nats_spark.pcg.partitioning import strip_partition
from nats_spark.spark.ledger import EntryHead, EntryState, Ledger
from nats_spark.spark.schema import ARROW_SCHEMA

log = logging.getLogger(__name__)

_PIN_RETRIES = 3
_TRANSIENT_RETRIES = 5


class DataLoss(NatsSparkError):
    """Messages of an uncommitted batch were removed from the stream before the batch committed."""


@dataclass(frozen=True)
class SlotPartition(InputPartition):
    """Everything a task needs: executors get no other state from the driver."""

    connection: ConnectionSettings
    ledger_bucket: str
    lineage: str
    gen: int
    slot: str  # ledger name of this partition: member name, or `<consumer>#<i>`
    stream: str  # stream the consumer reads (for elastic groups the work-queue stream)
    consumer: str
    priority_group: str | None
    member: str | None  # value of the `member` column
    partitioned: bool  # subjects carry a partition token to strip
    limit: int
    pin_id: str | None
    dedupe: bytes  # sorted stream sequences (uint64) of earlier, committed batches not yet settled
    fetch_batch_size: int
    fetch_timeout: float
    include_headers: bool
    fail_on_data_loss: bool
    min_pending: int = 0
    min_ack_pending: int = 0
    priority: int | None = None


_clients: dict[ConnectionSettings, NatsClient] = {}


def shared_client(settings: ConnectionSettings) -> NatsClient:
    """One connection per settings per Python worker process (workers are reused across tasks)."""
    client = _clients.get(settings)
    if client is None or client.nc.is_closed:
        client = run_sync(NatsClient.open(settings))
        _clients[settings] = client
    return client


class _Columns:
    """Column buffers for one record batch."""

    def __init__(self, partition: SlotPartition) -> None:
        self.p = partition
        self.subject: list[str] = []
        self.data: list[bytes] = []
        self.headers: list[list[tuple[str, list[str]]] | None] = []
        self.partition: list[int | None] = []
        self.stream_seq: list[int] = []
        self.consumer_seq: list[int] = []
        self.delivered: list[int] = []
        self.timestamp: list[int] = []

    def __len__(self) -> int:
        return len(self.stream_seq)

    def add(
        self, subject: str, data: bytes, headers: dict[str, str] | None, delivery: Delivery
    ) -> None:
        if self.p.partitioned:
            number, subject = strip_partition(subject)
            self.partition.append(number)
        else:
            self.partition.append(None)
        self.subject.append(subject)
        self.data.append(data)
        if self.p.include_headers:
            # Nats-Pin-Id is added per delivery, not stored: leaving it out keeps replays exact.
            self.headers.append(
                [(k, [v]) for k, v in headers.items() if k != PIN_ID_HEADER] if headers else []
            )
        else:
            self.headers.append(None)
        self.stream_seq.append(delivery.stream_seq)
        self.consumer_seq.append(delivery.consumer_seq)
        self.delivered.append(delivery.delivered)
        self.timestamp.append(delivery.timestamp_ns // 1000)

    def batch(self) -> pa.RecordBatch:
        n = len(self)
        return pa.record_batch(
            [
                pa.array(self.subject, pa.string()),
                pa.array(self.data, pa.binary()),
                pa.array(self.headers, ARROW_SCHEMA.field("headers").type),
                pa.array(self.partition, pa.int32()),
                pa.array([self.p.member] * n, pa.string()),
                pa.array([self.p.stream] * n, pa.string()),
                pa.array(self.stream_seq, pa.int64()),
                pa.array(self.consumer_seq, pa.int64()),
                pa.array(self.delivered, pa.int32()),
                pa.array(self.timestamp, ARROW_SCHEMA.field("timestamp").type),
            ],
            schema=ARROW_SCHEMA,
        )


def _parse_stored_headers(raw: bytes | None) -> dict[str, str] | None:
    """Headers of a stored message, parsed with the rules nats-py applies to deliveries."""
    if not raw:
        return None
    _, _, lines = raw.partition(b"\r\n")
    return NATS._parse_header_lines(lines) or None


class SlotReader:
    """Reads one slot: replay of what the ledger holds, then (for a first attempt) pulls."""

    def __init__(self, partition: SlotPartition) -> None:
        self.p = partition
        self.client = shared_client(partition.connection)
        self.dedupe = array("Q", partition.dedupe)
        self.taken: set[int] = set()
        self.head = EntryHead()
        self.revision = 0
        self.replay: list[str] = []
        self.pull = partition.limit > 0
        self.lost = 0

    async def begin(self) -> None:
        """Claim the ledger entry: create it, take over an open one, or replay a sealed one."""
        kv = await Ledger.bucket(self.client, self.p.ledger_bucket, create=False)
        self.ledger = Ledger(kv, self.p.lineage)
        while True:
            found = await self.ledger.read_head(self.p.gen, self.p.slot)
            if found is None:
                revision = await self.ledger.create_head(self.p.gen, self.p.slot, self.head)
                if revision is not None:
                    self.revision = revision
                    self.head.pin = self.p.pin_id
                    return
                continue  # another attempt created it first: read it
            previous, revision = found
            self.replay = await self.ledger.read_replies(previous)
            self.taken = {parse_reply(r).stream_seq for r in self.replay}
            if previous.state is not EntryState.OPEN:
                self.pull = False  # the batch's content is fixed: exactly this, nothing more
                self.head = previous
                return
            # An earlier attempt died mid-way: adopt what it took, then go on pulling.
            self.head = EntryHead(
                chunks=previous.chunks,
                count=previous.count,
                max_seq=previous.max_seq,
                pin=previous.pin or self.p.pin_id,
            )
            self.revision = await self.ledger.update_head(
                self.p.gen, self.p.slot, self.head, revision
            )
            return

    async def replay_batch(self, replies: list[str]) -> pa.RecordBatch:
        """Rows for recorded deliveries, read back from the stream by sequence."""
        columns = _Columns(self.p)
        for reply in replies:
            delivery = parse_reply(reply)
            try:
                stored = await self.client.api.get_message(self.p.stream, delivery.stream_seq)
            except NotFound:
                if self.p.fail_on_data_loss:
                    raise DataLoss(
                        f"message {delivery.stream_seq} of stream {self.p.stream} was removed "
                        "(retention or purge) before its batch was committed; raise the stream's "
                        "limits, or set failOnDataLoss=false to skip lost messages"
                    ) from None
                self.lost += 1
                log.warning(
                    "skipping message %d of stream %s: removed before commit",
                    delivery.stream_seq,
                    self.p.stream,
                )
                continue
            headers = _parse_stored_headers(stored.headers)
            columns.add(stored.subject, stored.data, headers, delivery)
        return columns.batch()

    def _accept(
        self, msg: Msg, columns: _Columns, replies: list[str], redundant: list[str]
    ) -> None:
        delivery = parse_reply(msg.reply)
        seq = delivery.stream_seq
        if seq in self.taken:
            return  # redelivered within this batch: emitted once already
        i = bisect_left(self.dedupe, seq)
        if i < len(self.dedupe) and self.dedupe[i] == seq:
            redundant.append(msg.reply)  # emitted by an earlier, committed batch: ack, drop
            return
        self.taken.add(seq)
        replies.append(msg.reply)
        columns.add(msg.subject, msg.data, msg.headers, delivery)

    async def pull_batches(self) -> Any:
        """Async generator of record batches pulled from NATS, each recorded before it leaves."""
        consumer = PullConsumer(
            self.client.nc,
            self.p.stream,
            self.p.consumer,
            group=self.p.priority_group,
            pin_id=self.head.pin,
        )
        remaining = self.p.limit - self.head.count
        wait = waited = got_any = False
        pin_retries = transient = 0
        try:
            while remaining > 0:
                result = await consumer.fetch(
                    min(self.p.fetch_batch_size, remaining),
                    expires=self.p.fetch_timeout,
                    no_wait=not wait,
                    min_pending=self.p.min_pending,
                    min_ack_pending=self.p.min_ack_pending,
                    priority=self.p.priority,
                )
                columns, replies, redundant = _Columns(self.p), [], []
                for msg in result.messages:
                    self._accept(msg, columns, replies, redundant)
                for reply in redundant:
                    await self.client.nc.publish(reply, ACK)
                if replies:
                    await self._record(replies, consumer.pin_id)
                    remaining -= len(replies)
                    got_any = True
                    yield columns.batch()
                status = result.status
                if status is PullStatus.BATCH_COMPLETE:
                    wait = False
                elif status is PullStatus.PIN_MISMATCH:
                    pin_retries += 1  # the pin id was cleared: the next pull asks for a new pin
                    if pin_retries > _PIN_RETRIES:
                        break
                elif status in (PullStatus.NO_MESSAGES, PullStatus.TIMEOUT):
                    if result.messages:
                        wait = False  # drained what was ready; look again without waiting
                    elif waited or got_any:
                        break
                    else:
                        # Nothing ready: wait once, for redeliveries or for a pin to free up.
                        wait = waited = True
                else:
                    transient += 1
                    if transient > _TRANSIENT_RETRIES:
                        break
        finally:
            await consumer.close()

    async def _record(self, replies: list[str], pin: str | None) -> None:
        keys = await self.ledger.write_chunk(self.p.gen, self.p.slot, self.head, replies)
        self.head.chunks = [*self.head.chunks, *keys]
        self.head.count += len(replies)
        self.head.max_seq = max(self.head.max_seq, max(parse_reply(r).stream_seq for r in replies))
        self.head.pin = pin
        self.revision = await self.ledger.update_head(
            self.p.gen, self.p.slot, self.head, self.revision
        )

    async def seal(self) -> None:
        if self.head.state is EntryState.OPEN:
            self.head.state = EntryState.SEALED
            self.revision = await self.ledger.update_head(
                self.p.gen, self.p.slot, self.head, self.revision
            )


def read_slot(partition: SlotPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one slot of one batch (what `DataSourceStreamReader.read` returns)."""
    reader = SlotReader(partition)
    run_sync(reader.begin())
    step = partition.fetch_batch_size
    for start in range(0, len(reader.replay), step):
        batch = run_sync(reader.replay_batch(reader.replay[start : start + step]))
        if batch.num_rows:
            yield batch
    if reader.pull:
        batches = reader.pull_batches()
        while True:
            try:
                batch = run_sync(batches.__anext__())
            except StopAsyncIteration:
                break
            yield batch
        run_sync(reader.seal())
    if reader.lost:
        log.warning("slot %s lost %d messages to retention", partition.slot, reader.lost)
