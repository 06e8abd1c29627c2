"""JetStream publishes in bulk, each with a message id, every one confirmed by its PubAck.

Many publishes are in flight at once (raw `HPUB` commands queued on the connection, one reply
subscription for all the acks). A publish not acknowledged within `ack_timeout` is sent again
with the same message id, so that the stream's duplicate window drops whichever copy comes
second; that is what makes a resend (and a task retry that publishes the same rows again) safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from nats_spark.errors import TRANSIENT_ERROR_CODES, NatsSparkError
from nats_spark.nats_py import queue_command, route_raw, unroute_raw, write_queued

MSG_ID_HEADER = "Nats-Msg-Id"


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


class PublishFailed(NatsSparkError):
    """The server refused a publish for a reason a resend cannot fix."""


def _command(subject: str, reply: str, message: OutMessage) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in message.headers)
    header = f"NATS/1.0\r\n{MSG_ID_HEADER}: {message.msg_id}\r\n{extra}\r\n".encode()
    size = len(header) + len(message.data)
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
        subject.encode(),
        reply.encode(),
        len(header),
        size,
        header,
        message.data,
    )


class Publisher:
    """Publishes messages on `nc` with at most `max_pending` unacknowledged at a time."""

    def __init__(
        self, nc: NATS, max_pending: int, ack_timeout: float, retry_timeout: float
    ) -> None:
        self.nc = nc
        self.max_pending = max_pending
        self.ack_timeout = ack_timeout
        self.retry_timeout = retry_timeout
        self.stats = PublishStats()
        self._inbox = nc.new_inbox()
        self._pending: dict[int, tuple[bytes, float, str]] = {}  # index: command, sent, subject
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
            while len(self._pending) >= self.max_pending:
                await write_queued(self.nc)
                await self._wait_for_acks()
            index = self._next
            self._next += 1
            command = _command(message.subject, f"{self._inbox}.{index}", message)
            self._pending[index] = (command, time.monotonic(), message.subject)
            await queue_command(self.nc, command)
        await write_queued(self.nc)  # queued commands go out only when the flusher is asked
        self._raise_failure()

    async def finish(self) -> PublishStats:
        """Return once the stream confirmed every message sent."""
        while self._pending:
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

    async def _wait_for_acks(self) -> None:
        self._raise_failure()
        self._acked.clear()
        try:
            await asyncio.wait_for(self._acked.wait(), self.ack_timeout / 2)
        except TimeoutError:
            await self._resend_overdue()
        self._raise_failure()

    async def _resend_overdue(self) -> None:
        now = time.monotonic()
        if now - self._progress > self.retry_timeout:
            raise PublishFailed(
                f"JetStream acknowledged none of {len(self._pending)} publishes for "
                f"{self.retry_timeout:g}s (server down or no stream leader); the task fails and "
                "Spark retries it (message ids keep the retry from storing duplicates)"
            )
        for index, (command, sent, subject) in list(self._pending.items()):
            if now - sent >= self.ack_timeout:
                self._pending[index] = (command, now, subject)
                self.stats.resent += 1
                await queue_command(self.nc, command)
        await write_queued(self.nc)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _on_ack(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A PubAck (raw, from the connection's parser): `{"stream":…,"seq":…}`, with
        `"duplicate":true` when the id was stored before, or an error."""
        index = int(subject[subject.rindex(b".") + 1 :])
        entry = self._pending.pop(index, None)
        if entry is None:
            return  # the answer to a copy sent again: the first answer counted
        no_responders = headers is not None and headers.startswith(b"NATS/1.0 503")
        error = json.loads(data).get("error") or {} if b'"error"' in data else {}
        # The subjects were checked against the streams before: no responders (503) or an
        # error JetStream gives while it has no leader is a moment to wait out, and resend.
        if no_responders or error.get("err_code") in TRANSIENT_ERROR_CODES:
            self._pending[index] = entry
            return
        self._progress = time.monotonic()
        self._acked.set()
        if error:
            self._failure = PublishFailed(
                f"JetStream refused a publish to {entry[2]!r}: {error.get('description')} "
                f"(error code {error.get('err_code')}); fix the stream's limits or the data"
            )
        elif b'"duplicate":true' in data:
            self.stats.duplicates += 1
        else:
            self.stats.published += 1
