"""What every format's read checks at load(), where Spark asks the source for its schema: the
servers answer and the stream exists. Only reads, so a mistake fails there as one line, before
a query starts or anything is taken or created. On a loop of its own (`asyncio.run`), closed
again: Spark reuses the worker process, and with the process's loop thread (`run_sync`) left
running in it the query's Python runner failed to connect back (`make demo`, every run)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NotFound, stream_missing
from nats_spark.jetstream.replies import StreamInfo

# What a format checks beyond the stream, with the client and the stream's info.
MoreChecks = Callable[[NatsClient, StreamInfo], Awaitable[None]]


async def _check(connection: ConnectionSettings, stream: str, more: MoreChecks | None) -> None:
    client = await NatsClient.open(connection)
    try:
        try:
            info = await client.api.stream_info(stream)
        except NotFound:
            raise stream_missing(stream, connection.described()) from None
        if more is not None:
            await more(client, info)
    finally:
        await client.close()


def check_at_load(
    connection: ConnectionSettings, stream: str, more: MoreChecks | None = None
) -> None:
    """Connect, check that `stream` exists, run `more`, disconnect."""
    asyncio.run(_check(connection, stream, more))
