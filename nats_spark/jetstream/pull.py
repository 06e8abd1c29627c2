"""The connector's one JetStream pull, with what nats-py cannot do (priority groups, ADR-42):
the group source's slot reads, the member runtime and the `nats` format's range reads all pull
through it.

Names follow nats.go's JetStream API: a `PullConsumer` `fetch`es batches; `PullRequest` is the
JSON body of `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`. Statuses are read by
`jetstream/status.py`; how each ends a fetch is decided here (`PullStatus`, or an error). What
arrives is gathered in the consumer's `PullInbox` (`pull_inbox.py`); `pull_loop.py` keeps pulls
going for the readers that pull continuously.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError

from nats_spark import clock
from nats_spark.errors import PriorityGroupMisconfigured, PullError
from nats_spark.jetstream.api import to_nanos
from nats_spark.jetstream.pull_inbox import PullInbox
from nats_spark.jetstream.status import Status, StatusKind
from nats_spark.jetstream.subjects import AckNumbers, ack_numbers
from nats_spark.nats_py import MessageColumns

PIN_ID_HEADER = "Nats-Pin-Id"
PULL_MAX_BYTES = 8 << 20  # what one pull request may deliver: bounds a task's memory


class PullStatus(Enum):
    """Why a fetch ended."""

    BATCH_COMPLETE = "batch complete"
    NO_MESSAGES = "no messages"  # 404 on a no-wait pull
    TIMEOUT = "request timeout"  # 408: expired, or someone else holds the pin
    PIN_MISMATCH = "pin id mismatch"  # 423: our pin id is stale; it has been cleared
    MAX_BYTES = "max bytes reached"  # 409 Message Size Exceeds MaxBytes / batch-bytes limits
    INTERRUPTED = "interrupted"  # 409 leadership change, server shutdown, max waiting exceeded
    HEARTBEAT_MISSED = "heartbeat missed"  # nothing, not even a heartbeat, for 2 intervals
    CLIENT_TIMEOUT = "client timeout"  # the server never ended the request


def max_bytes_after(status: PullStatus, received: int, max_bytes: int) -> int:
    """The byte cap of the pulls after one that ended with `status`, having delivered `received`
    messages: a pull stopped by the cap before its first message met a message larger than the
    cap on its own, which no capped pull can deliver: lift the cap (0: uncapped)."""
    return 0 if status is PullStatus.MAX_BYTES and not received else max_bytes


# How a status the server ended a pull with ends the fetch; the other kinds raise (`_REFUSALS`).
_ENDINGS = {
    StatusKind.BATCH_COMPLETED: PullStatus.BATCH_COMPLETE,
    StatusKind.NO_MESSAGES: PullStatus.NO_MESSAGES,
    StatusKind.TIMEOUT: PullStatus.TIMEOUT,
    StatusKind.PIN_MISMATCH: PullStatus.PIN_MISMATCH,
    StatusKind.MAX_BYTES: PullStatus.MAX_BYTES,
    StatusKind.LEADERSHIP_CHANGE: PullStatus.INTERRUPTED,
    StatusKind.SERVER_SHUTDOWN: PullStatus.INTERRUPTED,
    StatusKind.MAX_WAITING: PullStatus.INTERRUPTED,
    StatusKind.INTERRUPTED: PullStatus.INTERRUPTED,
}

# Statuses after which the consumer can no longer be pulled as asked: configuration problems, not
# weather. The hint of each.
_REFUSALS = {
    StatusKind.CONSUMER_DELETED: "the consumer was deleted; recreate it (or let the group member "
    "do so)",
    StatusKind.PUSH_CONSUMER: "the consumer is a push consumer; use a pull consumer",
    StatusKind.BATCH_LIMIT: "lower the batch size below the consumer's max_batch",
    StatusKind.EXPIRES_LIMIT: "lower the fetch timeout below the consumer's max_expires",
    StatusKind.BYTES_LIMIT: "lower max bytes below the consumer's max_bytes",
    StatusKind.BAD_REQUEST: "the pull request's options do not fit; check batch, expires, idle "
    "heartbeat (at most half of expires) and max bytes",
}


@dataclass(frozen=True)
class PullRequest:
    """Body of a pull request; durations in seconds, sent as nanoseconds."""

    batch: int = 1
    expires: float | None = None
    max_bytes: int = 0
    no_wait: bool = False
    idle_heartbeat: float | None = None
    group: str | None = None
    id: str | None = None
    min_pending: int = 0
    min_ack_pending: int = 0
    priority: int | None = None

    def payload(self) -> bytes:
        body: dict[str, Any] = {"batch": self.batch}
        if self.expires:
            body["expires"] = to_nanos(self.expires)
        if self.max_bytes:
            body["max_bytes"] = self.max_bytes
        if self.no_wait:
            body["no_wait"] = True
        if self.idle_heartbeat:
            body["idle_heartbeat"] = to_nanos(self.idle_heartbeat)
        if self.group:
            body["group"] = self.group
        if self.id:
            body["id"] = self.id
        if self.min_pending:
            body["min_pending"] = self.min_pending
        if self.min_ack_pending:
            body["min_ack_pending"] = self.min_ack_pending
        if self.priority is not None:
            body["priority"] = self.priority
        return json.dumps(body, separators=(",", ":")).encode()


class Deliveries(MessageColumns):
    """Deliveries as the connection's parser gathered them (nothing decoded), every one with its
    ack subject as reply. Filled first, then read: the numbers their ack subjects carry are
    parsed once, for all of them, when first asked for."""

    @cached_property
    def numbers(self) -> AckNumbers:
        return ack_numbers(self.replies)


def header_values(raw: bytes | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Headers of a message (delivered or stored): each name once, in order, with all its values.

    Lines follow nats-py's rules: the name is ASCII without whitespace (else the line is
    skipped), the value is stripped and invalid UTF-8 becomes U+FFFD.
    """
    if not raw:
        return ()
    found: dict[str, list[str]] = {}
    for line in raw.split(b"\r\n")[1:]:  # after `NATS/1.0`
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if key and not any(c.isspace() for c in key):
            found.setdefault(key, []).append(value.strip().decode("utf-8", "replace"))
    return tuple((key, tuple(values)) for key, values in found.items())


