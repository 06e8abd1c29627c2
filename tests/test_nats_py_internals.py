"""The nats-py internals the connector relies on, and the nats-py defect it works around.

When a nats-py release changes one of these, this module fails first and names what moved (the
connector's users are in `jetstream/acks.py`, `jetstream/pull.py`, `connection.py`, `client.py`).
"""

from __future__ import annotations

import asyncio
import inspect

import pytest
from nats.aio.client import Client as NATS

from nats_spark.client import NatsClient
from nats_spark.jetstream.acks import publish_acks
from nats_spark.loop import run_sync

USED = {
    "_send_command": "jetstream/acks.py queues blocks of PUB commands",
    "_flush_pending": "jetstream/acks.py writes the queue out before the flush PING",
    "_process_msg": "jetstream/pull.py routes pull inbox messages raw",
    "_process_pong": "client.py: a PONG for a cancelled flush ends the read loop",
}


@pytest.mark.parametrize("name", sorted(USED))
def test_nats_py_still_has_the_internals_the_connector_uses(name: str) -> None:
    assert inspect.iscoroutinefunction(getattr(NATS, name, None)), (
        f"nats-py no longer has Client.{name} ({USED[name]}); adapt the connector to this release"
    )


def test_nats_py_client_state_the_connector_reads(client) -> None:
    nc = client.target.nc
    for attribute in ("_reading_task", "_transport", "_server_info", "_pongs"):
        assert hasattr(nc, attribute), f"nats-py Client has no {attribute} any more"


def test_cancelled_ack_flush_leaves_the_connection_usable(settings) -> None:
    """A task cancelled while its acks' flush waits for the PONG (the in-progress-ack keeper at
    the end of a pull loop did so): the connection must go on answering."""

    async def scenario() -> list[bool]:
        nc_client = await NatsClient.open(settings)
        usable = []
        try:
            for _ in range(20):
                task = asyncio.ensure_future(publish_acks(nc_client.nc, ["nowhere.1"] * 50))
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
