"""The nats-py internals the connector relies on, and the nats-py defect it works around.

When a nats-py release changes one of these, this module fails first and names what moved; all of
them are used in one adapter, `nats_spark/nats_py.py`.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest
from nats.aio.client import Client as NATS
from nats.protocol.parser import Parser

from nats_spark.client import NatsClient, close_shared_clients, shared_client
from nats_spark.jetstream.acks import publish_acks
from nats_spark.jetstream.retry import ConnectionLost
from nats_spark.loop import run_sync
from nats_spark.nats_py import RoutingParser

ADAPTER = "nats_spark/nats_py.py"
USED = {
    "_send_command": "queue_command queues blocks of PUB commands",
    "_flush_pending": "write_queued writes the queue out before the flush PING",
    "_process_msg": "RoutingParser hands it the messages of unrouted subscriptions",
    "_process_ping": "RoutingParser answers PINGs through it",
    "_process_pong": "RoutingParser passes PONGs to it (and a cancelled flush's PONG kills it)",
    "_process_err": "RoutingParser passes -ERR lines to it",
    "_process_info": "RoutingParser passes INFO updates to it",
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(USED))
def test_nats_py_still_has_the_internals_the_connector_uses(name: str) -> None:
    assert inspect.iscoroutinefunction(getattr(NATS, name, None)), (
        f"nats-py no longer has Client.{name} ({USED[name]}); adapt {ADAPTER} to this release"
    )


def test_nats_py_client_state_the_connector_reads(client) -> None:
    nc = client.target.nc
    for attribute in (
        "_reading_task",
        "_transport",
        "_server_info",
        "_current_server",
        "_pending_data_size",
    ):
        assert hasattr(nc, attribute), f"nats-py Client has no {attribute}; adapt {ADAPTER}"
    assert isinstance(nc._ps, RoutingParser), f"the connection's parser is not {ADAPTER}'s"
    fields = {"buf", "reset", "parse"}
    assert all(hasattr(Parser(), f) for f in fields), f"nats-py's Parser changed; adapt {ADAPTER}"


def test_cancelled_ack_flush_leaves_the_connection_usable(settings) -> None:
    """A task cancelled while its acks' flush waits for the PONG (the in-progress-ack keeper at
    the end of a pull loop did so): the connection must go on answering."""

    async def scenario() -> list[bool]:
        nc_client = await NatsClient.open(settings)
        usable = []
        try:
            for _ in range(20):
                task = asyncio.ensure_future(publish_acks(nc_client.nc, [b"nowhere.1"] * 50))
                for _ in range(3):
                    await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.01)  # the PONG arrives
                usable.append(nc_client.usable)
            await nc_client.api.account_info()  # and requests are still answered
        finally:
            await nc_client.close()
        return usable

    assert all(run_sync(scenario(), timeout=60))


def test_a_connection_that_stopped_reading_fails_fast_and_is_replaced(settings) -> None:
    """The watchdog: requests on a connection whose read loop ended fail within one request
    timeout (not `retryTimeout`), and the shared client is replaced."""
    client = shared_client(settings)
    try:

        async def kill_read_loop() -> None:
            client.nc._reading_task.cancel()
            await asyncio.sleep(0.1)

        run_sync(kill_read_loop())
        assert not client.usable
        started = time.monotonic()
        with pytest.raises(ConnectionLost, match="stopped reading from the server"):
            run_sync(client.api.account_info(), timeout=30)
        assert time.monotonic() - started < 10
        fresh = shared_client(settings)
        assert fresh is not client and fresh.usable
        run_sync(fresh.api.account_info())
    finally:
        close_shared_clients()
