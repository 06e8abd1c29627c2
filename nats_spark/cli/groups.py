"""The commands on whole groups: create, list, show, delete, and an elastic group's membership
and mappings; the argument types they parse."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nats_spark.cli.output import fields, limit, numbers, print_json, table, yes
from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError
from nats_spark.pcg import admin
from nats_spark.pcg.config import ElasticConfig, MemberMapping, PartitioningFilter
from nats_spark.pcg.kinds import GroupKind
from nats_spark.pcg.partitioning import elastic_stream_name, member_partitions
from nats_spark.pcg.store import GroupEntry

ELASTIC_CREATE_HELP = """\
Partitioning: give one --partition-wildcards per --filter, in the same order, or none at all.
--partition-wildcards takes the 1-based indexes of the filter's '*' tokens whose values pick
the partition (e.g. --filter 'orders.*.*' --partition-wildcards 1,2); an empty value ('')
hashes the whole subject for that filter. Without --partition-wildcards every filter hashes
whole subjects, and without --filter the group takes every subject of the stream ('>'),
hashed whole. Hashing whole subjects needs nats-server 2.12 or newer.
"""


def member_mapping(text: str) -> MemberMapping:
    """`member:p1,p2,...` as a member mapping."""
    member, sep, partitions = text.partition(":")
    try:
        numbers = [int(p) for p in partitions.split(",")]
    except ValueError:
        numbers = []
    if not (sep and member and numbers):
        raise argparse.ArgumentTypeError(
            f"invalid member mapping {text!r}: use <member>:<partition>,<partition>... "
            "such as m1:0,1,2"
        )
    return MemberMapping(member, numbers)


def wildcard_indexes(text: str) -> list[int]:
    """`1,2` as wildcard indexes; an empty string for none."""
    try:
        return [int(i) for i in text.split(",")] if text.strip() else []
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid wildcard indexes {text!r}: use comma-separated numbers such as 1,2"
        ) from None


def partitioning_filters(
    filters: list[str] | None, wildcards: list[list[int]] | None
) -> list[PartitioningFilter] | None:
    if not filters:
        if wildcards:
            raise ConfigurationError(
                "--partition-wildcards given without --filter; add the --filter it belongs to"
            )
        return None
    if wildcards is None:
        wildcards = [[] for _ in filters]
    if len(wildcards) != len(filters):
        raise ConfigurationError(
            f"{len(filters)} --filter but {len(wildcards)} --partition-wildcards given; give one "
            "--partition-wildcards per --filter in the same order, or none at all"
        )
    # No indexes are stored as null, Go's nil: hash the whole subject.
    return [PartitioningFilter(f, w or None) for f, w in zip(filters, wildcards, strict=True)]


def kind_of(args: argparse.Namespace) -> GroupKind:
    return GroupKind(args.kind)


async def ls(client: NatsClient, args: argparse.Namespace) -> int:
    kind = kind_of(args)
    lister = admin.list_static if kind is GroupKind.STATIC else admin.list_elastic
    groups = await lister(client, args.stream)
    if args.json:
        print_json({"kind": kind.value, "stream": args.stream, "groups": groups})
    elif groups:
        print("\n".join(groups))
    else:
        print(f"no {kind.value} consumer groups on stream {args.stream}")
    return 0


def _config_fields(entry: GroupEntry) -> list[tuple[str, Any]]:
    config = entry.config
    pairs: list[tuple[str, Any]] = [("partitions", config.max_members)]
    if isinstance(config, ElasticConfig):
        filters = config.partitioning_filters or [PartitioningFilter(">")]
        pairs += [
            (
                "filter",
                f"{pf.filter} (partition by wildcards {numbers(pf.partitioning_wildcards)})"
                if pf.partitioning_wildcards
                else f"{pf.filter} (partition by whole subject)",
            )
            for pf in filters
        ]
        pairs += [
            ("work-queue stream", elastic_stream_name(entry.stream, entry.group)),
            ("max buffered msgs", limit(config.max_buffered_msgs)),
            ("max buffered bytes", limit(config.max_buffered_bytes)),
        ]
    else:
        pairs.append(("filters", ", ".join(config.filters) or "> (all)"))
    mode = "mapped" if config.member_mappings else "balanced" if config.members else "no members"
    return [*pairs, ("membership", mode), ("KV revision", entry.revision)]


async def info(client: NatsClient, args: argparse.Namespace) -> int:
    kind = kind_of(args)
    loader = admin.static_info if kind is GroupKind.STATIC else admin.elastic_info
    entry = await loader(client, args.stream, args.group)
    active = set(await admin.list_active_members(client, kind, args.stream, args.group))
    config = entry.config
    owned = {
        member: member_partitions(
            config.members, config.max_members, config.member_mappings, member
        )
        for member in admin.membership(config)
    }
    members = [
        {"member": member, "partitions": partitions, "active": member in active}
        for member, partitions in owned.items()
    ]
    if args.json:
        document: dict[str, Any] = {
            "kind": kind.value,
            "stream": entry.stream,
            "group": entry.group,
            "revision": entry.revision,
            "config": json.loads(config.to_json()),
            "members": members,
        }
        if kind is GroupKind.ELASTIC:
            document["work_queue_stream"] = elastic_stream_name(entry.stream, entry.group)
        print_json(document)
        return 0
    print(f"{kind.value.capitalize()} consumer group {entry.group} on stream {entry.stream}")
    print()
    print(fields(_config_fields(entry)))
    if members:
        print()
        rows = [
            (member, numbers(partitions), yes(member in active))
            for member, partitions in owned.items()
        ]
        print(table(("MEMBER", "PARTITIONS", "ACTIVE"), rows))
    return 0


async def create_static(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.create_static(
        client,
        args.stream,
        args.group,
        args.max_members,
        members=getattr(args, "members", None),  # balanced
        member_mappings=getattr(args, "mappings", None),  # mapped
        filters=args.filter,
    )
    print(f"created static consumer group {entry.group} on stream {entry.stream}")
    return 0


async def create_elastic(client: NatsClient, args: argparse.Namespace) -> int:
    filters = partitioning_filters(args.filter, args.partition_wildcards)
    entry = await admin.create_elastic(
        client,
        args.stream,
        args.group,
        args.max_members,
        filters,
        max_buffered_msgs=args.max_buffered_msgs,
        max_buffered_bytes=args.max_buffered_bytes,
    )
    print(
        f"created elastic consumer group {entry.group} on stream {entry.stream} "
        f"(work-queue stream {elastic_stream_name(entry.stream, entry.group)})"
    )
    return 0


async def delete(client: NatsClient, args: argparse.Namespace) -> int:
    if kind_of(args) is GroupKind.STATIC:
        consumers = await admin.delete_static(client, args.stream, args.group)
        detail = f"; deleted consumers: {', '.join(consumers)}" if consumers else ""
    else:
        await admin.delete_elastic(client, args.stream, args.group)
        detail = f"; deleted stream {elastic_stream_name(args.stream, args.group)}"
    print(f"deleted {args.kind} consumer group {args.group} on stream {args.stream}{detail}")
    return 0


async def add(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.add_members(client, args.stream, args.group, args.members)
    print(f"members of {entry.group}: {', '.join(entry.config.members)}")
    return 0


async def drop(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.drop_members(client, args.stream, args.group, args.members)
    print(f"members of {entry.group}: {', '.join(entry.config.members) or '(none)'}")
    return 0


async def create_mapping(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.set_mappings(client, args.stream, args.group, args.mappings)
    rows = [(m.member, numbers(m.partitions)) for m in entry.config.member_mappings]
    print(f"member mappings of {entry.group} set")
    print(table(("MEMBER", "PARTITIONS"), rows))
    return 0


async def delete_mapping(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.delete_mappings(client, args.stream, args.group)
    print(f"member mappings of {entry.group} deleted; add members to assign the partitions")
    return 0
