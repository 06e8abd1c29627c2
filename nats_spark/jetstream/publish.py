"""JetStream publishes in bulk, each with a message id, every one confirmed by a PubAck.

Many publishes are in flight at once (raw `HPUB` commands queued on the connection, one reply
subscription for all the acks). A publish not acknowledged within `ack_timeout` is sent again
with the same message id, so that the stream's duplicate window drops whichever copy comes
second; that is what makes a resend (and a task retry that publishes the same rows again) safe.

With `atomic_batch` > 0 (streams with `allow_atomic`, nats-server 2.12+) consecutive messages go
as atomic batches: all of a batch is stored at its commit, or none of it, and one PubAck answers
for the batch. A batch is cut at fixed message counts, so a retry sends the same messages in the
same batches: the server then refuses the whole batch as holding a stored message id (10201),
which means it was stored before. In case an earlier attempt stored only some of them (one that
did not publish atomically), such a batch is sent again message by message, each with its id,
so that the stream stores exactly the missing ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from nats_spark.errors import TRANSIENT_ERROR_CODES, ErrorCode, NatsSparkError
from nats_spark.jetstream.status import StatusKind, parse_status
from nats_spark.nats_py import queue_command, route_raw, unroute_raw, write_queued

MSG_ID_HEADER = "Nats-Msg-Id"
BATCH_ID_HEADER = "Nats-Batch-Id"
BATCH_SEQUENCE_HEADER = "Nats-Batch-Sequence"
BATCH_COMMIT_HEADER = "Nats-Batch-Commit"
ATOMIC_BATCH_MAX = 1000  # the server's default `jetstream.limits.batch.max_msgs`

# Answers to an atomic batch that a new attempt of the same batch can fix.
_ATOMIC_RETRY_CODES = frozenset(
    {
        ErrorCode.ATOMIC_BATCH_INCOMPLETE,  # a message of it was lost (a reconnect)
        ErrorCode.ATOMIC_TOO_MANY_INFLIGHT,
        ErrorCode.DUPLICATE_IN_PROCESS,  # a copy is being stored right now
    }
)


class OutMessage(NamedTuple):
    """What to publish: subject, payload, headers (a name may repeat) and the message id."""

    subject: str
    data: bytes
    headers: Sequence[tuple[str, str]]
    msg_id: str


@dataclass
class PublishStats:
    published: int = 0  # stored by this publish
    duplicates: int = 0  # dropped by the stream as already stored (an earlier attempt's)
    resent: int = 0  # sent again after no PubAck came within the ack timeout
    batches: int = 0  # atomic batches stored


@dataclass
class _Unit:
    """What one PubAck answers for: one message, or an atomic batch of them."""

    messages: Sequence[OutMessage]
    atomic: bool
    command: bytes = b""
    sent: float = 0.0


class PublishFailed(NatsSparkError):
    """The server refused a publish for a reason a resend cannot fix."""


def _command(reply: str, message: OutMessage, batch: str = "") -> bytes:
    """`HPUB` of `message`; with `batch`, its lines are the batch's, already formatted."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in message.headers)
    header = f"NATS/1.0\r\n{MSG_ID_HEADER}: {message.msg_id}\r\n{batch}{extra}\r\n".encode()
    size = len(header) + len(message.data)
    return b"HPUB %s %s%d %d\r\n%s%s\r\n" % (
        message.subject.encode(),
        reply.encode() + b" " if reply else b"",
        len(header),
        size,
        header,
        message.data,
    )


def _render(unit: _Unit, reply: str) -> bytes:
    """The unit's commands; an atomic batch gets a new batch id each time it is sent."""
    if not unit.atomic:
        return _command(reply, unit.messages[0])
    batch = uuid.uuid4().hex
    last = len(unit.messages)
    return b"".join(
        _command(
            reply if n == last else "",  # the commit's PubAck answers for the batch
            message,
            f"{BATCH_ID_HEADER}: {batch}\r\n{BATCH_SEQUENCE_HEADER}: {n}\r\n"
            + (f"{BATCH_COMMIT_HEADER}: 1\r\n" if n == last else ""),
        )
        for n, message in enumerate(unit.messages, 1)
    )