def parse_headers(raw: bytes | None) -> dict[str, str] | None:
    """Headers as nats-py's `Msg.headers` has them: the last value of each name."""
    return {key: values[-1] for key, values in header_values(raw)} or None


_PIN_LINE = f"\r\n{PIN_ID_HEADER}:".encode()


def _pin_of(headers: bytes) -> str | None:
    start = headers.find(_PIN_LINE)
    if start < 0:
        return None
    start += len(_PIN_LINE)
    return headers[start : headers.index(b"\r\n", start)].strip().decode()


@dataclass
class FetchResult:
    """What one pull request yielded, and why it ended."""

    deliveries: Deliveries = field(default_factory=Deliveries)
    status: PullStatus = PullStatus.BATCH_COMPLETE
    description: str = ""
    heartbeats: int = 0
    nc: NATS | None = field(default=None, repr=False)

    @cached_property
    def messages(self) -> list[Msg]:
        """The deliveries as nats-py messages (built on first use; `deliveries` is the cheap
        form)."""
        return as_messages(self.nc, self.deliveries)


def as_messages(nc: NATS | None, deliveries: Deliveries) -> list[Msg]:
    """`deliveries` as nats-py messages of connection `nc` (which their `ack()` uses)."""
    d = deliveries
    return [
        Msg(
            _client=nc,  # type: ignore[arg-type]
            subject=subject.decode(),
            reply=reply.decode(),
            data=data,
            headers=parse_headers(headers),
        )
        for subject, reply, data, headers in zip(
            d.subjects, d.replies, d.data, d.headers, strict=True
        )
    ]


CLIENT_GRACE = 5.0  # seconds past a request's expiry before the client stops waiting for it


