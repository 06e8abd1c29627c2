"""Creating a group's consumers as Go members do: waiting while another consumer still holds
overlapping filters on the work-queue stream, and from a given sequence when one is new."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ErrorCode, JetStreamApiError
from nats_spark.pcg.consumers import GroupConsumer, ensure_group_consumer
from nats_spark.spark.group_source.driver.consumer_checks import SeenConsumers

_OVERLAP_RETRIES = 20


def from_sequence(start_seq: int) -> dict[str, Any] | None:
    if start_seq <= 1:
        return None  # from the first message: the default
    return {"deliver_policy": "by_start_sequence", "opt_start_seq": start_seq}


async def ensure(
    client: NatsClient,
    consumer: GroupConsumer,
    seen: SeenConsumers,
    deliver: Mapping[str, Any] | None = None,
    placed: bool = True,
) -> None:
    """Create a group consumer (delivering from where `deliver` says, when it is new), waiting
    while another consumer (maybe a Go member) still holds overlapping filters on the work-queue
    stream, as Go members wait for each other; then check it (an adopted one keeps its own
    config) and record it in `seen` as the query's (`placed`: the query creates it where it
    chose, as opposed to taking one it may find as it is, `SeenConsumers.record`)."""
    if deliver:
        consumer = GroupConsumer(consumer.stream, consumer.name, {**consumer.config, **deliver})
    for _ in range(_OVERLAP_RETRIES - 1):
        try:
            info = await ensure_group_consumer(client, consumer)
            break
        except JetStreamApiError as error:
            if error.err_code != ErrorCode.FILTER_NOT_UNIQUE_ON_WORK_QUEUE:
                raise
        await asyncio.sleep(0.5)
    else:
        info = await ensure_group_consumer(client, consumer)
    seen.record(consumer.stream, consumer.name, info, placed)