class Publisher:
    """Publishes messages on `nc` with at most `max_pending` unacknowledged at a time, one by
    one or (`atomic_batch` > 0) in atomic batches of that many."""

    def __init__(
        self,
        nc: NATS,
        max_pending: int,
        ack_timeout: float,
        retry_timeout: float,
        atomic_batch: int = 0,
    ) -> None:
        self.nc = nc
        self.max_pending = max(max_pending, atomic_batch)
        self.ack_timeout = ack_timeout
        self.retry_timeout = retry_timeout
        self.atomic_batch = atomic_batch
        self.stats = PublishStats()
        self._inbox = nc.new_inbox()
        self._pending: dict[int, _Unit] = {}  # by reply index
        self._in_flight = 0  # messages in `_pending`
        self._gathered: list[OutMessage] = []  # the next atomic batch, until it is full
        self._split: list[_Unit] = []  # atomic batches to send again message by message
        self._acked = asyncio.Event()
        self._failure: BaseException | None = None
        self._progress = time.monotonic()
        self._next = 0
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(f"{self._inbox}.*")
        route_raw(self.nc, self._subscription, self._on_ack)

    async def send(self, messages: Iterable[OutMessage]) -> None:
        """Queue `messages` (waiting while `max_pending` are unacknowledged)."""
        for message in messages:
            if not self.atomic_batch:
                await self._dispatch(_Unit((message,), atomic=False))
                continue
            self._gathered.append(message)
            if len(self._gathered) == self.atomic_batch:
                await self._dispatch(_Unit(self._gathered, atomic=True))
                self._gathered = []
        await write_queued(self.nc)  # queued commands go out only when the flusher is asked
        self._raise_failure()

    async def finish(self) -> PublishStats:
        """Return once the stream confirmed every message sent."""
        if self._gathered:
            await self._dispatch(_Unit(self._gathered, atomic=True))
            self._gathered = []
            await write_queued(self.nc)
        while self._pending or self._split:
            await self._wait_for_acks()
        self._raise_failure()
        return self.stats

    async def stop(self) -> None:
        """Stop listening for PubAcks (after `finish`, or after a failure)."""
        if self._subscription is not None:
            subscription, self._subscription = self._subscription, None
            unroute_raw(self.nc, subscription)
            with contextlib.suppress(Exception):  # a closed connection took it already
                await subscription.unsubscribe()

    async def _dispatch(self, unit: _Unit) -> None:
        while self._in_flight + len(unit.messages) > self.max_pending:
            await write_queued(self.nc)
            await self._wait_for_acks()
        await self._queue(unit)

    async def _queue(self, unit: _Unit) -> None:
        index = self._next
        self._next += 1
        unit.command, unit.sent = _render(unit, f"{self._inbox}.{index}"), time.monotonic()
        self._pending[index] = unit
        self._in_flight += len(unit.messages)
        await queue_command(self.nc, unit.command)

    async def _wait_for_acks(self) -> None:
        self._raise_failure()
        self._acked.clear()
        try:
            await asyncio.wait_for(self._acked.wait(), self.ack_timeout / 2)
        except TimeoutError:
            await self._resend_overdue()
        if self._split:
            split, self._split = self._split, []
            for unit in split:  # in the room the batch held
                for message in unit.messages:
                    await self._queue(_Unit((message,), atomic=False))
            await write_queued(self.nc)
        self._raise_failure()

    async def _resend_overdue(self) -> None:
        now = time.monotonic()
        if now - self._progress > self.retry_timeout:
            raise PublishFailed(
                f"JetStream acknowledged none of {self._in_flight} publishes for "
                f"{self.retry_timeout:g}s (server down or no stream leader); the task fails and "
                "Spark retries it (message ids keep the retry from storing duplicates)"
            )
        for index, unit in list(self._pending.items()):
            if now - unit.sent >= self.ack_timeout:
                if unit.atomic:  # a batch is sent again whole, under a new batch id
                    unit.command = _render(unit, f"{self._inbox}.{index}")
                unit.sent = now
                self.stats.resent += len(unit.messages)
                await queue_command(self.nc, unit.command)
        await write_queued(self.nc)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _on_ack(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A PubAck (raw, from the connection's parser): `{"stream":…,"seq":…}`, with
        `"duplicate": true` when the id was stored before (`"batch"`, `"count"` for an atomic
        batch), or an error."""
        index = int(subject[subject.rindex(b".") + 1 :])
        unit = self._pending.pop(index, None)
        if unit is None:
            return  # the answer to a copy sent again: the first answer counted
        status = parse_status(headers) if headers is not None else None  # PubAcks have none
        no_responders = status is not None and status.kind is StatusKind.NO_RESPONDERS
        error = json.loads(data).get("error") or {} if b'"error"' in data else {}
        code = error.get("err_code")
        # The subjects were checked against the streams before: no responders (503) or an
        # error JetStream gives while it has no leader is a moment to wait out, and resend.
        if (
            no_responders
            or code in TRANSIENT_ERROR_CODES
            or (unit.atomic and code in _ATOMIC_RETRY_CODES)
        ):
            self._pending[index] = unit
            return
        self._in_flight -= len(unit.messages)
        self._progress = time.monotonic()
        self._acked.set()
        if unit.atomic and code == ErrorCode.ATOMIC_BATCH_HAS_DUPLICATE:
            self._split.append(unit)
        elif code == ErrorCode.ATOMIC_BATCH_TOO_LARGE:
            self._failure = PublishFailed(
                f"the server refused an atomic batch of {len(unit.messages)} messages as too "
                "large; set atomicBatchSize to at most the server's jetstream batch max_msgs"
            )
        elif error:
            self._failure = PublishFailed(
                f"JetStream refused a publish to {unit.messages[-1].subject!r}: "
                f"{error.get('description')} (error code {code}); fix the stream's limits or "
                "the data"
            )
        elif unit.atomic:
            self.stats.batches += 1
            self.stats.published += len(unit.messages)
        elif b'"duplicate"' in data:  # the server writes `"duplicate": true`, only when true
            self.stats.duplicates += 1
        else:
            self.stats.published += 1
