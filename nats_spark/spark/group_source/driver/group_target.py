"""A partitioned consumer group as a query reads it: resolved on the driver into slots, a slot per
partition of the selected members (partition layout) or per member (member layout, Go's
consumers), its consumers created, adopted and recreated."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, NotFound
from nats_spark.jetstream.api import to_nanos
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.pcg.admin import consumer_info_or_none
from nats_spark.pcg.config import StaticConfig
from nats_spark.pcg.consumers import (
    PARTITION_PREFIX,
    PRIORITY_GROUP,
    GroupConsumer,
    member_consumer,
    partition_consumer,
)
from nats_spark.pcg.kinds import ConsumerLayout, GroupKind
from nats_spark.pcg.partitioning import member_partitions, partition_owner
from nats_spark.pcg.store import GroupEntry, load_group
from nats_spark.spark.group_source.driver.consumer_checks import (
    NOTHING_KNOWN,
    SeenConsumers,
    Skipped,
    restart_at,
)
from nats_spark.spark.group_source.driver.group_consumers import ensure
from nats_spark.spark.group_source.driver.layouts import GroupLayouts
from nats_spark.spark.group_source.driver.slots import Held, Slot
from nats_spark.spark.group_source.options import SourceOptions
from nats_spark.spark.group_source.slot_partition import Recreation

log = logging.getLogger(__name__)


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


def _consumers(
    entry: GroupEntry,
    layout: ConsumerLayout,
    owned: dict[str, list[int]],
    template: dict[str, Any],
) -> tuple[dict[str, GroupConsumer], dict[str, str]]:
    """The consumers `layout` reads `owned` with, and the member each reads for, by slot name."""
    if layout is ConsumerLayout.MEMBER:
        return {m: member_consumer(entry, m, template) for m in owned}, {m: m for m in owned}
    desired, owners = {}, {}
    for member, partitions in owned.items():
        for p in partitions:
            slot = f"{PARTITION_PREFIX}{p}"
            desired[slot] = partition_consumer(entry, p, template)
            owners[slot] = member
    return desired, owners


def _member_names(config: Any) -> list[str]:
    if config.member_mappings:
        return [m.member for m in config.member_mappings]
    return list(dict.fromkeys(config.members))


class GroupTarget:
    """A partitioned consumer group, read in the partition layout (a slot per partition of the
    selected members) or the member layout (a slot per member, Go's consumers)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.kind = options.group_type
        self.entry: GroupEntry | None = None
        self.consumers: dict[str, GroupConsumer] = {}  # by slot name
        self.warning: str | None = None  # why nothing is read (for progress), when so
        # The consumers of the last `resolve`, with what they were worked out from.
        self._planned: tuple[Any, tuple[dict[str, GroupConsumer], dict[str, str]]] | None = None
        template = {
            "ack_wait": to_nanos(options.ack_wait),
            "max_ack_pending": options.max_ack_pending,
        }
        self.seen = SeenConsumers()
        self.layouts = GroupLayouts(options.consumer_layout, template, self.seen)

    @property
    def layout(self) -> ConsumerLayout | None:
        """The layout the query reads the group in now; None before the first `resolve`."""
        return self.layouts.layout

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

    async def check(self, client: NatsClient) -> GroupEntry:
        """The group's config, checked against the options and the stream; reads only, so the
        source also checks its target with it at load(), before a query starts."""
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
        names = _member_names(entry.config)
        missing = [m for m in options.members or () if m not in names]
        if missing and (self.entry is None or entry.kind is GroupKind.STATIC):
            raise ConfigurationError(
                f"members {', '.join(missing)} are not in group {entry.group!r} (members: "
                f"{', '.join(names) or 'none'}); fix the members option or add them to the group"
            )
        return entry

    async def resolve(self, client: NatsClient, held: Held) -> list[Slot]:
        """Reload the group config, enter the layout and make sure every consumer matches."""
        entry = await self.check(client)
        self.kind = entry.kind
        owned = self._owned(entry)
        self.warning = None if owned else self._no_members(entry, first=self.entry is None)
        self.entry = entry
        layout = await self.layouts.enter(client, entry, owned, held)
        desired, owners = self._consumers_of(entry, layout, owned)
        await self._drop_changed(client, entry, desired)
        for name, consumer in desired.items():
            if name not in self.consumers:
                await self._create_or_adopt(client, consumer)
                self.consumers[name] = consumer
        return [self._slot(name, consumer, owners[name]) for name, consumer in desired.items()]

    def _consumers_of(
        self, entry: GroupEntry, layout: ConsumerLayout, owned: dict[str, list[int]]
    ) -> tuple[dict[str, GroupConsumer], dict[str, str]]:
        """`_consumers`, kept while the group's config, the layout and the members read stay
        the same: worked out at every planning, it grew with the square of the partitions (each
        partition's filters come from its owner's, all of them)."""
        key = (entry.kind, entry.stream, entry.group, repr(entry.config), layout, repr(owned))
        if self._planned is None or self._planned[0] != key:
            self._planned = (key, _consumers(entry, layout, owned, self.layouts.template))
        return self._planned[1]

    def _owned(self, entry: GroupEntry) -> dict[str, list[int]]:
        """The partitions of each member read, by member: the `members` option's (all when not
        given) that are in the group and own partitions (members gone, or beyond max_members,
        have none)."""
        names = _member_names(entry.config)
        wanted = list(self.options.members) if self.options.members else names
        missing = [m for m in wanted if m not in names]
        if missing:
            log.warning("members %s left group %s; they are no longer read", missing, entry.group)
        config = entry.config
        return {
            member: partitions
            for member in wanted
            if member not in missing
            and (
                partitions := member_partitions(
                    config.members, config.max_members, config.member_mappings, member
                )
            )
        }

    async def _drop_changed(
        self, client: NatsClient, entry: GroupEntry, desired: dict[str, GroupConsumer]
    ) -> None:
        """Forget the consumers no longer read as they were; an elastic group's are deleted."""
        for name in [n for n, c in self.consumers.items() if desired.get(n) != c]:
            old = self.consumers.pop(name)
            if entry.kind is GroupKind.ELASTIC:
                # Partitions move between readers: free the old filters before any reader
                # claims them, as a work-queue stream refuses overlapping consumers.
                log.info("no longer read: deleting consumer %s > %s", old.stream, old.name)
                with contextlib.suppress(NotFound):
                    await client.api.delete_consumer(old.stream, old.name)

    async def _create_or_adopt(self, client: NatsClient, consumer: GroupConsumer) -> None:
        """A new consumer starts at `startingPosition`; an existing one keeps its position (as
        a Kafka group's committed offsets win over `startingOffsets`)."""
        position = self.options.starting_position
        deliver = None
        if position is not None and await consumer_info_or_none(client, consumer) is None:
            deliver = position.deliver
        elif position is not None:
            log.info(
                "startingPosition=%s not applied to %s > %s: it exists and keeps its position",
                position.text,
                consumer.stream,
                consumer.name,
            )
        await ensure(client, consumer, self.seen, deliver, placed=deliver is not None)

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

    def look(self, slot: Slot, info: ConsumerInfo, skipped: Skipped = NOTHING_KNOWN) -> None:
        """Check a consumer as planning sees it: its config, and that it is still the one the
        query read (`recreation`)."""
        self.seen.look(slot.stream, slot.consumer, info, self.recreation(slot), skipped)

    def recreation(self, slot: Slot) -> Recreation | None:
        """How to go on when `slot`'s consumer was deleted and created again: a static group's
        is refused; None for an elastic group's, whose work-queue stream holds just what was not
        acked, so a new consumer there reads nothing twice."""
        if self.kind is not GroupKind.STATIC:
            return None
        start = self.seen.next_after_acked(slot.stream, slot.consumer)
        return restart_at(
            start,
            f"to read nothing twice, delete it (nats consumer rm {slot.stream} "
            f"{slot.consumer}) and ",
            self.seen.marks(slot.stream, slot.consumer),
        )

    async def heal(self, client: NatsClient, slot: Slot) -> None:
        """Recreate a consumer that vanished: elastic ones (members' expire when inactive; a
        work-queue stream keeps what was not acked). A static group's consumer is not: a new
        one would read its partitions from the start again."""
        consumer = self.consumers[slot.name]
        if self.kind is GroupKind.STATIC:
            # Deleting the group deletes its consumers: say the group is gone (load_group's error).
            await load_group(client, self.options.stream, self.options.group or "", self.kind)
            start = self.seen.next_after_acked(consumer.stream, consumer.name)
            if self.layout is ConsumerLayout.PARTITION:
                raise ConfigurationError(
                    f"partition consumer {consumer.name!r} on stream {consumer.stream!r} was "
                    "deleted while the query ran; a new one would read its partition again from "
                    "the start: delete and recreate the group to start over, then restart the "
                    f"query; or, to read nothing twice, {restart_at(start)}"
                )
            raise ConfigurationError(
                f"member consumer {consumer.name!r} of static group {self.options.group!r} on "
                f"stream {consumer.stream!r} was deleted while the query ran; a new one would "
                f"read the member's partitions again from the start: to read nothing twice, "
                f"{restart_at(start)}; or delete and recreate the group to start over"
            )
        log.info("recreating consumer %s > %s", consumer.stream, consumer.name)
        await ensure(client, consumer, self.seen)
