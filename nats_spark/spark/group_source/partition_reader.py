"""Executor side: read one input partition (one slot of one batch) into Arrow record batches.

A slot's task first acks what its committed batches emitted (`SlotHistory`), then its first
attempt pulls from NATS and records every message in the ack ledger before its rows leave the
task. A later attempt of the same slot replays what the ledger holds (sealed: all
of it and nothing more; open: what was recorded, then it goes on pulling). The ledger entry is
`SlotEntry`'s, the rows' columns `SlotColumns`', the in-progress acks `InProgressKeeper`'s: this
module composes them, fetch -> record -> emit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import pyarrow as pa

from nats_spark import clock
from nats_spark.client import NatsClient, shared_client
from nats_spark.errors import NatsSparkError, NotFound, PullError
from nats_spark.jetstream.acks import (
    RESTART_AFTER,
    SHORT_ACK_WAIT,
    InProgressKeeper,
    publish_acks,
)
from nats_spark.jetstream.api import StoredMessage
from nats_spark.jetstream.pull import Deliveries, Pull, PullConsumer
from nats_spark.jetstream.pull_loop import send
from nats_spark.loop import run_sync
from nats_spark.spark.group_source.columns import SlotColumns
from nats_spark.spark.group_source.entry_deliveries import EntryDeliveries
from nats_spark.spark.group_source.pull_policy import PullPlan, SlotPullPolicy, complete
from nats_spark.spark.group_source.slot_entry import SlotEntry
from nats_spark.spark.group_source.slot_history import SlotHistory
from nats_spark.spark.group_source.slot_partition import SlotPartition
from nats_spark.spark.shared.columns import text_timestamps
from nats_spark.spark.shared.worker_gc import freeze_imports

log = logging.getLogger(__name__)

_REPLAY_WINDOW = 256  # stored-message requests in flight while replaying


class DataLoss(NatsSparkError):
    """Messages of an uncommitted batch were removed from the stream before the batch committed."""


class SlotReader:
    """Reads one slot: replay of what the ledger holds, then (for a first attempt) pulls."""

    def __init__(self, partition: SlotPartition, client: NatsClient | None = None) -> None:
        self.partition = partition
        self.reading = partition.reading
        self.client = client or shared_client(partition.reading.connection)
        self.entry = SlotEntry(self.client, partition)
        self.keeper = InProgressKeeper(self.client.nc, partition.ack_wait, f"slot {partition.slot}")
        self.dedupe: set[int] | None = None  # `SlotHistory.dedupe`, loaded when first needed
        self.history: SlotHistory | None = None
        self.pull = partition.limit > 0
        self.lost = 0
        self.redundant = 0  # redeliveries of earlier batches' messages, acked and dropped
        self.sibling_seqs: set[int] = set()
        self.started = clock.monotonic()  # before any delivery this attempt holds

    @property
    def replay(self) -> EntryDeliveries:
        return self.entry.replay

    async def begin(self) -> None:
        """Ack what committed batches left, then claim the ledger entry: create it, take over
        an open one, or replay a sealed one. An ack-only partition (`limit` 0) stops there."""
        history = self.history = SlotHistory(
            self.client, await self.entry.open_ledger(), self.partition
        )
        await history.ack_committed()
        if not self.pull:
            return
        await self.entry.claim()
        if self.entry.fixed:
            self.pull = False  # the batch's content is fixed: exactly this, nothing more

    def _columns(self) -> SlotColumns:
        partition = self.partition
        return SlotColumns(
            partition.stream,
            partition.member,
            partition.partitioned,
            partition.reading.include_headers,
        )

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

    async def replay_record_batch(self, deliveries: EntryDeliveries) -> pa.RecordBatch:
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
        columns = self._columns()
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

    def _accept(
        self, chunk: Deliveries, start: int, columns: SlotColumns, replies: list[bytes]
    ) -> tuple[list[bytes], int]:
        """Add the new deliveries of `chunk` from `start` on to `columns` and `replies`; returns
        the redundant ones' replies and where it stopped: the chunk's end, or the first delivery
        that may be of an earlier batch while the dedupe set is not loaded (in-order reads never
        load it)."""
        taken, held, dedupe = self.entry.taken, self.keeper.held, self.dedupe
        below, redundant = self.partition.dedupe_through, list[bytes]()
        delivered, seqs, consumer_seqs, timestamps = chunk.numbers
        if start == 0 and self._all_new(seqs):  # the usual case: the chunk whole, by column
            taken.update(seqs)
            replies += chunk.replies
            held.update(zip(seqs, chunk.replies, strict=True))
            columns.extend(chunk)
            return redundant, len(seqs)
        for i in range(start, len(seqs)):
            seq, reply = seqs[i], chunk.replies[i]
            if seq in taken:
                if seq in held:
                    held[seq] = reply  # later progress acks must name this delivery
                continue  # redelivered within this batch: emitted once already
            if seq <= below:
                if dedupe is None:
                    return redundant, i
                if seq in dedupe:
                    redundant.append(reply)  # emitted by an earlier, committed batch: ack
                    continue
            if seq in self.sibling_seqs:
                continue  # a sibling slot took and recorded it first; it acks it at commit
            taken.add(seq)
            replies.append(reply)
            held[seq] = reply
            columns.add(
                chunk.subjects[i],
                chunk.data[i],
                chunk.headers[i],
                delivered[i],
                seq,
                consumer_seqs[i],
                timestamps[i],
            )
        return redundant, len(seqs)

    def _all_new(self, seqs: list[int]) -> bool:
        """Whether every one of `seqs` is new to this batch (none twice, none taken by this slot
        or a sibling) and above every sequence an earlier, unsettled batch holds."""
        if not seqs:
            return True
        if min(seqs) <= self.partition.dedupe_through:
            return False
        fresh = set(seqs)
        if len(fresh) != len(seqs) or not fresh.isdisjoint(self.entry.taken):
            return False
        return not (self.sibling_seqs and not fresh.isdisjoint(self.sibling_seqs))

    async def _take(self, chunk: Deliveries, columns: SlotColumns, replies: list[bytes]) -> None:
        """`_accept` the chunk; what earlier batches already emitted is acked and dropped."""
        at = 0
        while at < len(chunk):
            redundant, at = self._accept(chunk, at, columns, replies)
            if redundant:
                self.redundant += len(redundant)
                await publish_acks(self.client.nc, redundant)
            if at < len(chunk):
                assert self.history is not None
                self.dedupe = await self.history.dedupe()

    async def _load_sibling_seqs(self) -> None:
        """What the slots sharing this consumer recorded so far in this batch: a redelivery may
        reach us after a sibling took the message and its ack wait ran out. Skipping these
        before taking is the cheap, usual case; `SlotEntry.record` settles the races."""
        self.sibling_seqs |= await self.entry.recorded_by_siblings()

    async def _request(self, consumer: PullConsumer, plan: PullPlan | None) -> Pull | None:
        return None if plan is None else await send(consumer, plan, self.reading.thresholds)

    async def pull_record_batches(self) -> Any:
        """Async generator of record batches pulled from NATS, each recorded before it leaves.

        Deliveries are taken as they arrive; what one pull request delivered becomes one record
        batch and one ledger write (split at a ledger chunk or 4 MiB). The work overlaps: when a
        request has delivered all it asked for, the next one is sent before its messages are
        processed, and a batch's ledger write runs while the next batch is gathered (writes stay
        in order, one at a time; a batch is yielded only once its write is done).
        """
        consumer = self.client.pull_consumer(
            self.partition.stream,
            self.partition.consumer,
            group=self.partition.priority_group,
            pin_id=self.entry.head.pin,
        )
        policy = SlotPullPolicy(self.reading.fetch_batch_size, self.reading.fetch_timeout)
        remaining = self.partition.limit - self.entry.head.count
        columns, replies = self._columns(), list[bytes]()
        recording: asyncio.Future[pa.RecordBatch] | None = None
        got_any = False
        done = asyncio.Event()
        keeping = asyncio.ensure_future(self.keeper.run(done))
        try:
            pull = await self._request(consumer, policy.next(remaining))
            while pull is not None:
                following = None
                took_before, acked_before = len(self.entry.taken), self.redundant
                try:
                    async for chunk in _until_ended(pull):
                        # Not with siblings: deliveries of an early pull would wait unrecorded
                        # while the rows before them are handed out, and past the ack wait come
                        # back to a sibling that cannot tell they were taken.
                        if following is None and _sent_all(pull) and not self.partition.siblings:
                            want = remaining - len(replies) - len(chunk)
                            following = await self._request(consumer, policy.early(want))
                        if self.partition.siblings and max(chunk.numbers.delivered, default=0) > 1:
                            await self._load_sibling_seqs()
                        await self._take(chunk, columns, replies)
                        columns.taken_from(pull.sent)
                        got_any = got_any or bool(replies)
                        if replies and (pull.done or columns.full()):
                            remaining -= len(replies)
                            rows, recording = await self._record_next(
                                recording, columns, replies, consumer.pin_id
                            )
                            columns, replies = self._columns(), []
                            if rows is not None:
                                yield rows
                except PullError as error:
                    if not policy.refused(error):
                        log.warning(
                            "slot %s: %s; ending its batch early", self.partition.slot, error
                        )
                        break
                    pull = await self._request(consumer, policy.next(remaining - len(replies)))
                    continue
                new = len(self.entry.taken) != took_before or self.redundant != acked_before
                if not policy.ended(pull.status, pull.received, new, got_any):
                    break
                pull = following or await self._request(consumer, policy.next(remaining))
            # Requests given up on may still deliver: take that too (the batch then holds a
            # little more than planned) rather than leave it unread until its ack wait runs out.
            late = await consumer.settle(self.partition.ack_wait / 2)
            if late:
                await self._take(late, columns, replies)
                columns.taken_from(self.started)  # sent for a request given up on, after it
                if replies:
                    rows, recording = await self._record_next(
                        recording, columns, replies, consumer.pin_id
                    )
                    if rows is not None:
                        yield rows
            if recording:
                yield await recording
                recording = None
        finally:
            done.set()  # never cancelled: it may be inside a flush
            await keeping
            if recording:
                recording.cancel()
            await consumer.close()

    async def _record_next(
        self,
        recording: asyncio.Future[pa.RecordBatch] | None,
        columns: SlotColumns,
        replies: list[bytes],
        pin: str | None,
    ) -> tuple[pa.RecordBatch | None, asyncio.Future[pa.RecordBatch]]:
        """Start recording `columns` once the recording before it is done (writes stay in
        order); returns that one's rows, to hand out, and the new recording."""
        rows = await recording if recording else None
        return rows, asyncio.ensure_future(self._record(columns, replies, pin))

    async def _record(
        self, columns: SlotColumns, replies: list[bytes], pin: str | None
    ) -> pa.RecordBatch:
        """Record the deliveries in the ledger entry, then hand out their rows; what the entry
        dropped (a sibling emits it) is no longer kept from redelivery."""
        batch, dropped = await self.entry.record(columns, replies, pin, self.keeper.renewed)
        for seq in dropped:
            self.keeper.held.pop(seq, None)  # it comes back to a slot
        return batch

    async def seal(self) -> None:
        """Seal the entry. Its messages then wait for the next batch's task to ack them, and the
        driver's `SealedKeeper` restarts their ack wait before less than a third of it is left;
        a task that has used more than a sixth of it since its last restart (or its start)
        restarts it first, as does any task under a short ack wait. A short task does not: a
        `+WPI` per message costs the server about a quarter of what delivering and acking the
        message does."""
        used = clock.monotonic() - max(self.started, self.keeper.renewed)
        if (
            self.partition.ack_wait < SHORT_ACK_WAIT
            or used > self.partition.ack_wait * RESTART_AFTER
        ):
            await self.keeper.renew()
        await self.entry.seal()


