"""Registers `nats-pcg` with Spark automatically: Spark looks up `DefaultSource` in every
top-level `pyspark_*` module at session start."""

from nats_spark.spark.group_source.source import NatsPcgDataSource as DefaultSource

__all__ = ["DefaultSource"]
