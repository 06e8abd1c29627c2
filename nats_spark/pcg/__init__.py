"""Partitioned consumer groups interoperable with the Go library `pcgroups` (orbit.go): configs,
partitioning, administration (`admin`) and members that consume (`consume`, as Go's
StaticConsume/ElasticConsume). docs/groups-api.md documents these names."""

from nats_spark.pcg import admin
from nats_spark.pcg.config import (
    ElasticConfig,
    GroupConfigError,
    MemberMapping,
    PartitioningFilter,
    StaticConfig,
)
from nats_spark.pcg.member import GroupConfigChanged, GroupMember, consume
from nats_spark.pcg.member_pulls import GroupMessage
from nats_spark.pcg.partitioning import (
    elastic_stream_name,
    elastic_subject_transforms,
    generate_partition_filters,
    member_filter_subjects,
    member_partitions,
    partition_for,
    strip_partition,
)
from nats_spark.pcg.store import GroupEntry, GroupKind

__all__ = [
    "ElasticConfig",
    "GroupConfigChanged",
    "GroupConfigError",
    "GroupEntry",
    "GroupKind",
    "GroupMember",
    "GroupMessage",
    "MemberMapping",
    "PartitioningFilter",
    "StaticConfig",
    "admin",
    "consume",
    "elastic_stream_name",
    "elastic_subject_transforms",
    "generate_partition_filters",
    "member_filter_subjects",
    "member_partitions",
    "partition_for",
    "strip_partition",
]
