"""What a query reads, resolved on the driver into slots: one input partition each per batch.

A `GroupTarget` is a partitioned consumer group (a slot per member, member consumers created as
the Go library does); a `ConsumerTarget` is one existing priority-group pull consumer read by
`numPartitions` slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, ErrorCode, JetStreamApiError, NotFound
from nats_spark.jetstream.api import to_nanos
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.pcg.admin import consumer_info_or_none
from nats_spark.pcg.config import StaticConfig
from nats_spark.pcg.consumers import (
    PARTITION_PREFIX,
    PRIORITY_GROUP,
    ConsumerLayout,
    GroupConsumer,
    ensure_group_consumer,
    filters_of,
    member_consumer,
    partition_consumer,
    partition_consumer_name,
    read_stream,
)
from nats_spark.pcg.partitioning import member_partitions, partition_owner
from nats_spark.pcg.store import GroupEntry, GroupKind, load_group
from nats_spark.spark.group_source.options import SourceOptions

log = logging.getLogger(__name__)

_OVERLAP_RETRIES = 20
_MEMBER_LAYOUT_COST = (
    "the member layout (one multi-filter consumer per member) costs nats-server CPU per message "
    "that grows with the distinct subjects of a file-stored stream during catch-up (10-60x the "
    "partition layout's at 1,000-10,000 keys)"
)


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


@dataclass(frozen=True)
class Held:
    """What this query holds on the server: the pin ids it (or the target's previous query) got,
    and by slot the messages its ledger records as taken and not yet acked. What a consumer
    shows beyond that is another client's doing."""

    pins: frozenset[str] = frozenset()
    unacked: Mapping[str, int] = field(default_factory=dict)

    def other_reader(self, slot: str, info: ConsumerInfo, reading: bool) -> str | None:
        """Why another client seems to read the consumer of `slot` (None when nothing shows
        one); `reading`: this query pulls from it itself, so waiting pulls may be its own."""
        pin = info.pinned_id(PRIORITY_GROUP)
        if pin and pin not in self.pins:
            return "pinned by another client"
        waiting = info.num_waiting
        if waiting and not reading:
            return f"{waiting} pull request(s) waiting"
        extra = info.num_ack_pending - self.unacked.get(slot, 0)
        if extra > 0:
            return f"{extra} message(s) ack-pending"
        return None


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


def _from_sequence(start_seq: int) -> dict[str, Any] | None:
    if start_seq <= 1:
        return None  # from the first message: the default
    return {"deliver_policy": "by_start_sequence", "opt_start_seq": start_seq}


async def _ensure(
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


def _delivered_seq(info: ConsumerInfo) -> int:
    return info.delivered_seq


def _member_names(config: Any) -> list[str]:
    if config.member_mappings:
        return [m.member for m in config.member_mappings]
    return list(dict.fromkeys(config.members))


class GroupTarget:
    """A partitioned consumer group, read in the partition layout (a slot per partition of the
    selected members) or the member layout (a slot per member, Go's consumers)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.kind = None if options.group_type == "auto" else GroupKind(options.group_type)
        self.entry: GroupEntry | None = None
        self.consumers: dict[str, GroupConsumer] = {}  # by slot name
        self.warning: str | None = None  # why nothing is read (for progress), when so
        self.wanted: ConsumerLayout | None = None  # the layout the query reads the group in
        self.layout: ConsumerLayout | None = None  # the one it reads now (differs while moving)

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

    async def resolve(self, client: NatsClient, held: Held) -> list[Slot]:
        """Reload the group config, settle the layout and make sure every consumer matches."""
        options = self.options
        entry = await load_group(client, options.stream, options.group or "", self.kind)
        self._check_unchanged(entry)
        if options.starting_position is not None and entry.kind is GroupKind.ELASTIC:
            raise ConfigurationError(
                f"startingPosition applies to static groups; elastic group {entry.group!r} is "
                "read from its work-queue stream, which holds just what was not consumed yet: "
                "drop the option"
            )
        if self.entry is None and entry.kind is GroupKind.STATIC:
            stream = await client.api.stream_info(entry.stream)
            if not _can_hold_partition_tokens(stream.config):
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
        config = entry.config
        owned = {
            member: partitions
            for member in wanted
            if member not in missing
            and (
                partitions := member_partitions(
                    config.members, config.max_members, config.member_mappings, member
                )
            )
        }  # members gone, or beyond max_members, have no partitions to read
        self.warning = None if owned else self._no_members(entry, first=self.entry is None)
        self.entry = entry
        layout = await self._settle_layout(client, entry, owned, held)
        template = self._template()
        if layout is ConsumerLayout.MEMBER:
            desired = {m: member_consumer(entry, m, template) for m in owned}
            owners = {m: m for m in owned}
        else:
            desired, owners = {}, {}
            for member, partitions in owned.items():
                for p in partitions:
                    slot = f"{PARTITION_PREFIX}{p}"
                    desired[slot] = partition_consumer(entry, p, template)
                    owners[slot] = member
        for name in [n for n, c in self.consumers.items() if desired.get(n) != c]:
            old = self.consumers.pop(name)
            if entry.kind is GroupKind.ELASTIC:
                # Partitions move between readers: free the old filters before any reader
                # claims them, as a work-queue stream refuses overlapping consumers.
                log.info("no longer read: deleting consumer %s > %s", old.stream, old.name)
                with contextlib.suppress(NotFound):
                    await client.api.delete_consumer(old.stream, old.name)
        for name, consumer in desired.items():
            if name not in self.consumers:
                await self._create_or_adopt(client, consumer)
                self.consumers[name] = consumer
        return [self._slot(name, consumer, owners[name]) for name, consumer in desired.items()]

    async def _create_or_adopt(self, client: NatsClient, consumer: GroupConsumer) -> None:
        """A new consumer starts at `startingPosition`; an existing one keeps its position (as
        a Kafka group's committed offsets win over `startingOffsets`)."""
        position = self.options.starting_position
        if position is None:
            await _ensure(client, consumer)
        elif await consumer_info_or_none(client, consumer) is None:
            await _ensure(client, consumer, position.deliver)
        else:
            log.info(
                "startingPosition=%s not applied to %s > %s: it exists and keeps its position",
                position.text,
                consumer.stream,
                consumer.name,
            )
            await _ensure(client, consumer)

    def _no_members(self, entry: GroupEntry, first: bool) -> str:
        """A group without members to read fails at start; one that loses them while the query
        runs is read again once members return, with a warning every batch until then."""
        if entry.kind is GroupKind.ELASTIC:
            fix = f"nats-pcg elastic add {entry.stream} {entry.group} <member>..."
        else:
            fix = "delete the group and create it with members (nats-pcg static create ...)"
        message = (
            f"{entry.kind.value} group {entry.group!r} on stream {entry.stream!r} has no members "
            f"to read, so nothing is read; add members: {fix}"
        )
        if first:
            raise ConfigurationError(message)
        log.warning("%s", message)
        return message

    def _slot(self, name: str, consumer: GroupConsumer, member: str | None) -> Slot:
        assert self.entry is not None
        return Slot(
            name,
            consumer.stream,
            consumer.name,
            PRIORITY_GROUP,
            "pinned_client",
            member,
            partitioned=True,
            # Partition consumers and static durables keep their ack floor; an elastic
            # member's consumer is recreated when membership changes.
            durable=consumer.config.get("durable_name") is not None,
        )

    def slot_named(self, name: str) -> Slot:
        """The slot `name` of either layout (a batch planned before a restart may name slots
        of the layout the query has since moved from)."""
        assert self.entry is not None
        entry = self.entry
        number = name.removeprefix(PARTITION_PREFIX)
        if name != number and number.isdigit():
            p = int(number)
            return self._slot(name, partition_consumer(entry, p), partition_owner(entry.config, p))
        return self._slot(name, member_consumer(entry, name), name)

    async def _settle_layout(
        self,
        client: NatsClient,
        entry: GroupEntry,
        owned: dict[str, list[int]],
        held: Held,
    ) -> ConsumerLayout:
        """Decide the layout on first use and move the group into it once its old consumers
        are quiet; refuse when another client reads the same messages in the other layout."""
        # Once settled, only the partition layout keeps watching for Go-layout members.
        settled = self.wanted is not None and self.layout is self.wanted
        watched = owned if not settled or self.wanted is ConsumerLayout.PARTITION else {}
        members = {
            m: await consumer_info_or_none(client, member_consumer(entry, m)) for m in watched
        }
        partitions = {
            p: await consumer_info_or_none(client, partition_consumer(entry, p))
            for ps in ([] if settled else owned.values())
            for p in ps
        }
        reading_members = self.layout is ConsumerLayout.MEMBER
        go_active = {
            m: why
            for m, info in members.items()
            if info is not None and (why := held.other_reader(m, info, reading_members))
        }
        if self.wanted is None:
            self.wanted = self._choose_layout(entry, go_active, partitions)
        if self.wanted is ConsumerLayout.PARTITION:
            clashing = [m for m in owned if m.startswith(PARTITION_PREFIX)]
            if clashing:
                raise ConfigurationError(
                    f"members {', '.join(clashing)} of group {entry.group!r} are named like the "
                    "partition layout's consumers; rename them or read with consumerLayout=member"
                )
            if go_active:
                member, why = sorted(go_active.items())[0]
                consumer = member_consumer(entry, member)
                raise ConfigurationError(
                    f"Go-layout member {member!r} of group {entry.group!r} is active ({why} on "
                    f"consumer {consumer.stream} > {consumer.name}) while this query reads the "
                    "group per partition, so both would deliver the same messages; stop that "
                    "member, or read with consumerLayout=member"
                )
            if self.layout is not ConsumerLayout.PARTITION:
                await self._move_to_partitions(client, entry, owned, members, partitions)
        elif self.layout is not ConsumerLayout.MEMBER:
            await self._move_to_members(client, entry, owned, partitions, held)
        assert self.layout is not None
        return self.layout

    def _choose_layout(
        self,
        entry: GroupEntry,
        go_active: dict[str, str],
        partitions: dict[int, ConsumerInfo | None],
    ) -> ConsumerLayout:
        """The option's layout; for `auto` the partition layout, unless Go-layout members are
        active on a group that has no partition consumers (then it says what that costs)."""
        choice = self.options.consumer_layout
        if choice != "auto":
            layout = ConsumerLayout(choice)
        elif go_active and not any(partitions.values()):
            layout = ConsumerLayout.MEMBER
            log.warning(
                "group %s: Go-layout members %s are active, so this query reads the group in "
                "the member layout; %s: stop them and restart the query to read per partition",
                entry.group,
                ", ".join(sorted(go_active)),
                _MEMBER_LAYOUT_COST,
            )
        else:
            layout = ConsumerLayout.PARTITION
        log.info("group %s: reading in the %s layout", entry.group, layout.value)
        return layout

    async def _move_to_partitions(
        self,
        client: NatsClient,
        entry: GroupEntry,
        owned: dict[str, list[int]],
        members: dict[str, ConsumerInfo | None],
        partitions: dict[int, ConsumerInfo | None],
    ) -> None:
        """Create the missing partition consumers where their owners' member consumers stopped.

        Exact because a member consumer with nothing ack-pending has delivered (and had acked)
        every message of its partitions up to its delivered sequence and none after. Until its
        acks are in (this query's own batch of the member layout), the member layout stays.
        """
        starts: dict[int, int] = {}
        for member, ps in owned.items():
            info = members[member]
            missing = [p for p in ps if partitions[p] is None]
            if info is None or not missing:
                continue
            if info.num_ack_pending:
                log.info(
                    "group %s: member %s has acks pending; moving to the partition layout once "
                    "they are in",
                    entry.group,
                    member,
                )
                self.layout = ConsumerLayout.MEMBER
                return
            if entry.kind is GroupKind.STATIC:
                starts.update({p: _delivered_seq(info) + 1 for p in missing})
            else:
                # A work-queue stream keeps only unacked messages: the partition consumers
                # start where the member consumer left, once its overlapping filters are gone.
                with contextlib.suppress(NotFound):
                    await client.api.delete_consumer(read_stream(entry), member)
        template = self._template()
        for p, start in sorted(starts.items()):
            log.info(
                "group %s: partition %d moves to its own consumer at %d", entry.group, p, start
            )
            await _ensure(client, partition_consumer(entry, p, template), _from_sequence(start))
        self.layout = ConsumerLayout.PARTITION

    async def _move_to_members(
        self,
        client: NatsClient,
        entry: GroupEntry,
        owned: dict[str, list[int]],
        partitions: dict[int, ConsumerInfo | None],
        held: Held,
    ) -> None:
        """Hand the group's partitions back to member consumers where the partition consumers
        stopped, and delete those. A static member consumer starts after the last message its
        partition consumers delivered, which is exact only once they have caught up."""
        template = self._template()
        reading = self.layout is ConsumerLayout.PARTITION
        for member, ps in owned.items():
            infos = {p: info for p in ps if (info := partitions[p]) is not None}
            for p, info in infos.items():
                name = partition_consumer_name(entry, p)
                why = held.other_reader(f"{PARTITION_PREFIX}{p}", info, reading)
                if why:
                    raise ConfigurationError(
                        f"partition consumer {name!r} of group {entry.group!r} is read by another "
                        f"query ({why}); stop it before reading the group in the member layout"
                    )
                if info.num_ack_pending:
                    self.layout = ConsumerLayout.PARTITION  # this query's batch: acked soon
                    return
            if not infos:
                continue
            consumer = member_consumer(entry, member, template)
            start = 0
            if entry.kind is GroupKind.STATIC:
                start = max(_delivered_seq(info) for info in infos.values()) + 1
                await self._check_caught_up(client, entry, infos, start)
                with contextlib.suppress(NotFound):  # its position is from before the move
                    await client.api.delete_consumer(consumer.stream, consumer.name)
            for p in infos:
                name = partition_consumer_name(entry, p)
                await client.api.delete_consumer(consumer.stream, name)
            log.info("group %s: member %s moves to its consumer at %d", entry.group, member, start)
            await _ensure(client, consumer, _from_sequence(start))
        self.layout = ConsumerLayout.MEMBER

    async def _check_caught_up(
        self,
        client: NatsClient,
        entry: GroupEntry,
        infos: dict[int, ConsumerInfo],
        start: int,
    ) -> None:
        """A member consumer starting at `start` must not skip a message of its partitions that
        their consumers have not delivered: none may lie between a partition's position and
        `start` (messages after `start` are the member consumer's)."""
        for p, info in infos.items():
            for subject in filters_of(info.config) or [">"]:
                try:
                    found = await client.api.get_message(
                        entry.stream, _delivered_seq(info) + 1, next_by_subject=subject
                    )
                except NotFound:
                    continue
                if found.seq < start:
                    raise ConfigurationError(
                        f"group {entry.group!r} was read per partition and partition {p} has "
                        f"not been read up to message {start - 1} as the others have; read it "
                        "with consumerLayout=partition (e.g. trigger availableNow) before "
                        "moving the group to the member layout"
                    )

    async def heal(self, client: NatsClient, slot: Slot) -> None:
        """Recreate a consumer that vanished: elastic ones (members' expire when inactive; a
        work-queue stream keeps what was not acked). A static partition consumer is not: a new
        one would read its partition from the start again."""
        consumer = self.consumers[slot.name]
        if self.kind is GroupKind.STATIC and self.layout is ConsumerLayout.PARTITION:
            # Deleting the group deletes its consumers: say the group is gone (load_group's error).
            await load_group(client, self.options.stream, self.options.group or "", self.kind)
            raise ConfigurationError(
                f"partition consumer {consumer.name!r} on stream {consumer.stream!r} was deleted "
                "while the query ran; a new one would read its partition again from the start: "
                "delete and recreate the group to start over, then restart the query"
            )
        log.info("recreating consumer %s > %s", consumer.stream, consumer.name)
        await _ensure(client, consumer)


class ConsumerTarget:
    """One existing pull consumer with a priority policy, read by `numPartitions` slots."""

    layout: ConsumerLayout | None = None  # groups only
    warning: str | None = None

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.slots: list[Slot] | None = None

    async def resolve(self, client: NatsClient, held: Held) -> list[Slot]:
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
        config = info.config
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

    def slot_named(self, name: str) -> Slot:
        assert self.slots is not None
        return next(slot for slot in self.slots if slot.name == name)

    async def heal(self, client: NatsClient, slot: Slot) -> None:
        raise ConfigurationError(
            f"consumer {slot.consumer!r} on stream {slot.stream!r} was deleted while the query "
            "ran; recreate it and restart the query"
        )


def target_for(options: SourceOptions) -> GroupTarget | ConsumerTarget:
    return GroupTarget(options) if options.group else ConsumerTarget(options)
