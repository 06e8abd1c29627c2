"""A plain pull consumer with a priority policy as a query reads it: checked (the source never
creates or changes one), then read by `numPartitions` slots."""

from __future__ import annotations

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, NotFound
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.pcg.kinds import ConsumerLayout
from nats_spark.spark.group_source.driver.consumer_checks import (
    NOTHING_KNOWN,
    SeenConsumers,
    Skipped,
)
from nats_spark.spark.group_source.driver.slots import Held, Slot
from nats_spark.spark.group_source.options import SourceOptions
from nats_spark.spark.group_source.slot_partition import Recreation


class ConsumerTarget:
    """One existing pull consumer with a priority policy, read by `numPartitions` slots."""

    layout: ConsumerLayout | None = None  # groups only
    warning: str | None = None

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.slots: list[Slot] | None = None
        self.seen = SeenConsumers()

    async def check(self, client: NatsClient) -> None:
        """The consumer exists and fits the options (reads only: the source never changes a
        plain consumer); the source checks its target with it at load()."""
        await self.resolve(client, Held())

    async def resolve(self, client: NatsClient, held: Held) -> list[Slot]:
        """The consumer, checked against the options once, as `numPartitions` slots."""
        if self.slots is None:
            options, name = self.options, self.options.consumer or ""
            info = await self._pull_consumer(client)
            self.seen.record(options.stream, name, info, placed=False)
            group = self._priority_group(info.config.get("priority_groups") or [])
            policy = info.config.get("priority_policy") or "none"
            self._check_policy(policy)
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

    async def _pull_consumer(self, client: NatsClient) -> ConsumerInfo:
        stream, name = self.options.stream, self.options.consumer or ""
        try:
            info = await client.api.consumer_info(stream, name)
        except NotFound:
            raise ConfigurationError(
                f"consumer {name!r} does not exist on stream {stream!r}; create it "
                "first (the source never creates or changes a plain consumer)"
            ) from None
        if info.config.get("deliver_subject"):
            raise ConfigurationError(
                f"consumer {name!r} is a push consumer; the source reads pull consumers only"
            )
        return info

    def _priority_group(self, groups: list[str]) -> str | None:
        """The consumer's priority group to read: the option's, else its only one."""
        name, group = self.options.consumer, self.options.priority_group
        if group is None and len(groups) > 1:
            raise ConfigurationError(
                f"consumer {name!r} has several priority groups {groups}; set the priorityGroup "
                "option to the one to read"
            )
        if group is None and groups:
            return groups[0]
        if groups and group not in groups:
            raise ConfigurationError(
                f"priority group {group!r} is not one of consumer {name!r}'s groups {groups}; "
                "fix the priorityGroup option"
            )
        if not groups and group:
            raise ConfigurationError(
                f"consumer {name!r} has no priority groups; drop the priorityGroup option"
            )
        return group

    def _check_policy(self, policy: str) -> None:
        """The options that need a priority policy are given only with it."""
        options, name = self.options, self.options.consumer
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

    def slot_named(self, name: str) -> Slot:
        assert self.slots is not None
        return next(slot for slot in self.slots if slot.name == name)

    def look(self, slot: Slot, info: ConsumerInfo, skipped: Skipped = NOTHING_KNOWN) -> None:
        """Check the consumer as planning sees it (its config, and that it is still the one
        the query read)."""
        self.seen.look(slot.stream, slot.consumer, info, self.recreation(slot), skipped)

    async def heal(self, client: NatsClient, slot: Slot) -> None:
        raise ConfigurationError(
            f"consumer {slot.consumer!r} on stream {slot.stream!r} was deleted while the query "
            f"ran; recreate it and restart the query; {self.recreation(slot)}"
        )

    def recreation(self, slot: Slot) -> Recreation:
        """How to go on when `slot`'s consumer was deleted and created again: the query refuses
        to read a plain consumer that starts over."""
        return Recreation(
            f"to read nothing twice, (re)create it with nats consumer add {slot.stream} "
            f"{slot.consumer} --deliver ",
            self.seen.next_after_acked(slot.stream, slot.consumer),
            " (its other settings as before): it starts right after the last message the query "
            "acked, or at the first one a batch not committed yet holds; then restart the query",
            self.seen.marks(slot.stream, slot.consumer),
        )
