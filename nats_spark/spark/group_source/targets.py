"""What a query reads, resolved on the driver into slots (`slots.Slot`): a partitioned consumer
group (`group_target.GroupTarget`) or one existing priority-group pull consumer
(`consumer_target.ConsumerTarget`)."""

from __future__ import annotations

from nats_spark.spark.group_source.consumer_target import ConsumerTarget
from nats_spark.spark.group_source.group_target import GroupTarget
from nats_spark.spark.group_source.options import SourceOptions
from nats_spark.spark.group_source.slots import Held, Slot

__all__ = ["ConsumerTarget", "GroupTarget", "Held", "Slot", "target_for"]


def target_for(options: SourceOptions) -> GroupTarget | ConsumerTarget:
    return GroupTarget(options) if options.group else ConsumerTarget(options)
