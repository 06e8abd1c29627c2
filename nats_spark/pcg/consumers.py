"""The consumers a group is read through, in either layout.

Member layout: one consumer per member, created exactly as the Go library does (so Go and Python
members mix). Partition layout: one durable single-filter consumer per partition, which
nats-server serves at a cost that does not grow with the number of distinct subjects.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats_spark.errors import ConfigurationError, ErrorCode, JetStreamApiError, NotFound
from nats_spark.jetstream.api import NANOS, to_nanos
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.pcg.kinds import GroupKind
from nats_spark.pcg.partitioning import (
    elastic_stream_name,
    member_filter_subjects,
    partition_filter_subjects,
)
from nats_spark.pcg.store import GroupEntry

if TYPE_CHECKING:  # annotations only: parsing a format's options imports pcg, not the connection
    from nats_spark.client import NatsClient

log = logging.getLogger(__name__)

PRIORITY_GROUP = "PCG"
DEFAULT_ACK_WAIT = 5.0  # seconds; what Go uses when the template's ack wait is 0 or less
PARTITION_PREFIX = "partition-"


@dataclass(frozen=True)
class GroupConsumer:
    """Where a member or a partition is pulled from, and the consumer config it needs there
    (JSON wire form)."""

    stream: str
    name: str
    config: dict[str, Any]

    @property
    def ack_wait(self) -> float:
        return self.config["ack_wait"] / NANOS

    @property
    def filter_subjects(self) -> list[str]:
        return filters_of(self.config)


def filters_of(config: dict[str, Any]) -> list[str]:
    if config.get("filter_subjects"):
        return list(config["filter_subjects"])
    return [config["filter_subject"]] if config.get("filter_subject") else []


def pull_expires(ack_wait: float) -> float:
    """How long one pull may wait: half the ack wait, at least 1 s (Go members do the same)."""
    return max(ack_wait / 2, 1.0)


def read_stream(entry: GroupEntry) -> str:
    """The stream the group's consumers live on: the user's (static) or the work-queue one."""
    if entry.kind is GroupKind.STATIC:
        return entry.stream
    return elastic_stream_name(entry.stream, entry.group)


def _pinned_config(template: dict[str, Any] | None) -> dict[str, Any]:
    """The template with Go's ack wait default and the group's pinned priority group."""
    config: dict[str, Any] = dict(template or {})
    ack_wait = config.get("ack_wait", 0)
    if ack_wait <= 0:
        ack_wait = to_nanos(DEFAULT_ACK_WAIT)
    config["ack_wait"] = ack_wait
    config["priority_groups"] = [PRIORITY_GROUP]
    config["priority_policy"] = "pinned_client"
    config["priority_timeout"] = max(ack_wait, NANOS)
    return config


def member_consumer(
    entry: GroupEntry, member: str, template: dict[str, Any] | None = None
) -> GroupConsumer:
    """The consumer of `member` in the group of `entry`; `template` holds wire-form overrides
    (ack_wait in ns, max_ack_pending, ...) as a member's user config does in Go."""
    config = _pinned_config(template)
    config["filter_subjects"] = member_filter_subjects(entry.config, member)
    if entry.kind is GroupKind.STATIC:
        name = f"{entry.group}-{member}"
        config["durable_name"] = name
        config.setdefault("ack_policy", "explicit")
    else:
        name = member
        config.pop("durable_name", None)
        config["ack_policy"] = "explicit"
        config["inactive_threshold"] = config["ack_wait"]
    return GroupConsumer(read_stream(entry), name, config)


def partition_consumer_name(entry: GroupEntry, partition: int) -> str:
    """`<group>-partition-<p>` on a static group's stream (Go's static delete, which removes
    `<group>-*`, takes it too), `partition-<p>` on an elastic group's own work-queue stream."""
    suffix = f"{PARTITION_PREFIX}{partition}"
    return f"{entry.group}-{suffix}" if entry.kind is GroupKind.STATIC else suffix


def partition_consumer(
    entry: GroupEntry, partition: int, template: dict[str, Any] | None = None
) -> GroupConsumer:
    """The durable consumer of one partition: the owner's filters of that partition only (one
    filter unless the static group has several), or none when an elastic group has a single
    partition (its work-queue stream holds nothing else)."""
    config = _pinned_config(template)
    name = partition_consumer_name(entry, partition)
    config["durable_name"] = name
    config["ack_policy"] = "explicit"
    config.pop("inactive_threshold", None)
    filters = partition_filter_subjects(entry.config, partition)
    if entry.kind is GroupKind.ELASTIC and entry.config.max_members == 1:
        filters = []
    if len(filters) == 1:
        config["filter_subject"] = filters[0]
    elif filters:
        config["filter_subjects"] = filters
    return GroupConsumer(read_stream(entry), name, config)


def _same_membership(existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether an existing consumer serves the same partitions under the same priority rules."""
    return (
        filters_of(existing) == filters_of(wanted)
        and existing.get("priority_groups") == wanted["priority_groups"]
        and existing.get("priority_policy") == wanted["priority_policy"]
    )


async def ensure_group_consumer(client: NatsClient, consumer: GroupConsumer) -> ConsumerInfo:
    """Create the consumer, or adopt or replace an existing one; returns its info.

    An existing consumer with the same filters and priority settings is used as it is (its ack
    wait may differ). Otherwise an elastic member's consumer is recreated, as Go does; a durable
    is not, because recreating it would replay the stream from the start.
    """
    try:
        return await client.api.create_consumer(consumer.stream, consumer.name, consumer.config)
    except JetStreamApiError as error:
        if error.err_code != ErrorCode.CONSUMER_EXISTS_WITH_OTHER_CONFIG:
            raise
    try:
        info = await client.api.consumer_info(consumer.stream, consumer.name)
    except NotFound:  # deleted in between; create afresh
        return await client.api.create_consumer(consumer.stream, consumer.name, consumer.config)
    if _same_membership(info.config, consumer.config):
        return info
    if consumer.config.get("durable_name"):
        raise ConfigurationError(
            f"consumer {consumer.name!r} on stream {consumer.stream!r} exists with other filters "
            f"or priority settings than the group assigns ({consumer.filter_subjects}); delete it "
            "(nats consumer rm) so the member can recreate it"
        )
    log.info("recreating member consumer %s > %s with new filters", consumer.stream, consumer.name)
    await client.api.delete_consumer(consumer.stream, consumer.name)
    return await client.api.create_consumer(consumer.stream, consumer.name, consumer.config)
