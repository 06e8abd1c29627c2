"""Executor side of format `nats` reads: the messages of one sequence range as Arrow batches.

Two ways to read a range, neither of which acks anything or leaves anything behind:

- An ephemeral pull consumer without acks (`ack_policy: none`, R1, in memory) starting at the
  range, deleted at the end (and by the server after `inactive_threshold` if the task dies).
  The default: under Spark it measured faster than direct get (bench/batch_read.py), with less
  server and worker CPU per message.
- Batch direct get (`$JS.API.DIRECT.GET.<stream>`, nats-server 2.11+, streams with
  `allow_direct`), on request (`readPath=direct`): stateless requests of up to `batch` messages
  from a sequence, two in flight; no consumer is created at all.

Any surprise (a lost delivery, an error status, no answer) fails the task: a range read has no
state, so Spark's retry of the task reads the same range again.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from nats.aio.subscription import Subscription
from pyspark.sql.datasource import InputPartition

from nats_spark.client import NatsClient, shared_client
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NatsSparkError, NotFound, PullError
from nats_spark.jetstream.acks import delivered_at
from nats_spark.jetstream.api import to_nanos
from nats_spark.jetstream.pull import (
    CLIENT_GRACE,
    PULL_MAX_BYTES,
    Deliveries,
    Pull,
    PullStatus,
    header_values,
    max_bytes_after,
)
from nats_spark.jetstream.pull_loop import PullLoop, PullPlan
from nats_spark.jetstream.status import StatusKind, parse_status
from nats_spark.loop import run_sync
from nats_spark.nats_py import route_raw, unroute_raw
from nats_spark.spark.shared.columns import (
    batch_full,
    bytes_array,
    constant,
    headers_array,
    record_batch,
    timestamps_from_nanos,
    timestamps_from_text,
)
from nats_spark.spark.shared.worker_gc import freeze_imports

_IN_FLIGHT = 2  # requests outstanding: the next one is served while the last is processed
_ANSWER_TIMEOUT = 10.0  # no message nor status for this long: the request was lost
_PULL_EXPIRES = 2.0
_CONSUMER_INACTIVE = 60.0  # the server deletes a consumer left behind by a dead task


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One task's share of a read: stream sequences `first..last`, both inclusive."""

    connection: ConnectionSettings
    stream: str
    first: int
    last: int
    subjects: tuple[str, ...]
    direct: bool  # batch direct get; else an ephemeral ordered consumer
    include_headers: bool
    batch_size: int


class RangeColumns:
    """What the rows of one record batch are made of. Timestamps are RFC 3339 text (direct get)
    or Unix nanoseconds (consumer deliveries)."""

    def __init__(self, stream: str, text_stamps: bool) -> None:
        self.stream = stream
        self.text_stamps = text_stamps
        self.subjects: list[bytes] = []
        self.data: list[bytes] = []
        self.headers: list[bytes | None] = []  # raw header blocks, user headers only
        self.seqs: list[int] = []
        self.stamps: list[bytes] | list[int] = []
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.seqs)

    def full(self) -> bool:
        return batch_full(len(self.seqs), self.nbytes)

    def record_batch(self, include_headers: bool) -> pa.RecordBatch:
        n = len(self.seqs)
        stamps = self.stamps
        timestamp = (
            timestamps_from_text(stamps)  # type: ignore[arg-type]
            if self.text_stamps
            else timestamps_from_nanos(stamps)  # type: ignore[arg-type]
        )
        return record_batch(
            subject=bytes_array(self.subjects, pa.string()),
            data=self.data,
            headers=headers_array(self.headers, include_headers),
            partition=pa.nulls(n, pa.int32()),  # no group
            member=None,
            stream=self.stream,
            stream_seq=self.seqs,
            consumer_seq=pa.nulls(n, pa.int64()),  # no consumer of the user's
            delivered=constant(1, n, pa.int32()),  # every row is a first read
            timestamp=timestamp,
        )


@dataclass
class _Window:
    """One direct get request: `batch` messages from `start`, of which those up to `stop` count."""

    id: int
    start: int
    stop: int
    last: int = 0  # last sequence taken


