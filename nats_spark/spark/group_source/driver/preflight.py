"""The check of a query's target at load() (`shared/load_check.py`): beyond the stream, the group
(or consumer) the options name exists and fits them (the driver checks the same again when the
query starts)."""

from __future__ import annotations

from nats_spark.client import NatsClient
from nats_spark.jetstream.replies import StreamInfo
from nats_spark.spark.group_source.driver.targets import target_for
from nats_spark.spark.group_source.options import SourceOptions
from nats_spark.spark.shared.load_check import check_at_load


def check_target(options: SourceOptions) -> None:
    async def group_or_consumer(client: NatsClient, _: StreamInfo) -> None:
        await target_for(options).check(client)

    check_at_load(options.connection, options.stream, group_or_consumer)
