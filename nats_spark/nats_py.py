"""Every nats-py internal the connector uses, behind small functions: the one place that knows
them (tests/test_nats_py_internals.py fails first, naming this module, when a release moves one).

Raw routes: nats-py's parser matches a regular expression per protocol line, cuts every
message out of its buffer (moving what follows), and passes it to `Client._process_msg`, which
parses the headers, builds a `Msg`, queues it and wakes a waiter: most of the cost per message
of a pull inbox or a PubAck inbox. `install` gives a connection, before it connects, a parser of
its own that walks each read once and hands the messages of routed subscriptions straight to
their handler, or appends them to a `RawInbox`'s columns (no call and no object per message);
every other message and protocol line is served by nats-py as before.
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


class MessageColumns:
    """Messages as four columns in arrival order: no object per message."""

    def __init__(self) -> None:
        self.subjects: list[bytes] = []
        self.replies: list[bytes] = []  # b"" where a message has no reply subject
        self.data: list[bytes] = []
        self.headers: list[bytes | None] = []  # raw blocks, `NATS/1.0[ <status>]\r\n...\r\n\r\n`

    def __len__(self) -> int:
        return len(self.replies)

    def extend(self, other: MessageColumns) -> None:
        self.subjects += other.subjects
        self.replies += other.replies
        self.data += other.data
        self.headers += other.headers

    def take(self, n: int) -> MessageColumns:
        """The first `n` messages, moved to columns of their own."""
        taken = MessageColumns()
        if n >= len(self):
            taken.subjects, taken.replies, self.subjects, self.replies = (
                self.subjects,
                self.replies,
                [],
                [],
            )
            taken.data, taken.headers, self.data, self.headers = self.data, self.headers, [], []
            return taken
        taken.subjects, taken.replies = self.subjects[:n], self.replies[:n]
        taken.data, taken.headers = self.data[:n], self.headers[:n]
        del self.subjects[:n], self.replies[:n], self.data[:n], self.headers[:n]
        return taken


class RawInbox(MessageColumns):
    """A routed subscription's messages as the parser appends them; `arrived` is called once per
    read that added any, `lost` when the connection is lost (what came until then came on it)."""

    def __init__(
        self, arrived: Callable[[], None], lost: Callable[[], None] = lambda: None
    ) -> None:
        super().__init__()
        self.arrived = arrived
        self.lost = lost


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


def reconnects(nc: NATS) -> int:
    """How many times the connection was made again after it was lost."""
    return int(nc.stats["reconnects"])


def unsent(nc: NATS) -> bool:
    """Whether commands wait in the connection's buffer, unwritten: after a lost connection,
    nats-py writes them to the next server it connects to."""
    return nc._pending_data_size > 0


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
        self.routes: dict[int, RawHandler | RawInbox] = {}  # subscription id -> route
        self.wanted = 0  # bytes the buffer must hold before a message in it is complete

    def reset(self) -> None:
        """Called by nats-py as the connection is lost (and once at the start): the inboxes
        routed here hear of it before anything of the next connection comes."""
        super().reset()
        self.wanted = 0
        for route in getattr(self, "routes", {}).values():  # none yet at the start
            if isinstance(route, RawInbox):
                route.lost()

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        buf.extend(data)
        if len(buf) < self.wanted:
            return  # the rest of a large message is still on its way
        self.wanted = 0
        view = bytes(buf)
        pos, end, find = 0, len(view), view.find
        routes, filled = self.routes, set[RawInbox]()
        # Where the last message's subscription goes: a pull's messages come in a row.
        sid_seen, columns, handler = b"", None, None
        try:
            while pos < end:
                # A line ends at its first CRLF; finding one byte is quicker than two.
                eol = find(b"\n", pos) - 1
                if eol < pos or view[eol] != 13:
                    eol = find(b"\r\n", pos)
                if eol < 0:
                    _check_line_length(end - pos)
                    return
                line = view[pos:eol]
                args = line.split()
                # A JetStream delivery's line as the server writes it (upper-case op, a reply) is
                # unpacked at once; any other line is checked word by word.
                words = len(args)
                if words == 6 and args[0] == b"HMSG":
                    _, subject, sid, reply, header_size, size = args
                elif words == 5 and args[0] == b"MSG":
                    _, subject, sid, reply, size = args
                    header_size = b""
                elif (fields := _message_fields(args)) is not None:
                    subject, sid, reply, header_size, size = fields
                else:
                    pos = eol + 2
                    await self._control(line)
                    sid_seen = b""
                    continue
                start = eol + 2
                stop = start + int(size)
                if stop + 2 > end:
                    self.wanted = stop + 2 - pos
                    return
                payload_start = start + int(header_size) if header_size else start
                headers = view[start:payload_start] or None
                pos = stop + 2
                if sid != sid_seen:
                    sid_seen = sid
                    columns, handler = _route(routes.get(int(sid)), filled)
                if columns is not None:
                    add_subject, add_reply, add_data, add_headers = columns
                    add_subject(subject)
                    add_reply(reply)
                    add_data(view[payload_start:stop])
                    add_headers(headers)
                elif handler is not None:
                    handler(subject, reply, view[payload_start:stop], headers)
                else:
                    payload = view[payload_start:stop]
                    await self.nc._process_msg(int(sid), subject, reply, payload, headers)
                    sid_seen = b""  # routes may change while awaiting
        finally:
            del buf[:pos]
            for filled_inbox in filled:
                filled_inbox.arrived()

    async def _control(self, line: bytes) -> None:
        words = line.split(None, 1)
        op = words[0].upper() if words else b""
        argument = line.lstrip()[len(op) :].strip()
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


def _check_line_length(unparsed: int) -> None:
    """A line without its end yet may be no longer than nats-py allows."""
    if unparsed > MAX_CONTROL_LINE_SIZE:
        raise ProtocolError("nats: maximum control line exceeded")


_Add = Callable[[bytes], None]
# An inbox's appends: of subjects, replies, data and headers.
Columns = tuple[_Add, _Add, _Add, Callable[[bytes | None], None]]


def _route(
    route: RawHandler | RawInbox | None, filled: set[RawInbox]
) -> tuple[Columns | None, RawHandler | None]:
    """Where a subscription's messages go: an inbox's columns (the appends of subject, reply,
    data and headers; the inbox noted in `filled`), or a handler, or (both None) nats-py."""
    if isinstance(route, RawInbox):
        filled.add(route)
        return (
            route.subjects.append,
            route.replies.append,
            route.data.append,
            route.headers.append,
        ), None
    return None, route


def _message_fields(args: list[bytes]) -> tuple[bytes, bytes, bytes, bytes, bytes] | None:
    """The subject, sid, reply (b"" if none), header size (b"" in a MSG) and size in a message's
    control line split in words: `MSG <subject> <sid> [reply] <size>`, `HMSG <subject> <sid>
    [reply] <header size> <size>`; None for a line of another operation."""
    op = args[0].upper() if args else b""
    if op != b"MSG" and op != b"HMSG":
        return None
    headed = op == b"HMSG"
    if len(args) != 5 + headed and len(args) != 4 + headed:
        raise ProtocolError("nats: malformed MSG")
    reply = args[3] if len(args) == 5 + headed else b""
    return args[1], args[2], reply, args[-2] if headed else b"", args[-1]


def install(nc: NATS) -> None:
    """Give `nc` the routing parser; before it connects (no read can be half parsed then)."""
    if not isinstance(getattr(nc, "_ps", None), Parser):
        raise NatsSparkError(
            "this nats-py keeps no protocol Parser in Client._ps, which raw routes replace; "
            "install nats-py 2.16"
        )
    nc._ps = RoutingParser(nc)


def _routes(nc: NATS) -> dict[int, RawHandler | RawInbox]:
    parser = getattr(nc, "_ps", None)
    if not isinstance(parser, RoutingParser):
        raise NatsSparkError(
            "this connection was not opened by nats_spark.connect.connect, which routes "
            "messages raw; open it there"
        )
    return parser.routes


def route_raw(nc: NATS, subscription: Subscription, route: RawHandler | RawInbox) -> None:
    """Hand `subscription`'s messages to `route`: a handler, called as `(subject, reply, data,
    headers)`, or an inbox."""
    _routes(nc)[subscription._id] = route


def unroute_raw(nc: NATS, subscription: Subscription) -> None:
    _routes(nc).pop(subscription._id, None)
