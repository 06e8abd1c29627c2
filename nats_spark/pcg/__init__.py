"""Partitioned consumer groups interoperable with the Go library `pcgroups` (orbit.go)."""

from nats_spark.pcg.config import (
    ElasticConfig,
    GroupConfigError,
    MemberMapping,
    PartitioningFilter,
    StaticConfig,
)
from nats_spark.pcg.partitioning import (
    elastic_stream_name,
    elastic_subject_transforms,
    generate_partition_filters,
    member_filter_subjects,
    member_partitions,
    partition_for,
    strip_partition,
)

__all__ = [
    "ElasticConfig",
    "GroupConfigError",
    "MemberMapping",
    "PartitioningFilter",
    "StaticConfig",
    "elastic_stream_name",
    "elastic_subject_transforms",
    "generate_partition_filters",
    "member_filter_subjects",
    "member_partitions",
    "partition_for",
    "strip_partition",
]