async def _until_ended(pull: Pull) -> AsyncIterator[Deliveries]:
    """The pull's chunks of deliveries, then an empty one once it has ended."""
    async for chunk in pull:
        yield chunk
    yield Deliveries()


def _sent_all(pull: Pull) -> bool:
    """Whether `pull` delivered all it could: the next one can be sent before its messages are
    processed."""
    return pull.done and pull.received > 0 and complete(pull.status)


def read_slot(partition: SlotPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one slot of one batch (what `DataSourceStreamReader.read` returns)."""
    freeze_imports()
    batches = slot_batches(SlotReader(partition))
    try:
        while (batch := run_sync(_next(batches))) is not None:
            yield batch
    finally:
        run_sync(batches.aclose())  # when Spark stops early: end pulls, free the inbox


async def _next(batches: AsyncGenerator[pa.RecordBatch, None]) -> pa.RecordBatch | None:
    return await anext(batches, None)


async def slot_batches(reader: SlotReader) -> AsyncGenerator[pa.RecordBatch, None]:
    """The task's steps: ack and claim, replay what the ledger holds, pull (a first attempt),
    seal. Async, so that the simulation (tests/simulation) runs them on its own loop."""
    partition = reader.partition
    await reader.begin()
    step = partition.reading.fetch_batch_size
    for start in range(0, len(reader.replay), step):
        batch = await reader.replay_record_batch(reader.replay.part(start, start + step))
        if batch.num_rows:
            yield batch
    if reader.pull:
        async with contextlib.aclosing(reader.pull_record_batches()) as batches:
            async for batch in batches:
                yield batch
        await reader.seal()
    if reader.lost:
        log.warning("slot %s lost %d messages to retention", partition.slot, reader.lost)
    log.debug(
        "slot %s of batch %d: %d rows (%d replayed), %d redeliveries of earlier batches dropped",
        partition.slot,
        partition.gen,
        reader.entry.head.count,
        len(reader.replay),
        reader.redundant,
    )
