"""The layout a query reads a group in, and the moves between them: consumers per partition or
per member (Go's), chosen once, then entered once the old consumers are quiet, each new consumer
starting where the old ones stopped."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, NotFound
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.pcg.admin import consumer_info_or_none
from nats_spark.pcg.consumers import (
    PARTITION_PREFIX,
    filters_of,
    member_consumer,
    partition_consumer,
    partition_consumer_name,
    read_stream,
)
from nats_spark.pcg.kinds import ConsumerLayout, GroupKind
from nats_spark.pcg.store import GroupEntry
from nats_spark.spark.group_source.driver.consumer_checks import SeenConsumers
from nats_spark.spark.group_source.driver.group_consumers import ensure, from_sequence
from nats_spark.spark.group_source.driver.slots import Held

log = logging.getLogger(__name__)

_MEMBER_LAYOUT_COST = (
    "the member layout (one multi-filter consumer per member) costs nats-server CPU per message "
    "that grows with the distinct subjects of a file-stored stream during catch-up (10-60x the "
    "partition layout's at 1,000-10,000 keys)"
)


class GroupLayouts:
    """A query's layout of one group: `choice` is the option's (None: auto), `wanted` the one
    it reads the group in once chosen, `layout` the one it reads now (they differ while
    moving); `template` the config overrides of the consumers it creates, `seen` where it
    records them."""

    def __init__(
        self, choice: ConsumerLayout | None, template: dict[str, Any], seen: SeenConsumers
    ) -> None:
        self.choice = choice
        self.template = template
        self.seen = seen
        self.wanted: ConsumerLayout | None = None
        self.layout: ConsumerLayout | None = None

    async def enter(
        self,
        client: NatsClient,
        entry: GroupEntry,
        owned: dict[str, list[int]],
        held: Held,
    ) -> ConsumerLayout:
        """Decide the layout on first use and move the group into it once its old consumers
        are quiet; refuse when another client reads the same messages in the other layout."""
        # Once entered, only the partition layout keeps watching for Go-layout members.
        entered = self.wanted is not None and self.layout is self.wanted
        watched = owned if not entered or self.wanted is ConsumerLayout.PARTITION else {}
        members = {
            m: await consumer_info_or_none(client, member_consumer(entry, m)) for m in watched
        }
        partitions = {
            p: await consumer_info_or_none(client, partition_consumer(entry, p))
            for ps in ([] if entered else owned.values())
            for p in ps
        }
        reading_members = self.layout is ConsumerLayout.MEMBER
        go_active = {
            m: why
            for m, info in members.items()
            if info is not None and (why := held.other_reader(m, info, reading_members))
        }
        if self.wanted is None:
            self.wanted = self.choose(entry, go_active, partitions)
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
                await self._to_partitions(client, entry, owned, members, partitions)
        elif self.layout is not ConsumerLayout.MEMBER:
            await self._to_members(client, entry, owned, partitions, held)
        assert self.layout is not None
        return self.layout

    def choose(
        self,
        entry: GroupEntry,
        go_active: dict[str, str],
        partitions: dict[int, ConsumerInfo | None],
    ) -> ConsumerLayout:
        """The option's layout; for `auto` the partition layout, unless Go-layout members are
        active on a group that has no partition consumers (then it says what that costs)."""
        if self.choice is not None:
            layout = self.choice
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

    async def _to_partitions(
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
                starts.update({p: info.delivered_seq + 1 for p in missing})
            else:
                # A work-queue stream keeps only unacked messages: the partition consumers
                # start where the member consumer left, once its overlapping filters are gone.
                with contextlib.suppress(NotFound):
                    await client.api.delete_consumer(read_stream(entry), member)
        template = self.template
        for p, start in sorted(starts.items()):
            log.info(
                "group %s: partition %d moves to its own consumer at %d", entry.group, p, start
            )
            consumer = partition_consumer(entry, p, template)
            await ensure(client, consumer, self.seen, from_sequence(start))
        self.layout = ConsumerLayout.PARTITION

    async def _to_members(
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
        template = self.template
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
                start = max(info.delivered_seq for info in infos.values()) + 1
                await self._check_caught_up(client, entry, infos, start)
                with contextlib.suppress(NotFound):  # its position is from before the move
                    await client.api.delete_consumer(consumer.stream, consumer.name)
            for p in infos:
                name = partition_consumer_name(entry, p)
                await client.api.delete_consumer(consumer.stream, name)
            log.info("group %s: member %s moves to its consumer at %d", entry.group, member, start)
            await ensure(client, consumer, self.seen, from_sequence(start))
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
                        entry.stream, info.delivered_seq + 1, next_by_subject=subject
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
