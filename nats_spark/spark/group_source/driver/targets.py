"""What a query reads, resolved on the driver into slots (`slots.Slot`): a partitioned consumer
group (`group_target.GroupTarget`) or one existing priority-group pull consumer
(`consumer_target.ConsumerTarget`)."""

from __future__ import annotations

from nats_spark.spark.group_source.driver.consumer_target import ConsumerTarget
from nats_spark.spark.group_source.driver.group_target import GroupTarget
from nats_spark.spark.group_source.driver.slots import Held, Slot
from nats_spark.spark.group_source.options import SourceOptions

__all__ = ["ConsumerTarget", "GroupTarget", "Held", "Slot", "target_for"]


def target_for(options: SourceOptions) -> GroupTarget | ConsumerTarget:
    return GroupTarget(options) if options.group else ConsumerTarget(options)
