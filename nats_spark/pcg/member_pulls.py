"""The pulling half of a running group member instance: pulls its consumer in the priority group
`PCG` and hands each message to the handler, until halted or the consumer is gone.

A long pull asks for one message, so a lone message is handed over at once; while pinned and
messages keep coming, no-wait pulls take up to `batch` at a time. Every pull lasts less than
`priority_timeout`, so an idle pinned instance keeps its pin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nats.aio.msg import Msg

from nats_spark.errors import NatsSparkError, PullError
from nats_spark.jetstream.pull import Deliveries, Pull, PullStatus, as_messages
from nats_spark.jetstream.pull_loop import PullLoop, PullPlan
from nats_spark.pcg.consumers import PRIORITY_GROUP, GroupConsumer, pull_expires
from nats_spark.pcg.partitioning import strip_partition

if TYPE_CHECKING:  # annotations only: parsing a format's options imports pcg, not the connection
    from nats_spark.client import NatsClient

log = logging.getLogger(__name__)

RETRY_PAUSE = 0.5  # seconds to wait after a pull that ended without an answer from the server
_RETRY_STATUSES = {PullStatus.HEARTBEAT_MISSED, PullStatus.INTERRUPTED, PullStatus.CLIENT_TIMEOUT}

Handler = Callable[["GroupMessage"], Awaitable[None]]


@dataclass(frozen=True)
class GroupMessage:
    """A message of the group: its subject without the partition token, and the raw message."""

    subject: str
    partition: int
    msg: Msg

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def headers(self) -> dict[str, str] | None:
        return self.msg.headers

    async def ack(self) -> None:
        await self.msg.ack()


class MemberPulls:
    """Pulls one member consumer for one instance; `run` until `halt` is set or the consumer
    is gone. `waiting`: it waits on the server, holding no message (safe to cancel)."""

    def __init__(
        self,
        client: NatsClient,
        consumer: GroupConsumer,
        handler: Handler,
        batch: int,
        ack_wait: float,
        name: str,
    ) -> None:
        self.client = client
        self.puller = client.pull_consumer(consumer.stream, consumer.name, group=PRIORITY_GROUP)
        self.handler = handler
        self.batch = batch
        self.expires = pull_expires(ack_wait)
        self.name = name
        self.halt = asyncio.Event()
        self.waiting = False
        self.drain = False  # the next pull takes what is ready, up to `batch`, without waiting
        self.standing_by: bool | None = None  # last reported role; None: not known yet
        self.loop = PullLoop(self.puller, self._plan)

    @property
    def pin_id(self) -> str | None:
        return self.puller.pin_id

    def _plan(self) -> PullPlan:
        if self.drain:
            return PullPlan(self.batch, None)
        return PullPlan(1, self.expires, idle_heartbeat=self.expires / 2)

    async def run(self) -> None:
        """Pull and hand messages over until halted; returns when the consumer is gone."""
        while not self.halt.is_set():
            self.waiting = True
            try:
                got = await self.loop.next()  # never None: `_plan` always plans a pull
            except PullError as error:
                if not error.consumer_gone:
                    raise
                log.info("%s: its consumer was deleted (%s)", self.name, error.description)
                return
            finally:
                self.waiting = False
            if isinstance(got, Pull):
                await self._ended(got)
            elif got is not None:
                await self._report_role(None)
                await self._hand_over(as_messages(self.puller.nc, got))

    async def _hand_over(self, messages: list[Msg]) -> None:
        for index, msg in enumerate(messages):
            if self.halt.is_set():
                await self._give_back(messages[index:])
                return
            await self._deliver(msg)

    async def _give_back(self, messages: Sequence[Msg]) -> None:
        """Hand back messages taken but not handled, and what the pull still out delivers, so
        they are redelivered without the ack wait (best effort: else after it)."""
        rest = Deliveries()
        for pull in self.loop.pulls:  # a no-wait pull, or one that got its one message: brief
            with contextlib.suppress(Exception):
                async for chunk in pull:
                    rest.extend(chunk)
        for msg in [*messages, *as_messages(self.puller.nc, rest)]:
            with contextlib.suppress(Exception):
                await msg.nak()

    async def _ended(self, pull: Pull) -> None:
        await self._report_role(pull.status)
        if pull.status in _RETRY_STATUSES:
            log.debug("%s: pull ended with %s; retrying", self.name, pull.status.value)
            self.drain = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.halt.wait(), RETRY_PAUSE)
            return
        self.drain = (
            bool(pull.received)
            and pull.status is PullStatus.BATCH_COMPLETE
            and self.puller.pin_id is not None
        )

    async def _report_role(self, status: PullStatus | None) -> None:
        """Log when this instance becomes active, or stands by while another one is pinned
        (`status`: how the last pull ended; None while it delivers)."""
        puller = self.puller
        if puller.pin_id is not None:
            if self.standing_by is not False:
                self.standing_by = False
                log.info("%s: this instance is active (pin %s)", self.name, puller.pin_id)
            return
        if self.standing_by or status not in (PullStatus.TIMEOUT, PullStatus.PIN_MISMATCH):
            return
        # An unpinned pull also times out on an idle consumer: ask whether someone holds the pin.
        with contextlib.suppress(NatsSparkError):
            info = await self.client.api.consumer_info(puller.stream, puller.consumer)
            if info.pinned_id(PRIORITY_GROUP):
                self.standing_by = True
                log.info("%s: another instance holds the pin; standing by", self.name)

    async def _deliver(self, msg: Msg) -> None:
        partition, subject = strip_partition(msg.subject)
        try:
            await self.handler(GroupMessage(subject, partition, msg))
        except Exception:
            log.exception(
                "%s: handler failed on %s (partition %d); the message is redelivered after the "
                "ack wait",
                self.name,
                subject,
                partition,
            )
