"""What a query reads, resolved on the driver into slots: one input partition each per batch.

A `GroupTarget` is a partitioned consumer group (a slot per member, member consumers created as
the Go library does); a `ConsumerTarget` is one existing priority-group pull consumer read by
`numPartitions` slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, JetStreamApiError, NotFound
from nats_spark.jetstream.api import to_nanos
from nats_spark.pcg.config import StaticConfig
from nats_spark.pcg.consumers import (
    PRIORITY_GROUP,
    MemberConsumer,
    ensure_member_consumer,
    member_consumer,
)
from nats_spark.pcg.partitioning import member_partitions
from nats_spark.pcg.store import GroupEntry, GroupKind, load_group
from nats_spark.spark.options import SourceOptions

log = logging.getLogger(__name__)

FILTER_OVERLAP = 10100  # "filtered consumer not unique on workqueue stream"
_OVERLAP_RETRIES = 20


@dataclass(frozen=True)
class Slot:
    name: str
    stream: str
    consumer: str
    priority_group: str | None
    policy: str
    member: str | None
    partitioned: bool
    readers: int = 1  # slots pulling from the same consumer
    # False for consumers the source recreates (elastic members): a new consumer's ack floor
    # says nothing about messages the old one delivered.
    durable: bool = True


def _can_hold_partition_tokens(stream_config: dict[str, Any]) -> bool:
    """Whether a static group's stream can store `<partition>.<subject>`: it transforms subjects
    with `partition(...)`, or one of its subjects may start with a number."""
    transforms = [stream_config.get("subject_transform") or {}]
    if any("partition(" in (t.get("dest") or "").lower() for t in transforms):
        return True
    for subject in stream_config.get("subjects") or []:
        first = subject.split(".", 1)[0]
        if first in ("*", ">") or first.isdigit():
            return True
    return False


async def _ensure(client: NatsClient, consumer: MemberConsumer) -> None:
    """Create a member consumer, waiting while another member (maybe a Go instance) still holds
    overlapping filters on the work-queue stream, as Go members wait for each other."""
    for attempt in range(_OVERLAP_RETRIES):
        try:
            await ensure_member_consumer(client, consumer)
            return
        except JetStreamApiError as error:
            if error.err_code != FILTER_OVERLAP or attempt == _OVERLAP_RETRIES - 1:
                raise
            await asyncio.sleep(0.5)


def _member_names(config: Any) -> list[str]:
    if config.member_mappings:
        return [m.member for m in config.member_mappings]
    return list(dict.fromkeys(config.members))


class GroupTarget:
    """A partitioned consumer group: every member with partitions is a slot."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.kind = None if options.group_type == "auto" else GroupKind(options.group_type)
        self.entry: GroupEntry | None = None
        self.consumers: dict[str, MemberConsumer] = {}

    def _template(self) -> dict[str, Any]:
        return {
            "ack_wait": to_nanos(self.options.ack_wait),
            "max_ack_pending": self.options.max_ack_pending,
        }

    def _check_unchanged(self, entry: GroupEntry) -> None:
        previous = self.entry
        if previous is None or previous.revision == entry.revision:
            return
        if isinstance(entry.config, StaticConfig) and entry.config != previous.config:
            raise ConfigurationError(
                f"static consumer group {entry.group!r} on stream {entry.stream!r} was changed "
                "while the query ran; static groups are immutable: restore the config, or delete "
                "and recreate the group and restart the query"
            )

    async def resolve(self, client: NatsClient) -> list[Slot]:
        """Reload the group config and make sure every member's consumer matches it."""
        options = self.options
        entry = await load_group(client, options.stream, options.group or "", self.kind)
        self._check_unchanged(entry)
        if self.entry is None and entry.kind is GroupKind.STATIC:
            stream = await client.api.stream_info(entry.stream)
            if not _can_hold_partition_tokens(stream["config"]):
                raise ConfigurationError(
                    f"stream {entry.stream!r} of static group {entry.group!r} does not store "
                    "subjects as '<partition>.<subject>', so no member filter matches; add a "
                    "subject transform such as {{partition(N,1)}}.<subject> to the stream"
                )
        self.kind = entry.kind
        names = _member_names(entry.config)
        wanted = list(options.members) if options.members else names
        missing = [m for m in wanted if m not in names]
        if missing and (self.entry is None or entry.kind is GroupKind.STATIC):
            raise ConfigurationError(
                f"members {', '.join(missing)} are not in group {entry.group!r} (members: "
                f"{', '.join(names) or 'none'}); fix the members option or add them to the group"
            )
        if missing:
            log.warning("members %s left group %s; they are no longer read", missing, entry.group)
        desired: dict[str, MemberConsumer] = {}
        for member in wanted:
            config = entry.config
            if member in missing or not member_partitions(
                config.members, config.max_members, config.member_mappings, member
            ):
                continue  # gone, or beyond max_members: no partitions to read
            desired[member] = member_consumer(entry, member, self._template())
        stale = [m for m, c in self.consumers.items() if desired.get(m) != c]
        for member in stale:
            old = self.consumers.pop(member)
            if entry.kind is GroupKind.ELASTIC:
                # Partitions move between members: free the old filters before any member claims
                # them, as a work-queue stream refuses overlapping consumers.
                log.info("membership changed: deleting consumer %s > %s", old.stream, old.name)
                with contextlib.suppress(NotFound):
                    await client.api.delete_consumer(old.stream, old.name)
        for member, consumer in desired.items():
            if member not in self.consumers:
                await _ensure(client, consumer)
                self.consumers[member] = consumer
        slots = [
            Slot(
                member,
                consumer.stream,
                consumer.name,
                PRIORITY_GROUP,
                "pinned_client",
                member,
                partitioned=True,
                durable=entry.kind is GroupKind.STATIC,
            )
            for member, consumer in desired.items()
        ]
        self.entry = entry
        return slots

    async def heal(self, client: NatsClient, slot: Slot) -> None:
        """Recreate a member consumer that vanished (elastic ones expire when inactive)."""
        consumer = self.consumers[slot.name]
        log.info("recreating member consumer %s > %s", consumer.stream, consumer.name)
        await _ensure(client, consumer)