_DIRECT_MARK = b"\r\nNats-Stream: "  # the first of the headers a direct get appends


class DirectRangeRead:
    """Batch direct gets on one inbox, answered into `columns` by the connection's parser (raw
    route); `next_batch` sends requests and waits until a batch is full or the range is done.

    Without a filter, requests cover disjoint windows of `batch` sequences (a window holds at most
    `batch` messages, so one answer has them all, in order); with one, each asks for the next
    `batch` matching messages after the last one received."""

    def __init__(self, client: NatsClient, partition: RangePartition) -> None:
        self.client = client
        self.partition = partition
        self.columns = RangeColumns(partition.stream, text_stamps=True)
        self.inbox = client.nc.new_inbox()
        self.reply_prefix = len(self.inbox) + 1
        self.sub: Subscription | None = None
        self.finished = False
        self.error: Exception | None = None
        self.wake = asyncio.Event()
        self.request_id = 0
        self.filter = partition.subjects[0] if partition.subjects else None
        self.subject = f"{client.api.prefix}.DIRECT.GET.{partition.stream}"
        self.windows: deque[_Window] = deque()
        self.next_seq = partition.first
        self.retry_deadline: float | None = None

    async def open(self) -> None:
        sub = await self.client.nc.subscribe(f"{self.inbox}.*")
        route_raw(self.client.nc, sub, self._receive)
        self.sub = sub

    def _fail(self, error: Exception) -> None:
        self.error = self.error or error
        self.wake.set()

    async def next_batch(self) -> pa.RecordBatch | None:
        while not self.finished and not self.columns.full() and self.error is None:
            self.wake.clear()  # before sending: an answer may arrive while a send waits
            await self._send()
            if self.finished or self.wake.is_set():
                continue
            try:
                await asyncio.wait_for(self.wake.wait(), _ANSWER_TIMEOUT)
            except TimeoutError:
                self._no_answer()
        if self.error is not None:
            raise self.error
        if not self.columns and self.finished:
            return None
        columns, self.columns = self.columns, RangeColumns(self.partition.stream, text_stamps=True)
        return columns.record_batch(self.partition.include_headers)

    async def close(self) -> None:
        if self.sub is not None:
            unroute_raw(self.client.nc, self.sub)
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
            self.sub = None

    async def _send(self) -> None:
        p = self.partition
        while len(self.windows) < _IN_FLIGHT and self.next_seq <= p.last:
            count = min(p.batch_size, p.last - self.next_seq + 1)
            stop = p.last if self.filter else self.next_seq + count - 1
            self.request_id += 1
            window = _Window(self.request_id, self.next_seq, stop)
            body: dict[str, object] = {"seq": window.start, "batch": count}
            body["max_bytes"] = PULL_MAX_BYTES
            if self.filter:
                body["next_by_subj"] = self.filter
            self.windows.append(window)
            self.next_seq = stop + 1
            payload = json.dumps(body, separators=(",", ":")).encode()
            await self.client.nc.publish(self.subject, payload, reply=f"{self.inbox}.{window.id}")
        if not self.windows and self.next_seq > p.last:
            self.finished = True

    def _receive(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        window = self.windows[0] if self.windows else None
        if window is None or int(subject[self.reply_prefix :]) != window.id or self.finished:
            return  # the answer to a request given up (see `_continue`)
        if headers is None:
            self._fail(
                NatsSparkError(f"direct get of {self.partition.stream} answered without headers")
            )
            return
        if headers.startswith(b"NATS/1.0\r\n"):
            self._take(window, data, headers)
        else:
            self._status(window, headers)

    def _take(self, window: _Window, data: bytes, headers: bytes) -> None:
        at = headers.rfind(_DIRECT_MARK)
        _, subject, seq_line, stamp, _ = headers[at + 2 :].split(b"\r\n", 4)
        seq = int(seq_line[15:])  # `Nats-Sequence: `
        if seq > window.stop:
            return  # past the window (gaps inside it): the next window has it
        window.last = seq
        c = self.columns
        c.subjects.append(subject[14:])  # `Nats-Subject: `
        c.data.append(data)
        c.nbytes += len(data)
        c.headers.append(headers[:at] + b"\r\n\r\n" if at > 8 else None)  # `NATS/1.0` only: none
        c.seqs.append(seq)
        c.stamps.append(stamp[17:])  # type: ignore[arg-type]  # `Nats-Time-Stamp: `
        if c.full():
            self.wake.set()

    def _status(self, window: _Window, headers: bytes) -> None:
        status = parse_status(headers)
        kind = status.kind if status is not None else StatusKind.OTHER
        self.windows.popleft()
        if kind is StatusKind.NO_MESSAGES:  # nothing (matching) at or after the window's start
            self.windows.clear()
            self.next_seq = self.partition.last + 1
        elif kind is StatusKind.END_OF_BATCH:
            values = dict(header_values(headers))
            pending = int(values["Nats-Num-Pending"][0])
            last = int(values["Nats-Last-Sequence"][0])
            if last < window.stop and pending > 0:
                # Cut short by max bytes, or the batch count of a filtered request: go on after
                # `last`; the windows after this one are asked again, so rows stay in order.
                self._continue(last + 1)
        else:
            line = headers.split(b"\r\n", 1)[0].decode(errors="replace")
            self._fail(
                NatsSparkError(
                    f"direct get of stream {self.partition.stream} failed: {line}; check the "
                    "stream's allow_direct and the user's permission for $JS.API.DIRECT.GET"
                )
            )
        self.wake.set()

    def _continue(self, seq: int) -> None:
        self.windows.clear()
        self.next_seq = seq

    def _no_answer(self) -> None:
        """A lost request or answer (a reconnect): ask again from the last message taken, for up
        to the connection's retry timeout."""
        now = time.monotonic()
        if self.retry_deadline is None:
            self.retry_deadline = now + self.client.settings.retry_timeout
        if now > self.retry_deadline or not self.windows:
            raise _no_answer(self.partition, _ANSWER_TIMEOUT)
        window = self.windows[0]
        self._continue(window.last + 1 if window.last else window.start)


class ConsumerRangeRead:
    """An ephemeral pull consumer without acks from the range's first sequence, read through
    `PullConsumer` (request body, inbox, statuses); pulls are sized so they never ask for more
    than the range can still hold, `_IN_FLIGHT` at a time, and taken a chunk at a time."""

    def __init__(self, client: NatsClient, partition: RangePartition) -> None:
        self.client = client
        self.partition = partition
        self.name = f"nats-spark-read-{uuid.uuid4().hex[:16]}"
        self.consumer = client.pull_consumer(partition.stream, self.name)
        self.loop = PullLoop(self.consumer, self._plan, in_flight=_IN_FLIGHT)
        self.outstanding = 0  # messages asked for and not delivered yet
        self.last_seq = partition.first - 1
        self.consumer_seq = 0
        self.pending = 0  # messages after the last delivery, per the server
        self.max_bytes = PULL_MAX_BYTES
        self.created = False
        self.finished = False

    async def open(self) -> None:
        config: dict[str, object] = {
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": self.partition.first,
            "ack_policy": "none",
            "replay_policy": "instant",
            "inactive_threshold": to_nanos(_CONSUMER_INACTIVE),
            "mem_storage": True,
            "num_replicas": 1,
        }
        if len(self.partition.subjects) == 1:
            config["filter_subject"] = self.partition.subjects[0]
        elif self.partition.subjects:
            config["filter_subjects"] = list(self.partition.subjects)
        info = await self.client.api.create_consumer(self.partition.stream, self.name, config)
        self.created = True
        self.pending = info.num_pending
        self.finished = self.pending == 0

    def _plan(self) -> PullPlan | None:
        """The next pull: never more than the range can still hold."""
        room = min(self.pending, self.partition.last - self.last_seq) - self.outstanding
        if room <= 0:
            return None
        batch = min(self.partition.batch_size, room)
        self.outstanding += batch
        return PullPlan(batch, _PULL_EXPIRES, self.max_bytes)

    async def next_batch(self) -> pa.RecordBatch | None:
        columns = RangeColumns(self.partition.stream, text_stamps=False)
        while not self.finished and not columns.full():
            try:
                got = await self.loop.next()
            except PullError:
                raise self._failed(self.loop.pulls[0]) from None
            assert got is not None  # while the range is not done, a pull is out
            if isinstance(got, Pull):
                self._ended(got)
            else:
                self._take(got, columns)
        if not columns and self.finished:
            return None
        return columns.record_batch(self.partition.include_headers)

    def _take(self, chunk: Deliveries, columns: RangeColumns) -> None:
        """Add the deliveries of `chunk` up to the range's end to `columns`, by column."""
        n = len(chunk)
        if not n:
            return
        self.outstanding -= n
        _, seqs, consumer_seqs, stamps = chunk.numbers
        first = self.consumer_seq + 1
        if consumer_seqs[0] != first or consumer_seqs[-1] != first + n - 1:
            # Consumer sequences rise by one per delivery (no acks, no redeliveries): a gap.
            at = next((i for i, seq in enumerate(consumer_seqs) if seq != first + i), n - 1)
            raise NatsSparkError(
                f"deliveries {first + at}..{consumer_seqs[at] - 1} of the read of stream "
                f"{self.partition.stream} were lost (a reconnect?); Spark runs the task again"
            )
        self.consumer_seq = consumer_seqs[-1]
        keep = bisect.bisect_right(
            seqs, self.partition.last
        )  # what the last pulls bring past the range
        if keep:
            data = chunk.data[:keep]
            columns.subjects += chunk.subjects[:keep]
            columns.data += data
            columns.nbytes += sum(map(len, data))
            columns.headers += chunk.headers[:keep]
            columns.seqs += seqs[:keep]
            columns.stamps += stamps[:keep]  # type: ignore[operator]
            self.last_seq = seqs[keep - 1]
            tokens = chunk.replies[keep - 1].split(b".")
            self.pending = int(tokens[delivered_at(tokens, chunk.replies[keep - 1]) + 4])
        if keep < n or self.last_seq == self.partition.last or not self.pending:
            self.finished = True

    def _ended(self, pull: Pull) -> None:
        """Account for a pull that ended; fail the read on anything but a normal end."""
        self.outstanding -= pull.batch - pull.received
        if not self.loop.pulls:
            self.outstanding = 0
        if pull.status is PullStatus.TIMEOUT and not pull.received and not self.loop.pulls:
            # A pull waited its whole expiry for nothing: the consumer has no more messages
            # (some the server counted as pending were deleted meanwhile).
            self.finished = True
        elif pull.status is PullStatus.MAX_BYTES:
            self.max_bytes = max_bytes_after(pull.status, pull.received, self.max_bytes)
        elif pull.status is PullStatus.CLIENT_TIMEOUT:
            raise _no_answer(self.partition, _PULL_EXPIRES + CLIENT_GRACE)
        elif pull.status not in (PullStatus.TIMEOUT, PullStatus.BATCH_COMPLETE):
            raise self._failed(pull)

    def _failed(self, pull: Pull) -> NatsSparkError:
        line = f"NATS/1.0 {pull.ended_by.line}" if pull.ended_by else pull.status.value
        return NatsSparkError(
            f"pull from the read consumer of stream {self.partition.stream} failed: {line}; "
            "Spark runs the task again"
        )

    async def close(self) -> None:
        await self.consumer.close()
        if self.created:
            with contextlib.suppress(NotFound):
                await self.client.api.delete_consumer(self.partition.stream, self.name)
            self.created = False


def _no_answer(partition: RangePartition, seconds: float) -> NatsSparkError:
    return NatsSparkError(
        f"no answer from NATS for {seconds:.0f}s while reading stream {partition.stream} "
        f"{partition.first}..{partition.last}; check the server, then let Spark run the task again"
    )


def read_range(partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """The messages of `partition`'s sequence range (what `read` of both readers returns)."""
    if partition.first > partition.last:
        return
    freeze_imports()
    client = shared_client(partition.connection)
    kind = DirectRangeRead if partition.direct else ConsumerRangeRead
    reader = kind(client, partition)
    try:
        run_sync(reader.open())
        while (batch := run_sync(reader.next_batch())) is not None:
            if batch.num_rows:
                yield batch
    finally:
        run_sync(reader.close())  # also when Spark stops early: no inbox or consumer left
