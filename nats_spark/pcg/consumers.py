"""Member consumers created exactly as the Go library does, so Go and Python members mix."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, JetStreamApiError, NotFound
from nats_spark.jetstream.api import NANOS, to_nanos
from nats_spark.pcg.partitioning import elastic_stream_name, member_filter_subjects
from nats_spark.pcg.store import GroupEntry, GroupKind

log = logging.getLogger(__name__)

PRIORITY_GROUP = "PCG"
DEFAULT_ACK_WAIT = 5.0  # seconds; what Go uses when the template's ack wait is 0 or less
CONSUMER_EXISTS_WITH_OTHER_CONFIG = 10148


@dataclass(frozen=True)
class MemberConsumer:
    """Where a member pulls from and the consumer config it needs there (JSON wire form)."""

    stream: str
    name: str
    config: dict[str, Any]

    @property
    def ack_wait(self) -> float:
        return self.config["ack_wait"] / NANOS

    @property
    def filter_subjects(self) -> list[str]:
        return self.config["filter_subjects"]


def pull_expires(ack_wait: float) -> float:
    """How long one pull may wait: half the ack wait, at least 1 s (Go members do the same)."""
    return max(ack_wait / 2, 1.0)


def member_consumer(
    entry: GroupEntry, member: str, template: dict[str, Any] | None = None
) -> MemberConsumer:
    """The consumer of `member` in the group of `entry`; `template` holds wire-form overrides
    (ack_wait in ns, max_ack_pending, ...) as a member's user config does in Go."""
    config: dict[str, Any] = dict(template or {})
    ack_wait = config.get("ack_wait", 0)
    if ack_wait <= 0:
        ack_wait = to_nanos(DEFAULT_ACK_WAIT)
    config["ack_wait"] = ack_wait
    config["filter_subjects"] = member_filter_subjects(entry.config, member)
    config["priority_groups"] = [PRIORITY_GROUP]
    config["priority_policy"] = "pinned_client"
    config["priority_timeout"] = max(ack_wait, NANOS)
    if entry.kind is GroupKind.STATIC:
        name = f"{entry.group}-{member}"
        config["durable_name"] = name
        config.setdefault("ack_policy", "explicit")
        stream = entry.stream
    else:
        name = member
        config.pop("durable_name", None)
        config["ack_policy"] = "explicit"
        config["inactive_threshold"] = ack_wait
        stream = elastic_stream_name(entry.stream, entry.group)
    return MemberConsumer(stream, name, config)


def _same_membership(existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether an existing consumer serves the same partitions under the same priority rules."""
    existing_filters = existing.get("filter_subjects") or (
        [existing["filter_subject"]] if existing.get("filter_subject") else []
    )
    return (
        existing_filters == wanted["filter_subjects"]
        and existing.get("priority_groups") == wanted["priority_groups"]
        and existing.get("priority_policy") == wanted["priority_policy"]
    )


async def ensure_member_consumer(client: NatsClient, consumer: MemberConsumer) -> dict[str, Any]:
    """Create the member consumer, or adopt or replace an existing one; returns its info.

    An existing consumer with the same filters and priority settings is used as it is (its ack
    wait may differ). Otherwise an elastic member's consumer is recreated, as Go does; a static
    member's durable is not, because recreating it would replay the stream from the start.
    """
    try:
        return await client.api.create_consumer(consumer.stream, consumer.name, consumer.config)
    except JetStreamApiError as error:
        if error.err_code != CONSUMER_EXISTS_WITH_OTHER_CONFIG:
            raise
    try:
        info = await client.api.consumer_info(consumer.stream, consumer.name)
    except NotFound:  # deleted in between; create afresh
        return await client.api.create_consumer(consumer.stream, consumer.name, consumer.config)
    if _same_membership(info["config"], consumer.config):
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