class ConsumerTarget:
    """One existing pull consumer with a priority policy, read by `numPartitions` slots."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.slots: list[Slot] | None = None

    async def resolve(self, client: NatsClient) -> list[Slot]:
        if self.slots is not None:
            return self.slots
        options = self.options
        name = options.consumer or ""
        try:
            info = await client.api.consumer_info(options.stream, name)
        except NotFound:
            raise ConfigurationError(
                f"consumer {name!r} does not exist on stream {options.stream!r}; create it "
                "first (the source never creates or changes a plain consumer)"
            ) from None
        config = info["config"]
        if config.get("deliver_subject"):
            raise ConfigurationError(
                f"consumer {name!r} is a push consumer; the source reads pull consumers only"
            )
        if config.get("ack_policy", "explicit") != "explicit":
            raise ConfigurationError(
                f"consumer {name!r} has ack policy {config.get('ack_policy')!r}; the source needs "
                "explicit acks to ack only committed batches: use a consumer with ack_policy "
                "explicit"
            )
        policy = config.get("priority_policy") or "none"
        groups = config.get("priority_groups") or []
        group = options.priority_group
        if group is None and len(groups) > 1:
            raise ConfigurationError(
                f"consumer {name!r} has several priority groups {groups}; set the priorityGroup "
                "option to the one to read"
            )
        if group is None and groups:
            group = groups[0]
        if groups and group not in groups:
            raise ConfigurationError(
                f"priority group {group!r} is not one of consumer {name!r}'s groups {groups}; "
                "fix the priorityGroup option"
            )
        if not groups and options.priority_group:
            raise ConfigurationError(
                f"consumer {name!r} has no priority groups; drop the priorityGroup option"
            )
        if (options.min_pending or options.min_ack_pending) and policy != "overflow":
            raise ConfigurationError(
                f"minPending/minAckPending need an overflow consumer, but {name!r} has policy "
                f"{policy!r}; drop the options or use an overflow consumer"
            )
        if options.priority is not None and policy != "prioritized":
            raise ConfigurationError(
                f"priority needs a prioritized consumer, but {name!r} has policy {policy!r}; "
                "drop the option or use a prioritized consumer"
            )
        if policy == "pinned_client" and options.num_partitions > 1:
            raise ConfigurationError(
                f"consumer {name!r} is pinned_client: only one client may pull at a time, so "
                "numPartitions must be 1"
            )
        count = options.num_partitions
        self.slots = [
            Slot(
                name if count == 1 else f"{name}#{i}",
                options.stream,
                name,
                group,
                policy,
                None,
                partitioned=False,
                readers=count,
            )
            for i in range(count)
        ]
        return self.slots

    async def heal(self, client: NatsClient, slot: Slot) -> None:
        raise ConfigurationError(
            f"consumer {slot.consumer!r} on stream {slot.stream!r} was deleted while the query "
            "ran; recreate it and restart the query"
        )


def target_for(options: SourceOptions) -> GroupTarget | ConsumerTarget:
    return GroupTarget(options) if options.group else ConsumerTarget(options)
