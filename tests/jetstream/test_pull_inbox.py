"""`PullInbox.requested_since` across a lost connection, on a connection stand-in: the
connector's own parser fed protocol bytes, the server's INFO and nats-py's counters set by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from nats_spark import clock
from nats_spark.jetstream.pull_inbox import PullInbox
from nats_spark.nats_py import MessageColumns, RoutingParser

pytestmark = pytest.mark.unit

STANDALONE = {"server_id": "NA", "jetstream": True}
RESTARTED = {"server_id": "NB", "jetstream": True}
CLUSTERED = {"server_id": "NA", "jetstream": True, "cluster": "c"}


class Connection:
    """What a `PullInbox` uses of a nats-py connection."""

    def __init__(self, info: dict[str, Any]) -> None:
        self._ps = RoutingParser(self)  # type: ignore[arg-type]
        self._server_info = info
        self._pending_data_size = 0
        self.stats = {"reconnects": 0}
        self.is_connected = True

    def new_inbox(self) -> str:
        return "_INBOX.t"

    async def subscribe(self, subject: str) -> SimpleNamespace:
        return SimpleNamespace(_id=1)

    def lose(self, unsent: int = 0) -> None:
        """The connection is lost (nats-py resets the parser), `unsent` bytes still buffered."""
        self._pending_data_size = unsent
        self.is_connected = False
        self._ps.reset()

    def reconnect(self, info: dict[str, Any]) -> None:
        self._server_info = info
        self._ps.reset()  # the handshake's
        self.stats["reconnects"] += 1
        self._pending_data_size = 0
        self.is_connected = True

    def deliver(self, seq: int) -> None:
        ack = f"$JS.ACK.S.C.1.{seq}.{seq}.0.0".encode()
        asyncio.run(self._ps.parse(b"MSG S.k 1 " + ack + b" 1\r\nx\r\n"))


@pytest.fixture
def now() -> Iterator[list[float]]:
    at = [100.0]
    previous = clock.use(lambda: at[0])
    yield at
    clock.use(previous)


def request(inbox: PullInbox) -> None:
    asyncio.run(inbox.new_reply(due=float("inf")))


def take_all(inbox: PullInbox) -> None:
    inbox.take_run(100, MessageColumns())


@pytest.mark.parametrize(
    ("lost", "reconnected_to", "unsent", "left"),
    [
        (STANDALONE, RESTARTED, 0, 120.0),  # the server restarted: the request is forgotten
        (STANDALONE, STANDALONE, 0, 100.0),  # the same server process: it may serve it still
        (STANDALONE, RESTARTED, 40, 100.0),  # maybe unwritten: written to the new server
        (CLUSTERED, {**RESTARTED, "cluster": "c"}, 0, 100.0),  # another node: the leader may
    ],
)
def test_a_request_a_restart_forgot_leaves_what_dates_late_deliveries(
    now: list[float], lost: dict[str, Any], reconnected_to: dict[str, Any], unsent: int, left: float
) -> None:
    """Seed 1656 of helper-69's world of dying drivers (KNOWN_OPEN, now closed): a pull was out
    when a standalone server restarted, which forgot it and never ended it; 20 s on, a pull
    after the reconnect got a delivery the give-back dated from the forgotten one's making,
    past half the ack wait, and did not NAK. Only a server of another id proves the request
    forgotten, and only when it was written to the lost connection."""
    connection = Connection(lost)
    inbox = PullInbox(connection)  # type: ignore[arg-type]
    request(inbox)  # made at 100, never ended
    connection.lose(unsent)
    connection.reconnect(reconnected_to)
    now[0] = 120.0
    request(inbox)
    connection.deliver(2)
    assert inbox.requested_since() == left


def test_what_came_before_the_loss_is_dated_from_the_forgotten_request(
    now: list[float],
) -> None:
    """A delivery that came on the lost connection may be the forgotten request's: until it
    has been taken, that request still counts."""
    connection = Connection(STANDALONE)
    inbox = PullInbox(connection)  # type: ignore[arg-type]
    request(inbox)
    connection.deliver(1)
    connection.lose()
    connection.reconnect(RESTARTED)
    now[0] = 120.0
    request(inbox)
    assert inbox.requested_since() == 100.0
    take_all(inbox)
    assert inbox.requested_since() == 120.0


def test_a_domain_s_requests_are_not_the_connected_server_s(now: list[float]) -> None:
    """Requests to another JetStream domain (another API prefix) wait on other servers."""
    connection = Connection(STANDALONE)
    inbox = PullInbox(connection, served_by_connected=False)  # type: ignore[arg-type]
    request(inbox)
    connection.lose()
    connection.reconnect(RESTARTED)
    now[0] = 120.0
    request(inbox)
    assert inbox.requested_since() == 100.0
