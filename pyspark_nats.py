"""Registers `nats` with Spark automatically: Spark looks up `DefaultSource` in every top-level
`pyspark_*` module at session start."""

from nats_spark.spark.nats_format import NatsDataSource as DefaultSource

__all__ = ["DefaultSource"]
