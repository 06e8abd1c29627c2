"""Administration of partitioned consumer groups, at parity with the Go library `pcgroups`.

Static groups: create, delete, list, info. Elastic groups: the same plus membership changes and
member mappings (compare-and-set on the KV revision). Both: active members, member info and
step-down, and resetting a member (deleting its consumer). Four defects of the Go library are not
copied: static delete removes only the durables of the group's own members, membership lists keep
a stable order, an elastic member counts as active only when its own consumer exists, and a static
member counts as active while its consumer holds messages ack-pending (as a partition-layout
query sees it), not only while pulls wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats_spark.errors import ConfigurationError, NotFound, ServerTooOld
from nats_spark.jetstream.replies import ConsumerInfo, StreamInfo
from nats_spark.pcg.config import ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig
from nats_spark.pcg.consumers import (
    PRIORITY_GROUP,
    GroupConsumer,
    member_consumer,
    partition_consumer,
    partition_consumer_name,
)
from nats_spark.pcg.partitioning import (
    elastic_stream_name,
    elastic_subject_transforms,
    member_partitions,
    partition_owner,
    partitioning_filters,
)
from nats_spark.pcg.store import (
    GroupChanged,
    GroupConfig,
    GroupEntry,
    GroupKind,
    GroupNotFound,
    create_group,
    delete_group_entry,
    list_groups,
    load_group,
    update_group,
)

if TYPE_CHECKING:  # annotations only: parsing a format's options imports pcg, not the connection
    from nats_spark.client import NatsClient

CAS_ATTEMPTS = 5


class StreamNotFound(GroupNotFound):
    """The stream a group lives on (or an elastic group's work-queue stream) does not exist."""


@dataclass(frozen=True)
class MemberInfo:
    """A member as the group config and the server see it; counts are None without a consumer."""

    member: str
    in_membership: bool
    active: bool
    pinned: bool
    partitions: list[int]
    stream: str
    consumer: str
    num_pending: int | None
    num_ack_pending: int | None
    num_waiting: int | None = None  # pull requests waiting: running instances, pinned or not
    last_active: str | None = None  # when the consumer last delivered a message

    @property
    def state(self) -> str:
        """`consumer_state`'s, or `no consumer`."""
        if self.num_pending is None:
            return "no consumer"
        return consumer_state(self.pinned, self.num_waiting or 0, self.num_ack_pending or 0)


def consumer_state(pinned: bool, waiting: int, ack_pending: int) -> str:
    """`pinned` (an instance holds the pin), `waiting` (pulls wait, no pin yet), `holding` (no
    instance pulls, but messages taken are neither acked nor redelivered yet: a reader between
    batches, or one that stopped without acking them) or `idle`."""
    if pinned:
        return "pinned"
    if waiting:
        return "waiting"
    return "holding" if ack_pending else "idle"


def membership(config: GroupConfig) -> list[str]:
    """The member names of a config: its member list, or the members of its mappings."""
    return list(config.members) or [m.member for m in config.member_mappings]


async def _stream_info(client: NatsClient, stream: str) -> StreamInfo:
    try:
        return await client.api.stream_info(stream)
    except NotFound:
        raise StreamNotFound(
            f"stream {stream!r} does not exist; create it first or check the name"
        ) from None


# --- Static groups ----------------------------------------------------------------------------


async def create_static(
    client: NatsClient,
    stream: str,
    group: str,
    max_members: int,
    members: Sequence[str] | None = None,
    member_mappings: Sequence[MemberMapping] | None = None,
    filters: Sequence[str] | None = None,
) -> GroupEntry:
    """Create a static group: balanced over `members`, or with explicit `member_mappings`.

    The stream must exist and store `<partition>.<subject>` (Go members expect the same).
    """
    config = StaticConfig(
        max_members=max_members,
        filters=list(filters or ()),
        members=list(members or ()),
        member_mappings=list(member_mappings or ()),
    )
    config.validate()  # before touching the server, so a bad config names itself first
    await _stream_info(client, stream)
    return await create_group(client, GroupKind.STATIC, stream, group, config)


async def delete_static(client: NatsClient, stream: str, group: str) -> list[str]:
    """Delete the group's KV entry, its members' durables and its partition consumers (the
    partition layout's); returns the consumers deleted.

    Only `<group>-<member>` of the config's members and `<group>-partition-<p>` go: another
    group whose name starts with `<group>-` keeps its consumers.
    """
    entry = await load_group(client, stream, group, GroupKind.STATIC)
    # The entry first: running members see the delete and stop before their durable vanishes.
    await delete_group_entry(client, GroupKind.STATIC, stream, group)
    names = [member_consumer(entry, member).name for member in membership(entry.config)]
    names += [partition_consumer_name(entry, p) for p in range(entry.config.max_members)]
    deleted = []
    for name in names:
        try:
            await client.api.delete_consumer(stream, name)
        except NotFound:
            continue  # never created, or the member already deleted it
        deleted.append(name)
    return deleted


async def list_static(client: NatsClient, stream: str) -> list[str]:
    """Names of the stream's static groups, sorted."""
    return await list_groups(client, GroupKind.STATIC, stream)


async def static_info(client: NatsClient, stream: str, group: str) -> GroupEntry:
    """The static group's stored config and KV revision."""
    return await load_group(client, stream, group, GroupKind.STATIC)


# --- Elastic groups ---------------------------------------------------------------------------


def work_queue_stream_config(
    stream: str, group: str, config: ElasticConfig, source_info: StreamInfo
) -> dict[str, Any]:
    """The config of the elastic group's work-queue stream, as the Go library creates it."""
    source = source_info.config
    return {
        "name": elastic_stream_name(stream, group),
        "retention": "workqueue",
        "num_replicas": source.get("num_replicas", 1),
        "storage": source.get("storage", "file"),
        # The server reads 0 as "no limit" too; -1 states it the way stream info reports it.
        "max_msgs": config.max_buffered_msgs if config.max_buffered_msgs > 0 else -1,
        "max_bytes": config.max_buffered_bytes if config.max_buffered_bytes > 0 else -1,
        "discard": "new",
        "sources": [{"name": stream, "subject_transforms": elastic_subject_transforms(config)}],
        "allow_direct": True,
    }


async def create_elastic(
    client: NatsClient,
    stream: str,
    group: str,
    max_members: int,
    partitioning_filters: Sequence[PartitioningFilter] | None,
    max_buffered_msgs: int = 0,
    max_buffered_bytes: int = 0,
) -> GroupEntry:
    """Create an elastic group (no members yet) and its work-queue stream `<stream>-<group>`.

    `partitioning_filters` None (stored as null) hashes every subject as a whole (server 2.12+).
    """
    config = ElasticConfig(
        max_members=max_members,
        partitioning_filters=None if partitioning_filters is None else list(partitioning_filters),
        max_buffered_msgs=max_buffered_msgs,
        max_buffered_bytes=max_buffered_bytes,
    )
    config.validate()
    _check_whole_subject_hashing(client, group, config)
    source_info = await _stream_info(client, stream)
    entry = await create_group(client, GroupKind.ELASTIC, stream, group, config)
    try:
        await client.api.create_stream(work_queue_stream_config(stream, group, config, source_info))
    except Exception:
        # No half-made group: without its stream, members could never join.
        await delete_group_entry(client, GroupKind.ELASTIC, stream, group)
        raise
    return entry


# The subject transform function that hashes a whole subject (`{{Partition(n)}}` without
# wildcard indexes) came with nats-server 2.12; 2.11 refuses the work-queue stream.
WHOLE_SUBJECT_HASHING = (2, 12, 0)


def _check_whole_subject_hashing(client: NatsClient, group: str, config: ElasticConfig) -> None:
    """Refuse, before anything is written, a group that hashes whole subjects on a server
    older than 2.12 (it refuses the group's stream with an error about the transform)."""
    whole = [pf.filter for pf in partitioning_filters(config) if not pf.partitioning_wildcards]
    if not whole or client.server_version >= WHOLE_SUBJECT_HASHING:
        return
    have = ".".join(map(str, client.server_version))
    raise ServerTooOld(
        f"elastic group {group!r} hashes whole subjects (filter {whole[0]!r} names no "
        f"partitioning wildcards), which needs nats-server 2.12 or newer; this one is {have}: "
        "give each filter the '*' tokens that pick the partition (--partition-wildcards), or "
        "upgrade the server"
    )


async def delete_elastic(client: NatsClient, stream: str, group: str) -> None:
    """Delete the group's KV entry (members stop) and its work-queue stream."""
    await load_group(client, stream, group, GroupKind.ELASTIC)
    await delete_group_entry(client, GroupKind.ELASTIC, stream, group)
    with contextlib.suppress(NotFound):  # already gone: deleting is what was asked
        await client.api.delete_stream(elastic_stream_name(stream, group))


async def list_elastic(client: NatsClient, stream: str) -> list[str]:
    """Names of the stream's elastic groups, sorted."""
    return await list_groups(client, GroupKind.ELASTIC, stream)


async def elastic_info(client: NatsClient, stream: str, group: str) -> GroupEntry:
    """The elastic group's stored config and KV revision."""
    return await load_group(client, stream, group, GroupKind.ELASTIC)


async def _update_elastic(
    client: NatsClient, stream: str, group: str, change: Callable[[GroupConfig], GroupConfig]
) -> GroupEntry:
    """Apply `change` to the current config with compare-and-set, retrying lost races."""
    attempt = 0
    while True:
        entry = await load_group(client, stream, group, GroupKind.ELASTIC)
        config = change(entry.config)
        if config.to_json() == entry.config.to_json():
            return entry  # nothing to write; a rewrite would only wake every member
        try:
            return await update_group(client, entry, config)
        except GroupChanged:
            attempt += 1
            if attempt >= CAS_ATTEMPTS:
                raise
            await asyncio.sleep(random.uniform(0.01, 0.05) * attempt)  # let the writer finish


async def add_members(
    client: NatsClient, stream: str, group: str, names: Iterable[str]
) -> GroupEntry:
    """Add members: the existing ones keep their order, new names follow in the order given."""
    names = list(names)
    return await _update_elastic(client, stream, group, lambda c: c.with_members_added(names))


async def drop_members(
    client: NatsClient, stream: str, group: str, names: Iterable[str]
) -> GroupEntry:
    """Drop members (names that are not members are ignored); the others keep their order."""
    names = list(names)
    return await _update_elastic(client, stream, group, lambda c: c.with_members_dropped(names))


async def set_mappings(
    client: NatsClient, stream: str, group: str, mappings: Iterable[MemberMapping]
) -> GroupEntry:
    """Replace the member list (or earlier mappings) with explicit member mappings."""
    mappings = list(mappings)
    return await _update_elastic(client, stream, group, lambda c: c.with_mappings(mappings))


async def delete_mappings(client: NatsClient, stream: str, group: str) -> GroupEntry:
    """Drop the member mappings; add members afterwards to spread the partitions again."""
    return await _update_elastic(client, stream, group, lambda c: c.without_mappings())


# --- Members of both kinds --------------------------------------------------------------------


async def consumer_info_or_none(client: NatsClient, consumer: GroupConsumer) -> ConsumerInfo | None:
    """The group consumer's info; None when it does not exist (the member is not running, or
    the layout has none). A missing stream is an error."""
    try:
        return await client.api.consumer_info(consumer.stream, consumer.name)
    except NotFound as error:
        if error.stream_missing:
            raise StreamNotFound(
                f"stream {consumer.stream!r} does not exist (deleted?); recreate it and the "
                "group (an elastic group's work-queue stream comes with `create`)"
            ) from None
        return None


def _is_active(kind: GroupKind, info: ConsumerInfo | None) -> bool:
    if info is None:
        return False
    if kind is GroupKind.ELASTIC:
        return True  # elastic consumers vanish after their inactive threshold
    # A static durable outlives its members: waiting pulls or a pin show one is running, and
    # messages ack-pending that one took them (a partition-layout query refuses beside either).
    return (
        info.num_waiting > 0
        or info.pinned_id(PRIORITY_GROUP) is not None
        or info.num_ack_pending > 0
    )


async def list_active_members(
    client: NatsClient, kind: GroupKind, stream: str, group: str
) -> list[str]:
    """Members of the group with a running instance, in membership order."""
    entry = await load_group(client, stream, group, kind)
    active = []
    for member in membership(entry.config):
        if _is_active(kind, await consumer_info_or_none(client, member_consumer(entry, member))):
            active.append(member)
    return active


async def member_info(
    client: NatsClient, kind: GroupKind, stream: str, group: str, member: str
) -> MemberInfo:
    """Whether `member` belongs to the group, runs, holds a pin, and what it owns and owes."""
    entry = await load_group(client, stream, group, kind)
    config = entry.config
    consumer = member_consumer(entry, member)
    info = await consumer_info_or_none(client, consumer)
    return MemberInfo(
        member=member,
        in_membership=member in membership(config),
        active=_is_active(kind, info),
        pinned=info is not None and info.pinned_id(PRIORITY_GROUP) is not None,
        partitions=member_partitions(
            config.members, config.max_members, config.member_mappings, member
        ),
        stream=consumer.stream,
        consumer=consumer.name,
        num_pending=None if info is None else info.num_pending,
        num_ack_pending=None if info is None else info.num_ack_pending,
        num_waiting=None if info is None else info.num_waiting,
        last_active=None if info is None else info.last_active,
    )


@dataclass(frozen=True)
class PartitionInfo:
    """A partition consumer of the partition layout, as the server sees it."""

    partition: int
    member: str | None  # the partition's owner
    stream: str
    consumer: str
    pinned: bool
    num_pending: int
    num_ack_pending: int
    num_waiting: int
    last_active: str | None

    @property
    def state(self) -> str:
        return consumer_state(self.pinned, self.num_waiting, self.num_ack_pending)


def group_lag(members: list[MemberInfo], partitions: list[PartitionInfo]) -> dict[str, dict]:
    """`pending` and `ackPending` in total and by member (`byMember`, as in the source's
    progress): over a member's partition consumers where the partition layout has some, else of
    its member consumer; members with neither are left out."""
    lag: dict[str, dict[str, int]] = {}
    for p in partitions:
        if p.member is not None:
            into = lag.setdefault(p.member, {"pending": 0, "ackPending": 0})
            into["pending"] += p.num_pending
            into["ackPending"] += p.num_ack_pending
    for m in members:
        if m.member not in lag and m.num_pending is not None:
            lag[m.member] = {"pending": m.num_pending, "ackPending": m.num_ack_pending or 0}
    total = {key: sum(counts[key] for counts in lag.values()) for key in ("pending", "ackPending")}
    return {"total": total, "byMember": dict(sorted(lag.items()))}


async def partition_status(client: NatsClient, entry: GroupEntry) -> list[PartitionInfo]:
    """The group's partition consumers that exist (a query reads it in the partition layout)."""
    infos = []
    for p in range(entry.config.max_members):
        consumer = partition_consumer(entry, p)
        info = await consumer_info_or_none(client, consumer)
        if info is None:
            continue
        infos.append(
            PartitionInfo(
                partition=p,
                member=partition_owner(entry.config, p),
                stream=consumer.stream,
                consumer=consumer.name,
                pinned=info.pinned_id(PRIORITY_GROUP) is not None,
                num_pending=info.num_pending,
                num_ack_pending=info.num_ack_pending,
                num_waiting=info.num_waiting,
                last_active=info.last_active,
            )
        )
    return infos


async def group_status(
    client: NatsClient, stream: str, group: str, kind: GroupKind | None = None
) -> tuple[GroupEntry, list[MemberInfo], list[PartitionInfo]]:
    """The group (either kind when `kind` is None), the state of each of its members and of
    its partition consumers (the partition layout's, where it has them)."""
    entry = await load_group(client, stream, group, kind)
    infos = [
        await member_info(client, entry.kind, stream, group, member)
        for member in membership(entry.config)
    ]
    return entry, infos, await partition_status(client, entry)


async def step_down(
    client: NatsClient, kind: GroupKind, stream: str, group: str, member: str
) -> None:
    """Unpin the member's running instance, so the server pins another waiting instance."""
    entry = await load_group(client, stream, group, kind)
    consumer = member_consumer(entry, member)
    try:
        await client.api.unpin(consumer.stream, consumer.name, PRIORITY_GROUP)
    except NotFound:
        raise ConfigurationError(
            f"member {member!r} of {kind.value} group {group!r} has no consumer "
            f"{consumer.name!r} on stream {consumer.stream!r}; start the member first"
        ) from None


async def reset_member(
    client: NatsClient, kind: GroupKind, stream: str, group: str, member: str, force: bool = False
) -> MemberInfo:
    """Delete the member's consumer, e.g. one a stopped instance left holding messages
    ack-pending beside a partition-layout query; returns its state before. Refused while an
    instance holds its pin or pulls from it, unless `force`. Its next instance creates it anew:
    a static member then reads its partitions from the stream's first message."""
    info = await member_info(client, kind, stream, group, member)
    where = f"consumer {info.stream} > {info.consumer} of member {member!r} of group {group!r}"
    if info.num_pending is None:
        raise ConfigurationError(f"{where} does not exist; nothing to reset")
    if not force and (info.pinned or info.num_waiting):
        running = "holds its pin" if info.pinned else f"has {info.num_waiting} pull(s) waiting"
        raise ConfigurationError(
            f"{where} is in use: an instance {running}; stop that instance first, or force the "
            "reset (--force)"
        )
    with contextlib.suppress(NotFound):  # gone meanwhile: what was asked
        await client.api.delete_consumer(info.stream, info.consumer)
    return info


async def partition_layout_consumers(
    client: NatsClient, entry: GroupEntry, member: str
) -> list[str]:
    """The partition layout's consumers of `member`'s partitions that exist: a nats-spark query
    reads those partitions per partition (or did, and goes on from them when it restarts)."""
    config = entry.config
    owned = member_partitions(config.members, config.max_members, config.member_mappings, member)
    names = []
    for p in owned:
        consumer = partition_consumer(entry, p)
        if await consumer_info_or_none(client, consumer) is not None:
            names.append(consumer.name)
    return names
