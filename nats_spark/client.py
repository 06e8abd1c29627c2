"""An open NATS connection with the JetStream helpers the connector uses, async and blocking."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import ServiceUnavailableError
from nats.js.kv import KeyValue

from nats_spark.connect import connect
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConnectionFailed, NatsSparkError
from nats_spark.jetstream.acks import flush_published
from nats_spark.jetstream.api import JetStreamApi
from nats_spark.jetstream.kv_requests import RoutedRequests, kv_write_prefix
from nats_spark.jetstream.pull import PullConsumer
from nats_spark.loop import Blocking, run_sync
from nats_spark.nats_py import read_loop_alive
from nats_spark.refusals import Refusals
from nats_spark.server import check_server_version

log = logging.getLogger(__name__)


class PrefixedJetStream(JetStreamContext):
    """nats-py's JetStream context, whose key-value writes also reach a bucket behind a domain
    or an imported API. nats-py's KV publishes puts, deletes and purges to `$KV.<bucket>.<key>`,
    which only the bucket's own domain and account store; like nats.go's KV, this sends them to
    `<API prefix>.$KV.<bucket>.<key>` whenever the API has a prefix other than `$JS.API`."""

    def __init__(self, nc: NATS, prefix: str, unreachable: Callable[[str], str]) -> None:
        super().__init__(nc, prefix=prefix)
        self._kv_write_prefix = kv_write_prefix(prefix)
        self._unreachable = unreachable

    async def key_value(self, bucket: str) -> KeyValue:
        try:
            return await super().key_value(bucket)
        except ServiceUnavailableError as error:
            if error.code is not None:  # a 503 answer: JetStream is there, without a leader
                raise
            # How nats-py reports no responders: nobody serves this API prefix.
            subject = f"{self._prefix}.STREAM.INFO.KV_{bucket}"
            raise NatsSparkError(self._unreachable(subject)) from None

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float | None = None,
        stream: str | None = None,
        headers: dict[str, Any] | None = None,
        msg_ttl: float | None = None,
    ) -> PubAck:
        if self._kv_write_prefix and subject.startswith("$KV."):
            subject = self._kv_write_prefix + subject
        return await super().publish(subject, payload, timeout, stream, headers, msg_ttl)


async def check_inbox(nc: NATS, settings: ConnectionSettings, denied: list[str]) -> None:
    """Subscribe once below the connection's inbox prefix: a user who may not receive replies
    there learns it now, naming the option, instead of from requests that time out (the server
    reports a refused subscription only asynchronously, as an error the connection collects)."""
    inbox = nc.new_inbox()
    subscription = await nc.subscribe(f"{inbox}.*")
    await flush_published(nc, settings.connect_timeout)  # the SUB ahead of the PING
    await subscription.unsubscribe()
    if not any(f'subscription to "{inbox.lower()}.*"' in refusal for refusal in denied):
        return
    prefix = inbox.rsplit(".", 1)[0]
    fix = (
        "fix the option inboxPrefix (--inbox-prefix)"
        if settings.inbox_prefix
        else "set the option inboxPrefix (--inbox-prefix) to one it may use, e.g. _INBOX_etl"
    )
    raise ConnectionFailed(
        f"the user may not subscribe to reply inboxes below {prefix} at {settings.described()}, "
        f"so no request would get an answer; {fix} (it needs subscribe permission on "
        "<inboxPrefix>.>)"
    )


class NatsClient:
    """Connection, raw JetStream API, nats-py JetStream context (for KV) and pull consumers,
    all on the JetStream API of the settings' domain or prefix."""

    def __init__(
        self, nc: NATS, settings: ConnectionSettings, denied: Refusals | None = None
    ) -> None:
        self.nc = nc
        self.settings = settings
        self.denied = denied if denied is not None else Refusals()  # publishes refused
        self.api = JetStreamApi(
            nc,
            prefix=settings.jetstream_prefix,
            retry_timeout=settings.retry_timeout,
            denied=self.denied,
            unreachable=settings.unreachable,
        )
        self.js: JetStreamContext = PrefixedJetStream(
            nc, settings.jetstream_prefix, settings.unreachable
        )

    @classmethod
    async def open(cls, settings: ConnectionSettings) -> NatsClient:
        """Connect and check that the server supports priority groups (2.11+)."""
        denied = Refusals()
        nc = await connect(settings, denied)
        version = nc.connected_server_version
        try:
            check_server_version(
                (version.major, version.minor, version.patch), f"NATS server {settings.described()}"
            )
            await check_inbox(nc, settings, denied)
        except Exception:
            await nc.close()
            raise
        return cls(nc, settings, denied)

    @functools.cached_property
    def routed_requests(self) -> RoutedRequests:
        """Requests whose replies come raw to one subscription (the ack ledger's KV calls)."""
        return RoutedRequests(self.nc, self.denied)

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
        return PullConsumer(
            self.nc, stream, consumer, group=group, pin_id=pin_id, api_prefix=self.api.prefix
        )

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
