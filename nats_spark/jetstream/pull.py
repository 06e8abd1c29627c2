"""Pull requests on priority-group consumers (ADR-42), which nats-py cannot make.

Names follow nats.go's JetStream API: a `PullConsumer` `fetch`es batches; `PullRequest` is the
JSON body of `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from nats_spark.errors import PriorityGroupMisconfigured, PullError
from nats_spark.jetstream.api import to_nanos

PIN_ID_HEADER = "Nats-Pin-Id"
STATUS_HEADER = "Status"
DESCRIPTION_HEADER = "Description"

# 409 texts after which the consumer can no longer be pulled: configuration problems, not weather.
_FATAL_409 = {
    "consumer deleted": "the consumer was deleted; recreate it (or let the group member do so)",
    "consumer is push based": "the consumer is a push consumer; use a pull consumer",
    "exceeded maxrequestbatch": "lower the batch size below the consumer's max_batch",
    "exceeded maxrequestexpires": "lower the fetch timeout below the consumer's max_expires",
    "exceeded maxrequestmaxbytes": "lower max bytes below the consumer's max_bytes",
}


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


@dataclass
class FetchResult:
    messages: list[Msg] = field(default_factory=list)
    status: PullStatus = PullStatus.BATCH_COMPLETE
    description: str = ""
    heartbeats: int = 0


def status_of(msg: Msg) -> tuple[int, str] | None:
    """`(code, description)` of a status message, or None for a real message."""
    headers = msg.headers
    # Delivered messages always carry their ack subject as reply, statuses never do: a stored
    # message with a `Status` header of its own must not be mistaken for one.
    if msg.reply or not headers or STATUS_HEADER not in headers or msg.data:
        return None
    return int(headers[STATUS_HEADER]), headers.get(DESCRIPTION_HEADER, "")


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
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._request_no = 0

    async def _subscription(self) -> Subscription:
        if self._sub is None:
            self._sub = await self.nc.subscribe(
                f"{self._inbox}.*", pending_msgs_limit=-1, pending_bytes_limit=-1
            )
        return self._sub

    async def fetch(
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
    ) -> FetchResult:
        """Send one pull request and collect what it yields until it ends."""
        sub = await self._subscription()
        result = FetchResult()
        self._request_no += 1
        reply = f"{self._inbox}.{self._request_no}"
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
        deadline = time.monotonic() + (expires if not no_wait else 0) + 5.0
        quiet_limit = 2 * idle_heartbeat if idle_heartbeat else None
        while len(result.messages) < batch:
            wait = deadline - time.monotonic()
            if quiet_limit is not None:
                wait = min(wait, quiet_limit)
            if wait <= 0:
                result.status = PullStatus.CLIENT_TIMEOUT
                return result
            try:
                msg = await sub.next_msg(timeout=wait)
            except TimeoutError:
                expired = time.monotonic() >= deadline
                result.status = (
                    PullStatus.CLIENT_TIMEOUT if expired else PullStatus.HEARTBEAT_MISSED
                )
                return result
            status = status_of(msg)
            if status is None:
                # Delivered messages keep their own subject, so they cannot be matched to a
                # request. Requests run one at a time; one that outlived its fetch may still
                # deliver, and what it delivers is ours all the same.
                self._note_pin(msg)
                result.messages.append(msg)
                continue
            if msg.subject != reply:
                continue  # the end of an earlier request
            code, description = status
            if code == 100:
                result.heartbeats += 1
                continue
            result.description = description
            result.status = self._end_status(code, description)
            return result
        return result

    def _note_pin(self, msg: Msg) -> None:
        pin = msg.headers.get(PIN_ID_HEADER) if msg.headers else None
        if pin:
            self.pin_id = pin

    def _end_status(self, code: int, description: str) -> PullStatus:
        lowered = description.lower()
        where = f"{self.stream} > {self.consumer}"
        if code == 404:
            return PullStatus.NO_MESSAGES
        if code == 408:
            return PullStatus.TIMEOUT
        if code == 423:
            self.pin_id = None
            return PullStatus.PIN_MISMATCH
        if code == 409:
            for text, hint in _FATAL_409.items():
                if lowered.startswith(text):
                    raise PullError(code, f"{description} ({where})", hint)
            if "maxbytes" in lowered or "max bytes" in lowered:
                return PullStatus.MAX_BYTES
            return PullStatus.INTERRUPTED
        if code == 400 and "priority" in lowered:
            # Every priority-group rejection names it: "Priority Group missing", "Invalid Priority
            # Group", "Not a Overflow Priority consumer", "Priority must be between 0 and 9", ...
            raise PriorityGroupMisconfigured(
                code,
                f"{description} ({where}, group {self.group!r})",
                "the pull does not fit the consumer's priority policy; check the priority group "
                "name and the policy-specific options",
            )
        if code == 400:
            raise PullError(
                code,
                f"{description} ({where})",
                "the pull request's options do not fit; check batch, expires, idle heartbeat "
                "(at most half of expires) and max bytes",
            )
        if code == 503:
            raise PullError(
                code,
                f"no responders for {where}",
                "the stream or consumer does not exist; create it first",
            )
        raise PullError(code, f"{description} ({where})", "unexpected status from the server")

    async def unpin(self, api: Any) -> None:
        """Ask the server to drop the group's pin (step down); our own pin id is cleared."""
        await api.unpin(self.stream, self.consumer, self.group)
        self.pin_id = None

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