class Pull:
    """One pull request in flight. Iterating yields its deliveries in chunks as they arrive (all
    that is buffered at each step), or with `whole` in one chunk once it has ended: the reader
    is then woken when the request can have ended (its status came or its batch is in; with
    idle heartbeats, at each arrival), not after every socket read, which brings a dozen
    deliveries while it keeps up with the server. When iteration ends, `status` says why the
    request ended."""

    def __init__(
        self,
        consumer: PullConsumer,
        reply: str,
        batch: int,
        expires: float,
        quiet: float | None,
        whole: bool = False,
        grace: float = CLIENT_GRACE,
    ) -> None:
        self.consumer = consumer
        self.inbox = consumer.inbox
        self.reply = reply.encode()
        self.batch = batch
        self.sent = clock.monotonic()  # no delivery of it left the server before
        self.deadline = time.monotonic() + expires + grace  # the server ends it first
        self.quiet = quiet
        self.whole = whole
        self.received = 0
        self.done = False
        self.status = PullStatus.BATCH_COMPLETE
        self.ended_by: Status | None = None  # the status message that ended it, if one did
        self.heartbeats = 0

    @property
    def description(self) -> str:
        return self.ended_by.description if self.ended_by else ""

    def __aiter__(self) -> Pull:
        return self

    async def __anext__(self) -> Deliveries:
        chunk = Deliveries()
        try:
            while not self.done:
                # a status that fails the request drops what it gathered
                chunk.extend(self._take())
                if chunk and not self.whole:
                    return chunk
                if not self.done and not await self._wait():
                    # Given up: what the server delivered for it goes out now. A whole pull
                    # wakes only for its full batch: what it left in the inbox went out with the
                    # next request's end, unkept until then (a server restart forgot a pull).
                    chunk.extend(self._take())
        except asyncio.CancelledError:
            # Its reader was cut off (a packed task that Spark stopped early cancels its slots):
            # what it gathered is no longer in the inbox, and would wait out its ack wait,
            # behind newer messages of its keys, unless `collect_late` hands it to the give-back.
            self.consumer.cut_off.extend(chunk)
            raise
        if chunk:
            return chunk
        raise StopAsyncIteration

    def _take(self) -> Deliveries:
        """Deliveries buffered for this request, up to its batch; ends it on its status."""
        chunk = Deliveries()
        room = self.batch - self.received
        while room:
            # Requests run one at a time; one that outlived its fetch may still deliver, and
            # what it delivers is ours all the same.
            found = self.inbox.take_run(room, chunk)
            room = self.batch - self.received - len(chunk)
            if found is None:
                break
            subject, status = found
            if subject != self.reply:
                continue  # the end of an earlier request
            if not status.ends_request:
                self.heartbeats += 1
                continue
            self.ended_by = status
            self.status = self.consumer.ending(status)
            self.done = True
            break
        self.received += len(chunk)
        if not room:
            self.done = True
            self.inbox.ended(self.reply)  # served in full: no status follows
        self.consumer.note_pin(chunk)
        return chunk

    async def _wait(self) -> bool:
        """Wait for the next arrival; end the request when none comes in time (False)."""
        wait = self.deadline - time.monotonic()
        if self.quiet is not None:
            wait = min(wait, self.quiet)
        if self.inbox.nc.is_closed:
            raise ConnectionClosedError
        # Deliveries hold back the server's idle heartbeats: a pull watching for them wakes
        # at each arrival, or a trickle short of its batch would look like a dead server.
        wanted = self.batch - self.received if self.whole and self.quiet is None else 1
        if wait > 0 and await self.inbox.arrival(wait, wanted):
            return True
        expired = time.monotonic() >= self.deadline
        self.status = PullStatus.CLIENT_TIMEOUT if expired else PullStatus.HEARTBEAT_MISSED
        self.done = True
        self.inbox.given_up(self.reply)
        return False


