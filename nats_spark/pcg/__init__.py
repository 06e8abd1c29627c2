"""Partitioned consumer groups interoperable with the Go library `pcgroups` (orbit.go): configs,
partitioning, administration (`admin`) and members that consume (`consume`, as Go's
StaticConsume/ElasticConsume). docs/groups-api.md documents these names.

The names are imported on first use: parsing the `nats-pcg` format's options imports
`pcg.kinds`, and with it this package, in Spark processes that never connect, which would
otherwise import nats-py through the members and the admin."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats_spark.pcg import admin
    from nats_spark.pcg.config import (
        ElasticConfig,
        GroupConfigError,
        MemberMapping,
        PartitioningFilter,
        StaticConfig,
    )
    from nats_spark.pcg.kinds import GroupKind
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
    from nats_spark.pcg.store import GroupEntry

# Each public name and the module that defines it.
_HOMES = {
    "ElasticConfig": "config",
    "GroupConfigError": "config",
    "MemberMapping": "config",
    "PartitioningFilter": "config",
    "StaticConfig": "config",
    "GroupKind": "kinds",
    "GroupConfigChanged": "member",
    "GroupMember": "member",
    "consume": "member",
    "GroupMessage": "member_pulls",
    "elastic_stream_name": "partitioning",
    "elastic_subject_transforms": "partitioning",
    "generate_partition_filters": "partitioning",
    "member_filter_subjects": "partitioning",
    "member_partitions": "partitioning",
    "partition_for": "partitioning",
    "strip_partition": "partitioning",
    "GroupEntry": "store",
}

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


def __getattr__(name: str) -> Any:
    if name == "admin":
        return importlib.import_module(f"{__name__}.admin")
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


def __dir__() -> list[str]:
    return __all__
