"""The check of a query's target at load(), where Spark asks the source for its schema: the
servers answer, the stream exists, and so does the group (or consumer) the options name, fitting
them. It only reads, so a mistake fails there as one line, before a query starts or anything is
taken or created (the driver checks the same again when the query starts)."""

from __future__ import annotations

from nats_spark.client import NatsClient
from nats_spark.errors import NotFound, stream_missing
from nats_spark.spark.group_source.driver.targets import target_for
from nats_spark.spark.group_source.options import SourceOptions


async def check_target(options: SourceOptions) -> None:
    client = await NatsClient.open(options.connection)
    try:
        try:
            await client.api.stream_info(options.stream)
        except NotFound:
            raise stream_missing(options.stream, options.connection.described()) from None
        await target_for(options).check(client)
    finally:
        await client.close()
