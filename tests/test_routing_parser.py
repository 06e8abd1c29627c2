"""The routing protocol parser (nats_py.RoutingParser), pure: every split of a read gives the
same messages and protocol calls as the whole."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from nats.errors import ProtocolError
from spark_helpers import parse_reply

from nats_spark.jetstream.subjects import ack_numbers
from nats_spark.nats_py import MessageColumns, RawInbox, RoutingParser

pytestmark = pytest.mark.unit

HEADERS = b"NATS/1.0\r\nn: 1\r\n\r\n"
STATUS = b"NATS/1.0 408\r\n\r\n"
PROTOCOL_LIKE = b"\r\nMSG a 7 r 1\r\nx\r\n\nHMSG b 7 r 1 1\r\n"
WIRE = (
    b'INFO {"server_id": "a b", "max_payload": 1048576}\r\n'
    b"MSG orders.k1 7 $JS.ACK.S.C.1.10.10.1700000000000000000.4 5\r\nhello\r\n"
    b"PING\r\n"
    b"HMSG orders.k2 9 _INBOX.x %d %d\r\n%bhi!!!\r\n"
    % (len(HEADERS), len(HEADERS) + 5, HEADERS)
    + b"MSG plain 3 0\r\n\r\n"
    b"+OK\r\n"
    b"HMSG _INBOX.y 7 %d %d\r\n%b\r\n"
    % (len(STATUS), len(STATUS), STATUS)
    + b"MSG big 7 inbox.z 12\r\nline\r\nbreak!\r\n"
    b"PONG\r\n"
    b"-ERR 'Permissions Violation for Subscription to \"x\"'\r\n"
    # What the parser's shortcuts for the usual lines must not get wrong: lower-case ops, a bare
    # LF in a control line, a reply with headers only, a payload that looks like protocol.
    b"hmsg lower 7 r.1 %d %d\r\n%bok\r\n"
    % (len(HEADERS), len(HEADERS) + 2, HEADERS)
    + b"msg lower 7 r.2 2\r\nok\r\n"
    b"ping\r\n"
    b"MSG bare\n7 r.3 1\r\n!\r\n"
    b"HMSG status 7 r.4 %d %d\r\n%b\r\n"
    % (len(STATUS), len(STATUS), STATUS)
    + b"MSG tricky 7 r.5 %d\r\n%b\r\n" % (len(PROTOCOL_LIKE), PROTOCOL_LIKE)
)
EXPECTED = [
    ("info", {"server_id": "a b", "max_payload": 1048576}),
    ("raw", b"orders.k1", b"$JS.ACK.S.C.1.10.10.1700000000000000000.4", b"hello", None),
    ("ping",),
    ("msg", 9, b"orders.k2", b"_INBOX.x", b"hi!!!", HEADERS),
    ("msg", 3, b"plain", b"", b"", None),
    ("raw", b"_INBOX.y", b"", b"", STATUS),
    ("raw", b"big", b"inbox.z", b"line\r\nbreak!", None),
    ("pong",),
    ("err", "'permissions violation for subscription to \"x\"'"),
    ("raw", b"lower", b"r.1", b"ok", HEADERS),
    ("raw", b"lower", b"r.2", b"ok", None),
    ("ping",),
    ("raw", b"bare", b"r.3", b"!", None),
    ("raw", b"status", b"r.4", b"", STATUS),
    ("raw", b"tricky", b"r.5", PROTOCOL_LIKE, None),
]


class FakeClient:
    """What the parser calls on nats-py's client, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def _process_msg(self, sid, subject, reply, data, headers) -> None:
        self.calls.append(("msg", sid, subject, reply, data, headers))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_err(self, text: str) -> None:
        self.calls.append(("err", text))

    async def _process_info(self, info: dict) -> None:
        self.calls.append(("info", info))


def parse(reads: list[bytes]) -> list[tuple[Any, ...]]:
    client = FakeClient()
    parser = RoutingParser(client)  # type: ignore[arg-type]
    parser.routes[7] = lambda *message: client.calls.append(("raw", *message))

    async def run() -> None:
        for data in reads:
            await parser.parse(data)

    asyncio.run(run())
    assert not parser.buf, "bytes left over"
    return client.calls


def test_whole_read() -> None:
    assert parse([WIRE]) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(WIRE)))
def test_every_split_in_two(cut: int) -> None:
    assert parse([WIRE[:cut], WIRE[cut:]]) == EXPECTED


def test_byte_by_byte_and_random_reads() -> None:
    assert parse([WIRE[i : i + 1] for i in range(len(WIRE))]) == EXPECTED
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(WIRE)), 6))
        reads = [WIRE[a:b] for a, b in zip([0, *cuts], [*cuts, len(WIRE)], strict=True)]
        assert parse(reads) == EXPECTED


