"""Executor side: read one input partition (one slot of one batch) into Arrow record batches.

A slot's first attempt pulls from NATS and records every message in the ack ledger before its
rows leave the task. A later attempt of the same slot replays what the ledger holds (sealed: all
of it and nothing more; open: what was recorded, then it goes on pulling).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from array import array
from bisect import bisect_left
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from nats_spark.client import shared_client
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NatsSparkError, NotFound, PullError
from nats_spark.jetstream.acks import IN_PROGRESS, parse_reply, publish_acks, reply_numbers
from nats_spark.jetstream.api import StoredMessage
from nats_spark.jetstream.pull import (
    PULL_MAX_BYTES,
    Pull,
    PullConsumer,
    PullStatus,
    RawMessage,
)
from nats_spark.loop import run_sync
from nats_spark.pcg.partitioning import strip_partition
from nats_spark.spark.columns import headers_array, record_batch, timestamps_from_nanos
from nats_spark.spark.ledger import CHUNK_MESSAGES, EntryHead, EntryState, Ledger

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
    siblings: tuple[str, ...] = ()  # other slots of this batch pulling from the same consumer
    ack_wait: float = 30.0  # the consumer's: what this task takes must not come back meanwhile


_EMIT_BYTES = 4 << 20  # payload bytes that close a record batch early (large messages)
_REPLAY_WINDOW = 256  # stored-message requests in flight while replaying
_MAX_BYTES_REFUSED = "exceeded maxrequestmaxbytes"
_HELD_ONLY_PULLS = 3  # pulls in a row that bring back only what the batch holds: stop pulling


class _Columns:
    """What the rows of one record batch are made of, gathered as they come in."""

    def __init__(self, partition: SlotPartition) -> None:
        self.p = partition
        self.subject: list[bytes] = []
        self.data: list[bytes] = []
        self.headers: list[bytes | None] = []  # raw header blocks
        self.stream_seq: list[int] = []
        self.consumer_seq: list[int] = []
        self.delivered: list[int] = []
        self.timestamp: list[int] = []
        self.nbytes = 0
        self.first_received = time.monotonic()  # reset when the first row comes in

    def __len__(self) -> int:
        return len(self.stream_seq)

    def full(self) -> bool:
        return len(self.stream_seq) >= CHUNK_MESSAGES or self.nbytes >= _EMIT_BYTES

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
        if not self.stream_seq:
            self.first_received = time.monotonic()
        self.subject.append(subject)
        self.data.append(data)
        self.nbytes += len(data)
        self.headers.append(headers)
        self.stream_seq.append(stream_seq)
        self.consumer_seq.append(consumer_seq)
        self.delivered.append(delivered)
        self.timestamp.append(timestamp_ns)

    def _subjects(self, n: int) -> tuple[pa.Array, pa.Array]:
        """The `subject` and `partition` columns; a group's stored `<partition>.<subject>` is
        split in Arrow, not row by row."""
        subjects = pa.array(self.subject, pa.string())
        if not (self.p.partitioned and n):
            return subjects, pa.nulls(n, pa.int32())
        parts = pc.extract_regex(subjects, r"^(?P<partition>[0-9]+)\.(?P<subject>.*)$")
        if not parts.null_count:
            with contextlib.suppress(pa.ArrowInvalid):  # a number too large for int32
                return parts.field("subject"), parts.field("partition").cast(pa.int32())
        for subject in self.subject:
            strip_partition(subject.decode())  # raises the error that explains the bad one
        raise NatsSparkError("a subject's partition token does not fit a 32-bit partition number")

    def batch(self) -> pa.RecordBatch:
        subject, partition = self._subjects(len(self))
        return record_batch(
            subject=subject,
            data=self.data,
            headers=headers_array(self.headers, self.p.include_headers),
            partition=partition,
            member=self.p.member,
            stream=self.p.stream,
            stream_seq=self.stream_seq,
            consumer_seq=pa.array(self.consumer_seq, pa.int64()),
            delivered=pa.array(self.delivered, pa.int32()),
            timestamp=timestamps_from_nanos(self.timestamp),
        )


class SlotReader:
    """Reads one slot: replay of what the ledger holds, then (for a first attempt) pulls."""

    def __init__(self, partition: SlotPartition) -> None:
        self.p = partition
        self.client = shared_client(partition.connection)
        self.dedupe = array("Q", partition.dedupe)
        self.taken: set[int] = set()
        self.held: dict[int, bytes] = {}  # stream seq -> latest reply subject of what it took
        self.head = EntryHead()
        self.revision = 0
        self.replay: list[bytes] = []
        self.pull = partition.limit > 0
        self.lost = 0
        self.redundant = 0  # redeliveries of earlier batches' messages, acked and dropped
        self.max_bytes = PULL_MAX_BYTES
        self.sibling_seqs: set[int] = set()
        self.renewed = 0.0  # monotonic time of the last confirmed round of progress acks

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
            # The attempt that died may have recorded without looking at its siblings' records.
            twice = await self._drop_taken_twice(set(self.taken)) if self.p.siblings else set()
            if twice:
                self.replay = [r for r in self.replay if parse_reply(r).stream_seq not in twice]
                self.taken -= twice
                self.head.count = 0
                await self._write([], self.replay, [], self.head.pin)
            return

    async def _stored(self, seq: int) -> StoredMessage | None:
        try:
            return await self.client.api.get_message(self.p.stream, seq)
        except NotFound:
            if self.p.fail_on_data_loss:
                raise DataLoss(
                    f"message {seq} of stream {self.p.stream} was removed (retention or purge) "
                    "before its batch was committed; raise the stream's limits, or set "
                    "failOnDataLoss=false to skip lost messages"
                ) from None
            self.lost += 1
            log.warning("skipping message %d of %s: removed before commit", seq, self.p.stream)
            return None

    async def replay_batch(self, replies: list[bytes]) -> pa.RecordBatch:
        """Rows for recorded deliveries, read back from the stream by sequence, a window of
        requests at a time (the server's API queue is shared)."""
        deliveries = [parse_reply(reply) for reply in replies]
        stored: list[StoredMessage | None] = []
        for start in range(0, len(deliveries), _REPLAY_WINDOW):
            window = deliveries[start : start + _REPLAY_WINDOW]
            stored += await asyncio.gather(*(self._stored(d.stream_seq) for d in window))
        columns = _Columns(self.p)
        for d, msg in zip(deliveries, stored, strict=True):
            if msg is not None:
                columns.add(
                    msg.subject.encode(),
                    msg.data,
                    msg.headers,
                    d.delivered,
                    d.stream_seq,
                    d.consumer_seq,
                    d.timestamp_ns,
                )
        return columns.batch()

    def _accept(
        self, chunk: list[RawMessage], columns: _Columns, replies: list[bytes]
    ) -> list[bytes]:
        """Add new deliveries to `columns` and `replies`; returns the redundant ones' replies."""
        taken, dedupe, redundant = self.taken, self.dedupe, []
        for msg in chunk:
            delivered, seq, consumer_seq, timestamp = reply_numbers(msg.reply)
            if seq in taken:
                if seq in self.held:
                    self.held[seq] = msg.reply  # later progress acks must name this delivery
                continue  # redelivered within this batch: emitted once already
            if dedupe:
                i = bisect_left(dedupe, seq)
                if i < len(dedupe) and dedupe[i] == seq:
                    redundant.append(msg.reply)  # emitted by an earlier, committed batch: ack
                    continue
            if seq in self.sibling_seqs:
                continue  # a sibling slot took and recorded it first; it acks it at commit
            taken.add(seq)
            replies.append(msg.reply)
            self.held[seq] = msg.reply
            columns.add(msg.subject, msg.data, msg.headers, delivered, seq, consumer_seq, timestamp)
        return redundant

    async def _load_sibling_seqs(self) -> None:
        """What the slots sharing this consumer recorded so far in this batch: a redelivery may
        reach us after a sibling took the message and its ack wait ran out. Skipping these
        before taking is the cheap, usual case; `_drop_taken_twice` settles the races."""
        self.sibling_seqs |= await self._sibling_records()

    async def _sibling_records(self) -> set[int]:
        """Every stream sequence the sibling slots have recorded in this batch, read now."""
        recorded: set[int] = set()
        for sibling in self.p.siblings:
            found = await self.ledger.read_head(self.p.gen, sibling)
            if found is not None:
                replies = await self.ledger.read_replies(found[0])
                recorded.update(parse_reply(r).stream_seq for r in replies)
        return recorded

    async def _drop_taken_twice(self, at_risk: set[int]) -> set[int]:
        """Of `at_risk`, just recorded by this slot, what a sibling recorded too; both drop it
        from their entries, so it is emitted once or not at all (then it stays pending and comes
        back). Each slot records before it looks, so of two slots taking one message the later
        recorder always sees the other's record."""
        if not at_risk:
            return set()
        twice = at_risk & await self._sibling_records()
        if twice:
            log.warning(
                "slot %s: %d messages were also taken by a sibling slot after their ack wait ran "
                "out; neither emits them, they are read again",
                self.p.slot,
                len(twice),
            )
        return twice

    async def _request(self, consumer: PullConsumer, want: int, wait: bool) -> Pull | None:
        if want <= 0:
            return None
        return await consumer.pull(
            min(self.p.fetch_batch_size, want),
            expires=self.p.fetch_timeout,
            max_bytes=self.max_bytes,
            no_wait=not wait,
            min_pending=self.p.min_pending,
            min_ack_pending=self.p.min_ack_pending,
            priority=self.p.priority,
        )

    async def pull_batches(self) -> Any:
        """Async generator of record batches pulled from NATS, each recorded before it leaves.

        Deliveries are taken as they arrive; what one pull request delivered becomes one record
        batch and one ledger write (split at a ledger chunk or 4 MiB). The work overlaps: when a
        request has delivered all it asked for, the next one is sent before its messages are
        processed, and a batch's ledger write runs while the next batch is gathered (writes stay
        in order, one at a time; a batch is yielded only once its write is done).
        """
        consumer = PullConsumer(
            self.client.nc,
            self.p.stream,
            self.p.consumer,
            group=self.p.priority_group,
            pin_id=self.head.pin,
        )
        remaining = self.p.limit - self.head.count
        columns, replies = _Columns(self.p), list[bytes]()
        recording: asyncio.Future[pa.RecordBatch] | None = None
        wait = waited = got_any = False
        pin_retries = transient = held_only = 0
        done = asyncio.Event()
        keeping = asyncio.ensure_future(self._keep_held(done))
        try:
            pull = await self._request(consumer, remaining, wait)
            while pull is not None:
                following = None
                took_before, acked_before = len(self.taken), self.redundant
                try:
                    async for chunk in _until_ended(pull):
                        # Not with siblings: deliveries of an early pull would wait unrecorded
                        # while the rows before them are handed out, and past the ack wait come
                        # back to a sibling that cannot tell they were taken.
                        if following is None and _sent_all(pull) and not self.p.siblings:
                            following = await self._request(
                                consumer, remaining - len(replies) - len(chunk), False
                            )
                        if self.p.siblings and any(reply_numbers(m.reply)[0] > 1 for m in chunk):
                            await self._load_sibling_seqs()
                        redundant = self._accept(chunk, columns, replies)
                        got_any = got_any or bool(replies)
                        if redundant:
                            self.redundant += len(redundant)
                            await publish_acks(self.client.nc, redundant)
                        if replies and (pull.done or columns.full()):
                            remaining -= len(replies)
                            recorded = await recording if recording else None
                            recording = asyncio.ensure_future(
                                self._record(columns, replies, consumer.pin_id)
                            )
                            columns, replies = _Columns(self.p), []
                            if recorded is not None:
                                yield recorded
                except PullError as error:
                    if _consumer_gone(error):
                        # Elastic member consumers come and go (inactivity, membership changes):
                        # end the batch with what was recorded; the driver recreates the consumer.
                        log.warning("slot %s: %s; ending its batch early", self.p.slot, error)
                        break
                    if not (self.max_bytes and _MAX_BYTES_REFUSED in error.description.lower()):
                        raise
                    # The consumer caps a pull's bytes below ours (its max_bytes): pull uncapped.
                    self.max_bytes = 0
                    pull = await self._request(consumer, remaining - len(replies), wait)
                    continue
                status, received = pull.status, pull.received
                pull = following
                if received and len(self.taken) == took_before and self.redundant == acked_before:
                    # Only messages this batch holds came back (a stall past the ack wait); when
                    # that goes on, pulling on would take the same ones over and over.
                    held_only += 1
                    if held_only >= _HELD_ONLY_PULLS:
                        break
                else:
                    held_only = 0
                if _complete(status):
                    wait = False
                    if status is PullStatus.MAX_BYTES and not received:
                        self.max_bytes = 0  # one message is larger than our bound: lift it
                elif status is PullStatus.PIN_MISMATCH:
                    pin_retries += 1  # the pin id was cleared: the next pull asks for a new pin
                    if pin_retries > _PIN_RETRIES:
                        break
                elif status in (PullStatus.NO_MESSAGES, PullStatus.TIMEOUT):
                    if received:
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
                if pull is None:
                    pull = await self._request(consumer, remaining, wait)
            if recording:
                yield await recording
                recording = None
        finally:
            done.set()  # never cancelled: it may be inside a flush
            await keeping
            if recording:
                recording.cancel()
            await consumer.close()

    async def _keep_held(self, done: asyncio.Event) -> None:
        """Restart the ack wait of everything taken, a few times per ack wait, until `done`:
        the task's messages must not come back (to it or to a sibling) before it ends."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.p.ack_wait / 3)
            if done.is_set():
                return
            if not self.held:
                continue
            try:
                sent = time.monotonic()
                await publish_acks(self.client.nc, list(self.held.values()), kind=IN_PROGRESS)
                self.renewed = sent  # the ack wait of all taken so far started over by then
            except Exception as error:  # the pulls meet the same trouble and report it
                log.debug("slot %s: progress acks failed: %s", self.p.slot, error)

    async def _record(
        self, columns: _Columns, replies: list[bytes], pin: str | None
    ) -> pa.RecordBatch:
        """Record the deliveries in the ledger, then hand out their rows. With siblings, what
        may have reached a sibling too (redeliveries, or rows recorded late: the ack wait may
        have run out first) is checked against the siblings' records and dropped if found."""
        chunks = self.head.chunks
        await self._write(chunks, replies, columns.stream_seq, pin)
        batch = columns.batch()
        if not self.p.siblings:
            return batch
        late = time.monotonic() - max(columns.first_received, self.renewed) > self.p.ack_wait / 2
        at_risk = {
            seq
            for seq, delivered in zip(columns.stream_seq, columns.delivered, strict=True)
            if late or delivered > 1
        }
        twice = await self._drop_taken_twice(at_risk)
        if not twice:
            return batch
        kept = [s not in twice for s in columns.stream_seq]
        self.head.count -= len(replies)
        await self._write(chunks, [r for r, k in zip(replies, kept, strict=True) if k], [], pin)
        self.taken -= twice
        for seq in twice:
            self.held.pop(seq, None)  # no longer renewed: it comes back to a slot
        return batch.filter(pa.array(kept))

    async def _write(
        self, chunks: list[str], replies: list[bytes], seqs: list[int], pin: str | None
    ) -> None:
        """Store `replies` as the chunks that follow `chunks` and update the head."""
        self.head.chunks = chunks
        keys = await self.ledger.write_chunk(self.p.gen, self.p.slot, self.head, replies)
        self.head.chunks = [*chunks, *keys]
        self.head.count += len(replies)
        self.head.max_seq = max(self.head.max_seq, max(seqs, default=0))
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


def _consumer_gone(error: PullError) -> bool:
    return error.status == 503 or (
        error.status == 409 and "consumer deleted" in error.description.lower()
    )


async def _until_ended(pull: Pull) -> AsyncIterator[list[RawMessage]]:
    """The pull's chunks of deliveries, then an empty one once it has ended."""
    async for chunk in pull:
        yield chunk
    yield []


def _complete(status: PullStatus) -> bool:
    """Whether a pull that ended with `status` got all it could: more may be ready at once."""
    return status is PullStatus.BATCH_COMPLETE or status is PullStatus.MAX_BYTES


def _sent_all(pull: Pull) -> bool:
    """Whether `pull` delivered all it could: the next one can be sent before its messages are
    processed."""
    return pull.done and pull.received > 0 and _complete(pull.status)


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
        try:
            while True:
                try:
                    batch = run_sync(batches.__anext__())
                except StopAsyncIteration:
                    break
                yield batch
        finally:
            run_sync(batches.aclose())  # when Spark stops early: end pulls, free the inbox
        run_sync(reader.seal())
    if reader.lost:
        log.warning("slot %s lost %d messages to retention", partition.slot, reader.lost)
    log.debug(
        "slot %s of batch %d: %d rows (%d replayed), %d redeliveries of earlier batches dropped",
        partition.slot,
        partition.gen,
        reader.head.count,
        len(reader.replay),
        reader.redundant,
    )
