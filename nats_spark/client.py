"""An open NATS connection with the JetStream helpers the connector uses, async and blocking."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from nats_spark.connection import ConnectionSettings, connect
from nats_spark.jetstream.api import JetStreamApi
from nats_spark.jetstream.pull import PullConsumer
from nats_spark.loop import Blocking, run_sync
from nats_spark.nats_py import read_loop_alive
from nats_spark.server import check_server_version

log = logging.getLogger(__name__)


class NatsClient:
    """Connection, raw JetStream API, nats-py JetStream context (for KV) and pull consumers."""

    def __init__(
        self, nc: NATS, settings: ConnectionSettings, denied: list[str] | None = None
    ) -> None:
        self.nc = nc
        self.settings = settings
        self.denied = denied if denied is not None else []  # publishes the server refused
        self.api = JetStreamApi(nc, retry_timeout=settings.retry_timeout, denied=self.denied)
        self.js: JetStreamContext = nc.jetstream()

    @classmethod
    async def open(cls, settings: ConnectionSettings) -> NatsClient:
        """Connect and check that the server supports priority groups (2.11+)."""
        denied: list[str] = []
        nc = await connect(settings, denied)
        version = nc.connected_server_version
        try:
            check_server_version(
                (version.major, version.minor, version.patch), f"NATS server {settings.described()}"
            )
        except Exception:
            await nc.close()
            raise
        return cls(nc, settings, denied)

    @property
    def usable(self) -> bool:
        """Open, with its read loop alive (else it must be replaced: see `read_loop_alive`)."""
        return read_loop_alive(self.nc)

    @property
    def server_version(self) -> tuple[int, int, int]:
        version = self.nc.connected_server_version
        return version.major, version.minor, version.patch

    def pull_consumer(
        self, stream: str, consumer: str, group: str | None = None, pin_id: str | None = None
    ) -> PullConsumer:
        return PullConsumer(self.nc, stream, consumer, group=group, pin_id=pin_id)

    async def discard(self) -> None:
        """Close a connection that stopped reading (see `read_loop_alive`): no drain, as
        nothing would answer it."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.close(), 5)

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.drain() if self.nc.is_connected else await self.nc.close()


_clients: dict[ConnectionSettings, NatsClient] = {}


def shared_client(settings: ConnectionSettings) -> NatsClient:
    """One connection per settings per Python worker process (workers are reused across tasks)."""
    client = _clients.get(settings)
    if client is None or not client.usable:
        if client is not None:
            log.warning("replacing a NATS connection whose read loop ended")
            run_sync(client.discard())
        client = run_sync(NatsClient.open(settings))
        _clients[settings] = client
    return client


def close_shared_clients() -> None:
    """Close this process's shared connections. Spark workers never need to (they end with the
    process); in-process callers such as the benchmark do, before stopping the server."""
    while _clients:
        _, client = _clients.popitem()
        run_sync(client.close())


def open_blocking(settings: ConnectionSettings) -> Blocking[NatsClient]:
    """A `NatsClient` for synchronous callers; its coroutine methods block on the process loop."""
    return Blocking(run_sync(NatsClient.open(settings)))
