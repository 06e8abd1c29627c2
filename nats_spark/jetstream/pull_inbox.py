"""Where a pull consumer's requests deliver: one inbox subscription, its messages as the
connection's parser gathered them, and the requests the server may still serve there.

A server restart forgets the requests waiting on a consumer and never ends them (nats-server
keeps its waiting queue in memory only: no 408 or 409 comes). The client cannot tell a forgotten
request from one a busy server will serve late, except where the server that had the request is
gone: a standalone server (its INFO names no cluster) serving JetStream itself, whose connection
was lost with every request written to it, and reconnected to a server of another id (nats-server
draws a new one at every start). Such a request leaves those whose end has not come once what
came on the lost connection has been taken from the inbox."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from nats_spark import clock, nats_py
from nats_spark.jetstream.status import Status, status_of
from nats_spark.nats_py import MessageColumns, RawInbox, route_raw, unroute_raw


@dataclass(frozen=True)
class Loss:
    """A connection to a standalone JetStream server lost with every command written to it."""

    server: str  # the lost server's id
    reconnects: int  # the connection's reconnects when it was lost
    received: int  # messages the inbox had received by then (on that connection or before)


def standalone_server(nc: NATS) -> str | None:
    """The id of the server `nc` last connected to when it is a standalone server serving
    JetStream (a restart of it forgets every pull request waiting on it), else None."""
    info = nats_py.server_info(nc)
    if not info.get("jetstream") or info.get("cluster"):
        return None
    return info.get("server_id")


class PullInbox:
    """The inbox of one consumer's pull requests (`<prefix>.<n>` per request).

    Delivered messages keep their own subject, so they cannot be matched to a request; what
    ends a request (a status on its reply subject) can. Requests are told apart by that alone.
    """

    def __init__(self, nc: NATS, served_by_connected: bool = True) -> None:
        self.nc = nc
        # whether the requests go to the JetStream of the server connected to (not a domain's)
        self.served_by_connected = served_by_connected
        self.prefix = nc.new_inbox()
        self._sub: Subscription | None = None
        self._request_no = 0
        self._received = RawInbox(self._wake, self._lost)  # what the parser hands the inbox
        self._taken = 0  # messages taken from the inbox, ever
        self._arrived: asyncio.Future[None] | None = None
        self._wanted = 1  # deliveries in the inbox that wake the waiter (or any status)
        self._checked = 0  # messages of the inbox already looked through for a status
        # Requests the server may still serve, by reply subject: until when to expect their end
        # (a request the client gave up on may end any time: infinity).
        self._live: dict[bytes, float] = {}
        # Requests whose end has not come, by reply subject: when each was made. What is in the
        # inbox, or comes, was delivered to one of them (a status comes after its deliveries).
        self._made: dict[bytes, float] = {}
        # The standalone JetStream server each request was written to, when known (module doc).
        self._sent_to: dict[bytes, str] = {}
        self._loss: Loss | None = None  # the last such connection lost, until reconnected
        # Requests a restart forgot, by reply subject: the messages received before it; they
        # leave `_made` once the inbox has been taken through those.
        self._forgotten: dict[bytes, int] = {}

    async def new_reply(self, due: float) -> str:
        """The reply subject of a request about to be sent, whose end is expected by `due`
        (monotonic seconds); subscribes on first use."""
        if self._sub is None:
            self._sub = await self.nc.subscribe(f"{self.prefix}.*")
            route_raw(self.nc, self._sub, self._received)
        self._request_no += 1
        reply = f"{self.prefix}.{self._request_no}"
        self._live[reply.encode()] = due
        self._made[reply.encode()] = clock.monotonic()
        self._reconnected()
        server = standalone_server(self.nc) if self.served_by_connected else None
        if server is not None and self.nc.is_connected:  # else written to the next server
            self._sent_to[reply.encode()] = server
        return reply

    def ended(self, reply: bytes) -> None:
        """The request `reply` ended: the server serves it no more."""
        self._live.pop(reply, None)
        self._made.pop(reply, None)
        self._sent_to.pop(reply, None)
        self._forgotten.pop(reply, None)

    def requested_since(self) -> float:
        """When the oldest request whose end has not come was made (now if none): the server
        sent what is in the inbox, and what comes, after that. A request a restart forgot
        counts until what came before the restart has been taken from the inbox."""
        self._reconnected()
        for reply, received in list(self._forgotten.items()):
            if self._taken >= received:  # (`collect_late` still waits for it, as before)
                del self._forgotten[reply], self._made[reply], self._sent_to[reply]
        return min(self._made.values(), default=clock.monotonic())

    def _lost(self) -> None:
        """Called by the connection's parser as the connection is lost, or as a reconnect's
        handshake starts (no connection was made since the last call then)."""
        reconnects = nats_py.reconnects(self.nc)
        if self._loss is not None and self._loss.reconnects == reconnects:
            return  # a handshake: the INFO is of a server not connected to yet
        self._settle(reconnects)
        server = standalone_server(self.nc) if self.served_by_connected else None
        if server is not None and not nats_py.unsent(self.nc):
            received = self._taken + len(self._received)
            self._loss = Loss(server, reconnects, received)

    def _reconnected(self) -> None:
        """Settle a lost connection once the connection is made again."""
        if self._loss is not None and self.nc.is_connected:
            self._settle(nats_py.reconnects(self.nc))

    def _settle(self, reconnects: int) -> None:
        """After the lost connection `_loss`, the connection was made again (`reconnects`
        counts it) to the server whose INFO `nc` has: when its id is another, the server the
        requests were written to is gone, and with it what it kept waiting."""
        loss = self._loss
        if loss is None or reconnects == loss.reconnects:
            return
        self._loss = None
        if nats_py.server_info(self.nc).get("server_id") == loss.server:
            return  # the same server process: it may serve them still
        for reply, server in self._sent_to.items():
            if server == loss.server:
                self._forgotten.setdefault(reply, loss.received)

    def given_up(self, reply: bytes) -> None:
        """The client stopped waiting for `reply`, which the server may serve still."""
        if reply in self._live:
            self._live[reply] = float("inf")

    def _wake(self) -> None:
        """Called by the connection's parser after a read that brought the inbox messages."""
        arrived, inbox = self._arrived, self._received
        if arrived is None or arrived.done():
            return
        # Statuses carry no reply subject; only they can end a request short of its batch.
        if len(inbox) < self._wanted and b"" not in inbox.replies[self._checked :]:
            self._checked = len(inbox)
            return
        arrived.set_result(None)

    def take_run(self, room: int, into: MessageColumns) -> tuple[bytes, Status] | None:
        """Move deliveries from the front of the inbox to `into`, at most `room`, up to the
        next status message: that one is removed and returned with the subject it came on
        (a status that ends a request ends it here); None once `room` is used up or the inbox
        is empty."""
        inbox = self._received
        while room and len(inbox):
            # Deliveries always carry their ack subject as reply, statuses never do: a stored
            # message with a `Status` header of its own is not mistaken for one.
            try:
                run = inbox.replies.index(b"", 0, room)
            except ValueError:
                run = min(room, len(inbox))
            if run:
                into.extend(inbox.take(run))
                self._taken += run
                room -= run
                continue
            first = inbox.take(1)
            self._taken += 1
            status = status_of(first.data[0], first.headers[0])
            if status is not None:
                if status.ends_request:
                    self.ended(first.subjects[0])
                return first.subjects[0], status
            into.extend(first)
            room -= 1
        return None

    async def arrival(self, timeout: float, wanted: int = 1) -> bool:
        """Wait until the inbox holds `wanted` messages or a status comes; False when that did
        not happen in `timeout`."""
        arrived = asyncio.get_running_loop().create_future()
        self._arrived, self._wanted, self._checked = arrived, wanted, len(self._received)
        try:
            await asyncio.wait_for(arrived, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._arrived = None

    async def collect_late(self, patience: float, into: MessageColumns) -> None:
        """Move what the requests still delivers to `into` until every request has ended (its
        status came, or it was due and did not come), for at most `patience` seconds."""
        give_up = time.monotonic() + patience
        while True:
            while len(self._received):
                self.take_run(len(self._received), into)
            now = time.monotonic()
            self._live = {r: due for r, due in self._live.items() if due > now}
            if not self._live or now >= give_up:
                return
            await self.arrival(max(min(give_up, *self._live.values()) - now, 0.01))

    async def close(self) -> None:
        if self._sub is not None:
            unroute_raw(self.nc, self._sub)
            await self._sub.unsubscribe()
            self._sub = None
