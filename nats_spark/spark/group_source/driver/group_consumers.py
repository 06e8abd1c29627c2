"""Creating a group's consumers as Go members do: waiting while another consumer still holds
overlapping filters on the work-queue stream, and from a given sequence when one is new."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ErrorCode, JetStreamApiError
from nats_spark.pcg.consumers import GroupConsumer, ensure_group_consumer

_OVERLAP_RETRIES = 20


def from_sequence(start_seq: int) -> dict[str, Any] | None:
    if start_seq <= 1:
        return None  # from the first message: the default
    return {"deliver_policy": "by_start_sequence", "opt_start_seq": start_seq}


async def ensure(
    client: NatsClient, consumer: GroupConsumer, deliver: Mapping[str, Any] | None = None
) -> None:
    """Create a group consumer (delivering from where `deliver` says, when it is new), waiting
    while another consumer (maybe a Go member) still holds overlapping filters on the work-queue
    stream, as Go members wait for each other."""
    if deliver:
        consumer = GroupConsumer(consumer.stream, consumer.name, {**consumer.config, **deliver})
    for attempt in range(_OVERLAP_RETRIES):
        try:
            await ensure_group_consumer(client, consumer)
            return
        except JetStreamApiError as error:
            if (
                error.err_code != ErrorCode.FILTER_NOT_UNIQUE_ON_WORK_QUEUE
                or attempt == _OVERLAP_RETRIES - 1
            ):
                raise
            await asyncio.sleep(0.5)