class PullConsumer:
    """Fetches from one pull consumer, optionally as a member of a priority group.

    Tracks the pin: the `Nats-Pin-Id` of delivered messages becomes `pin_id` and is sent with later
    pulls; a 423 clears it so the next pull asks to be pinned afresh.
    """

    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        group: str | None = None,
        pin_id: str | None = None,
        api_prefix: str = "$JS.API",
    ) -> None:
        self.nc = nc
        self.stream = stream
        self.consumer = consumer
        self.group = group
        self.pin_id = pin_id
        self.subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.inbox = PullInbox(nc, served_by_connected=api_prefix == "$JS.API")
        # What a whole pull had gathered when its reader was cancelled: `collect_late`'s
        self.cut_off = Deliveries()

    async def pull(
        self,
        batch: int,
        *,
        expires: float = 5.0,
        max_bytes: int = 0,
        no_wait: bool = False,
        idle_heartbeat: float | None = None,
        min_pending: int = 0,
        min_ack_pending: int = 0,
        priority: int | None = None,
        whole: bool = False,
        grace: float = CLIENT_GRACE,
    ) -> Pull:
        """Send one pull request; iterate the returned `Pull` for what it delivers (`whole`: in
        one chunk, once it has ended; `grace`: how long past its expiry the client waits for
        the server to end it, a request a server restart forgot)."""
        lasts = 0 if no_wait else expires
        reply = await self.inbox.new_reply(time.monotonic() + lasts + grace)
        request = PullRequest(
            batch=batch,
            expires=None if no_wait else expires,
            max_bytes=max_bytes,
            no_wait=no_wait,
            idle_heartbeat=idle_heartbeat,
            group=self.group,
            id=self.pin_id,
            min_pending=min_pending,
            min_ack_pending=min_ack_pending,
            priority=priority,
        )
        await self.nc.publish(self.subject, request.payload(), reply=reply)
        quiet = 2 * idle_heartbeat if idle_heartbeat else None
        return Pull(self, reply, batch, lasts, quiet, whole, grace)

    async def fetch(self, batch: int, **options: Any) -> FetchResult:
        """Send one pull request (options as for `pull`) and collect what it yields until it
        ends."""
        pull = await self.pull(batch, **options)
        result = FetchResult(nc=self.nc)
        async for chunk in pull:
            result.deliveries.extend(chunk)
        result.status, result.description = pull.status, pull.description
        result.heartbeats = pull.heartbeats
        return result

    def requested_since(self) -> float:
        """When the oldest request whose end has not come was made: a delivery `collect_late`
        gathers next was sent after it (its ack wait started then or later)."""
        return self.inbox.requested_since()

    async def collect_late(self, patience: float) -> Deliveries:
        """What requests given up on (or never iterated) still deliver: the server serves a pull
        until it ends it, whatever the client stopped waiting for. Waits until every request
        has ended (its status came, or it was due and did not come), at most `patience` seconds,
        and returns the deliveries; they are the caller's to take, else they come back only
        after the ack wait."""
        delivered, self.cut_off = self.cut_off, Deliveries()
        await self.inbox.collect_late(patience, delivered)
        self.note_pin(delivered)
        return delivered

    def note_pin(self, chunk: Deliveries) -> None:
        """Keep the newest pin id `chunk` carries (a priority group pins one client)."""
        if self.group is None:
            return  # pins come only with a priority group
        for headers in reversed(chunk.headers):  # the newest pin id wins
            pin = _pin_of(headers) if headers else None
            if pin:
                self.pin_id = pin
                return

    def ending(self, status: Status) -> PullStatus:
        """How `status`, which ended a pull, ends its fetch; raises when the consumer cannot be
        pulled as asked."""
        ending = _ENDINGS.get(status.kind)
        if status.kind is StatusKind.PIN_MISMATCH:
            self.pin_id = None  # the next pull asks to be pinned afresh
        if ending is not None:
            return ending
        where = f"{self.stream} > {self.consumer}"
        if status.kind is StatusKind.PRIORITY_REJECTED:
            raise PriorityGroupMisconfigured(
                status.code,
                f"{status.description} ({where}, group {self.group!r})",
                "the pull does not fit the consumer's priority policy; check the priority group "
                "name and the policy-specific options",
            )
        if status.kind is StatusKind.NO_RESPONDERS:
            raise PullError(
                status.code,
                f"no responders for {where}",
                "the stream or consumer does not exist; create it first",
            )
        hint = _REFUSALS.get(status.kind, "unexpected status from the server")
        raise PullError(status.code, f"{status.description} ({where})", hint)

    async def close(self) -> None:
        await self.inbox.close()
