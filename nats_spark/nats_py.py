"""Every nats-py internal the connector uses, behind small functions: the one place that knows
them (tests/test_nats_py_internals.py fails first, naming this module, when a release moves one).

Raw routes: nats-py's parser matches a regular expression per protocol line, cuts every
message out of its buffer (moving what follows), and passes it to `Client._process_msg`, which
parses the headers, builds a `Msg`, queues it and wakes a waiter: most of the cost per message
of a pull inbox or a PubAck inbox. `install` gives a connection, before it connects, a parser of
its own that walks each read once and hands the messages of routed subscriptions straight to
their handler; every other message and protocol line is served by nats-py as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.errors import ProtocolError
from nats.protocol.parser import MAX_CONTROL_LINE_SIZE, Parser

from nats_spark.errors import NatsSparkError

RawHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]


async def queue_command(nc: NATS, command: bytes) -> None:
    """Queue protocol bytes (PUBs built in bulk) on the connection's write buffer; nats-py has no
    batch publish, and `publish` costs microseconds per call."""
    await nc._send_command(command)


async def write_queued(nc: NATS, force: bool = False) -> None:
    """Ask the connection's flusher to write what is queued (`force`: now, before a PING)."""
    await nc._flush_pending(force_flush=force)


def read_loop_alive(nc: NATS) -> bool:
    """Whether the connection still reads from its socket. nats-py 2.16 ends the read loop for
    good when a PONG answers a flush that gave up (`InvalidStateError` in `_process_pong`) yet
    goes on reporting connected, and every request then times out."""
    reading = nc._reading_task
    stuck = nc.is_connected and reading is not None and reading.done()
    return not nc.is_closed and not stuck  # while reconnecting, the next read loop is on its way


def server_info(nc: NATS) -> dict[str, Any]:
    """The last INFO the server sent (empty before the first)."""
    return nc._server_info or {}


def server_scheme(nc: NATS) -> str:
    """The URL scheme of the server the connection uses now ('' before it has one)."""
    server = nc._current_server
    return server.uri.scheme if server is not None else ""


def drop_transport(nc: NATS) -> None:
    """Close the socket of a connection that never opened (`close()` may leave a half-upgraded
    TLS socket behind)."""
    if nc._transport is not None:
        nc._transport.close()


class RoutingParser(Parser):
    """nats-py's protocol parser, replaced (see the module doc). It keeps the base class's
    buffer and `reset`, and leaves nothing but unparsed bytes between reads."""

    def __init__(self, nc: NATS) -> None:
        super().__init__(nc)
        self.routes: dict[int, RawHandler] = {}  # subscription id -> handler
        self.wanted = 0  # bytes the buffer must hold before a message in it is complete

    def reset(self) -> None:
        super().reset()
        self.wanted = 0

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        buf.extend(data)
        if len(buf) < self.wanted:
            return  # the rest of a large message is still on its way
        self.wanted = 0
        view = bytes(buf)
        pos, end = 0, len(view)
        try:
            while pos < end:
                eol = view.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > MAX_CONTROL_LINE_SIZE:
                        raise ProtocolError("nats: maximum control line exceeded")
                    return
                line = view[pos:eol]
                args = line.split()
                op = args[0].upper() if args else b""
                if op == b"MSG" or op == b"HMSG":
                    headed = op == b"HMSG"
                    # MSG <subject> <sid> [reply] <size>; HMSG ... [reply] <hdr size> <size>
                    if len(args) != 5 + headed and len(args) != 4 + headed:
                        raise ProtocolError("nats: malformed MSG")
                    size = int(args[-1])
                    header_size = int(args[-2]) if headed else 0
                    reply = args[3] if len(args) == 5 + headed else b""
                    start = eol + 2
                    stop = start + size
                    if stop + 2 > end:
                        self.wanted = stop + 2 - pos
                        return
                    sid = int(args[2])
                    headers = view[start : start + header_size] if header_size else None
                    payload = view[start + header_size : stop]
                    pos = stop + 2
                    handler = self.routes.get(sid)
                    if handler is None:
                        await self.nc._process_msg(sid, args[1], reply, payload, headers)
                    else:
                        handler(args[1], reply, payload, headers)
                    continue
                pos = eol + 2
                await self._control(op, line.lstrip()[len(op) :].strip())
        finally:
            del buf[:pos]

    async def _control(self, op: bytes, argument: bytes) -> None:
        if op == b"PING":
            await self.nc._process_ping()
        elif op == b"PONG":
            await self.nc._process_pong()
        elif op == b"+OK":
            pass
        elif op == b"-ERR":
            await self.nc._process_err(argument.decode(errors="replace").lower())
        elif op == b"INFO":
            await self.nc._process_info(json.loads(argument))
        else:
            raise ProtocolError("nats: unknown protocol")


def install(nc: NATS) -> None:
    """Give `nc` the routing parser; before it connects (no read can be half parsed then)."""
    if not isinstance(getattr(nc, "_ps", None), Parser):
        raise NatsSparkError(
            "this nats-py keeps no protocol Parser in Client._ps, which raw routes replace; "
            "install nats-py 2.16"
        )
    nc._ps = RoutingParser(nc)


def _routes(nc: NATS) -> dict[int, RawHandler]:
    parser = getattr(nc, "_ps", None)
    if not isinstance(parser, RoutingParser):
        raise NatsSparkError(
            "this connection was not opened by nats_spark.connection.connect, which routes "
            "messages raw; open it there"
        )
    return parser.routes


def route_raw(nc: NATS, subscription: Subscription, handler: RawHandler) -> None:
    """Hand `subscription`'s messages to `handler(subject, reply, data, headers)`."""
    _routes(nc)[subscription._id] = handler


def unroute_raw(nc: NATS, subscription: Subscription) -> None:
    _routes(nc).pop(subscription._id, None)
