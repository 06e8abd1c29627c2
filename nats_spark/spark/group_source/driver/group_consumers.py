"""Creating a group's consumers as Go members do: waiting while another consumer still holds
overlapping filters on the work-queue stream, and from a given sequence when one is new."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, ErrorCode, JetStreamApiError
from nats_spark.jetstream.replies import ConsumerInfo
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
    config; one placed by `deliver`, `_check_placed`, and held to what an earlier checkpoint's
    query acked at its first look, `SeenConsumers.place`) and record it in `seen` as the
    query's (`placed`: the query creates it where it chose, as opposed to taking one it may
    find as it is, `SeenConsumers.record`)."""
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
    if deliver:
        _check_placed(consumer, info, deliver)
        seen.place(consumer.stream, consumer.name, info)
    else:
        seen.record(consumer.stream, consumer.name, info, placed)


def _check_placed(consumer: GroupConsumer, info: ConsumerInfo, deliver: Mapping[str, Any]) -> None:
    """A consumer the query created to start where `deliver` says must be the one it made: the
    create finds one made meanwhile by someone else (a member of the group healing its consumer
    as a layout move deleted it, or creating it as `startingPosition` found none) and takes it
    as it is (`ensure_group_consumer`). Such a one starts elsewhere: read on, it would deliver
    again what the query read before the start it chose, or skip what it did not. It is not the
    query's to delete, nor to record as placed (that would drop the sighting the check of a
    consumer created again rests on): it is refused, left as it is."""
    if _starts_as(info.config, deliver):
        return
    stream, name = consumer.stream, consumer.name
    raise ConfigurationError(
        f"consumer {name!r} on stream {stream!r} was created by someone else as the query "
        f"created it to start {_start_of(deliver)}: it starts {_start_of(info.config)}, and "
        "would deliver again what the query read or skip what it did not; the source left it "
        "as it is: stop what creates it (a member of the group running beside the query), "
        f"delete it (nats consumer rm {stream} {name}) and restart the query"
    )


def _starts_as(config: Mapping[str, Any], deliver: Mapping[str, Any]) -> bool:
    """Whether a consumer's `config` has the start `deliver` sets (a start time compared as an
    instant: the server writes it its own way, e.g. without a fraction's trailing zeros)."""
    for key, wanted in deliver.items():
        found = config.get(key, "all" if key == "deliver_policy" else None)
        if key == "opt_start_time" and isinstance(found, str):
            if datetime.fromisoformat(found) != datetime.fromisoformat(wanted):
                return False
        elif found != wanted:
            return False
    return True


def _start_of(config: Mapping[str, Any]) -> str:
    """A consumer's start as a refusal names it: its deliver policy and where it starts."""
    policy = config.get("deliver_policy") or "all"
    at = config.get("opt_start_seq") or config.get("opt_start_time")
    return f"with deliver policy {policy}" + (f" at {at}" if at else "")