def test_a_large_message_waits_for_all_its_bytes() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    wire = b"MSG big 7 r %d\r\n" % len(payload) + payload + b"\r\nPING\r\n"
    reads = [wire[i : i + 65536] for i in range(0, len(wire), 65536)]
    assert parse(reads) == [("raw", b"big", b"r", payload, None), ("ping",)]


@pytest.mark.parametrize(
    "wire", [b"MSG a\r\n", b"MSG a 1 2 3 4\r\n", b"HMSG a 1 2\r\n", b"BOGUS\r\n"]
)
def test_malformed_lines_are_protocol_errors(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse([wire])


def test_v2_ack_subjects_with_domain_and_account_hash_are_routed_and_parsed() -> None:
    """The v2 reply form (`$JS.ACK.<domain>.<account hash>.<stream>.<consumer>...` and a last
    random token), as servers in a JetStream domain may send it."""
    reply = b"$JS.ACK.hub.ACCHASH1.S.C.2.11.12.1700000000000000000.3.Rnd9"
    assert parse([b"MSG orders.k1 7 %b 2\r\nhi\r\n" % reply]) == [
        ("raw", b"orders.k1", reply, b"hi", None)
    ]
    assert tuple(ack_numbers([reply])) == ([2], [11], [12], [1700000000000000000])
    delivery = parse_reply(reply)
    assert (delivery.stream, delivery.consumer, delivery.pending) == ("S", "C", 3)


# What sid 7 gets when it is routed to an inbox rather than a handler.
INBOX = [call[1:] for call in EXPECTED if call[0] == "raw"]


def columns(messages: MessageColumns) -> list[tuple[bytes, bytes, bytes, bytes | None]]:
    return list(
        zip(messages.subjects, messages.replies, messages.data, messages.headers, strict=True)
    )


def parse_into_inbox(reads: list[bytes]) -> tuple[RawInbox, list[tuple[Any, ...]], list[int]]:
    """The inbox of sid 7, the other calls, and the inbox's length at each wake-up."""
    client = FakeClient()
    parser = RoutingParser(client)  # type: ignore[arg-type]
    woken: list[int] = []
    inbox = RawInbox(lambda: woken.append(len(inbox)))
    parser.routes[7] = inbox

    async def run() -> None:
        for data in reads:
            await parser.parse(data)

    asyncio.run(run())
    assert not parser.buf, "bytes left over"
    return inbox, client.calls, woken


@pytest.mark.parametrize("cut", range(0, len(WIRE), 7))
def test_an_inbox_gets_its_messages_as_columns_at_every_split(cut: int) -> None:
    inbox, calls, woken = parse_into_inbox([WIRE[:cut], WIRE[cut:]])
    assert columns(inbox) == INBOX
    assert calls == [call for call in EXPECTED if call[0] != "raw"]
    # Woken once after each read that brought it messages, never after one that did not.
    assert woken[-1] == len(INBOX) and woken == sorted(set(woken))


def test_an_inbox_hands_out_its_oldest_messages_first() -> None:
    inbox, _, _ = parse_into_inbox([WIRE[i : i + 1] for i in range(len(WIRE))])
    assert columns(inbox.take(2)) == INBOX[:2] and columns(inbox) == INBOX[2:]
    assert columns(inbox.take(len(INBOX))) == INBOX[2:] and not columns(inbox)
    assert len(inbox) == 0 and not columns(inbox.take(1))


def test_a_route_added_while_the_parser_awaits_takes_the_next_messages() -> None:
    """Routes change only between messages; one made while the parser awaits nats-py (here,
    as the first message is served) gets the rest of the read, even the same subscription's."""
    client = FakeClient()
    parser = RoutingParser(client)  # type: ignore[arg-type]
    inbox = RawInbox(lambda: None)
    served = client._process_msg

    async def process_msg(sid, subject, reply, data, headers) -> None:
        await served(sid, subject, reply, data, headers)
        parser.routes[7] = inbox

    client._process_msg = process_msg  # type: ignore[method-assign]
    asyncio.run(parser.parse(b"MSG a 7 1\r\n1\r\nMSG b 7 1\r\n2\r\nMSG c 7 1\r\n3\r\n"))
    assert client.calls == [("msg", 7, b"a", b"", b"1", None)]
    assert (inbox.subjects, inbox.data) == ([b"b", b"c"], [b"2", b"3"])


def test_a_read_that_starts_with_a_bare_lf_serves_its_lines_before_a_trailing_cr() -> None:
    client = FakeClient()
    asyncio.run(RoutingParser(client).parse(b"\nPING\r\nPONG\r"))  # type: ignore[arg-type]
    assert client.calls == [("ping",)]
