"""Which partitions a member owns, the subjects it consumes, and how the server numbers partitions.

The rules are the Go library's (`pcgroups`), so that our members and Go members of one group
agree on who consumes what and create identical consumer configs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nats_spark.pcg.config import ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig

MappingLike = MemberMapping | Mapping[str, Any]
"""A `MemberMapping`, or its JSON shape `{"member": ..., "partitions": [...]}`."""

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


def _assignment(
    members: Sequence[str] | None,
    max_members: int,
    member_mappings: Iterable[MappingLike] | None,
    member: str,
) -> tuple[list[int], bool]:
    """The member's partitions, and whether they come from explicit mappings."""
    # As in Go, a member list wins over mappings; a valid config never has both.
    if members:
        # Python orders str by code point, which is the UTF-8 byte order Go sorts by.
        ranked = sorted(set(members))[: max(max_members, 0)]
        if member not in ranked:
            return [], False
        index, count = ranked.index(member), len(ranked)
        per_member, spare = divmod(max_members, count)
        owned = list(range(index * per_member, (index + 1) * per_member))
        if index < spare:  # the spare partitions at the end go one each to the first members
            owned.append(count * per_member + index)
        return owned, False
    owned = []
    for mapping in member_mappings or ():
        if isinstance(mapping, MemberMapping):
            name, partitions = mapping.member, mapping.partitions
        else:
            name, partitions = mapping["member"], mapping["partitions"]
        if name == member:
            owned.extend(partitions or ())
    return owned, True


def member_partitions(
    members: Sequence[str] | None,
    max_members: int,
    member_mappings: Iterable[MappingLike] | None,
    member: str,
) -> list[int]:
    """The partition numbers `member` owns; [] when it is not in the group.

    With a member list (balanced mode): the distinct names sorted, the first `max_members` kept;
    each gets `max_members // n` contiguous partitions in that order, and the remaining
    `max_members % n` go one each to the first members. Otherwise the member's mapped partitions.
    """
    return _assignment(members, max_members, member_mappings, member)[0]


def generate_partition_filters(
    members: Sequence[str] | None,
    max_members: int,
    member_mappings: Iterable[MappingLike] | None,
    member: str,
    filter: str,
) -> list[str]:
    """The member's filter subjects for one group filter: `<p>.<filter>` per owned partition.

    For mapped members it is `<p>.>` whatever the filter, as the Go library writes it.
    """
    owned, mapped = _assignment(members, max_members, member_mappings, member)
    suffix = ">" if mapped else filter
    return [f"{p}.{suffix}" for p in owned]


def member_filter_subjects(config: StaticConfig | ElasticConfig, member: str) -> list[str]:
    """All filter subjects of the member's consumer: filters outer, partitions inner.

    A group without filters filters on `>`. The result is Go's list exactly (repeats included),
    since Go members recreate a member consumer whose config differs from theirs.
    """
    if isinstance(config, ElasticConfig):
        filters = [pf.filter for pf in config.partitioning_filters or ()]
    else:
        filters = list(config.filters)
    return [
        subject
        for group_filter in filters or [">"]
        for subject in generate_partition_filters(
            config.members, config.max_members, config.member_mappings, member, group_filter
        )
    ]


def partition_owner(config: StaticConfig | ElasticConfig, partition: int) -> str | None:
    """The member that owns `partition` (None when no member does: too few members)."""
    names = list(config.members) or [m.member for m in config.member_mappings]
    for member in dict.fromkeys(names):
        if partition in member_partitions(
            config.members, config.max_members, config.member_mappings, member
        ):
            return member
    return None


def partition_filter_subjects(config: StaticConfig | ElasticConfig, partition: int) -> list[str]:
    """The filters of one partition: those of its owner's member filters that select it, so
    that reading every partition alone takes exactly what the member consumers would."""
    owner = partition_owner(config, partition)
    prefix = f"{partition}."
    if owner is None:
        return []
    return [s for s in member_filter_subjects(config, owner) if s.startswith(prefix)]


def elastic_stream_name(stream: str, group: str) -> str:
    """The work-queue stream an elastic group's members consume from."""
    return f"{stream}-{group}"


def partitioning_filters(config: ElasticConfig) -> list[PartitioningFilter]:
    """The elastic group's partitioning filters; without any, `>` hashed as a whole subject."""
    return config.partitioning_filters or [PartitioningFilter(">", [])]


def elastic_subject_transforms(config: ElasticConfig) -> list[dict[str, str]]:
    """The source subject transforms (`src`/`dest`) of the elastic group's work-queue stream:
    one per partitioning filter (`partitioning_filters`)."""
    return [
        {"src": pf.filter, "dest": _transform_dest(pf, config.max_members)}
        for pf in partitioning_filters(config)
    ]


def _transform_dest(pf: PartitioningFilter, partitions: int) -> str:
    wildcard_numbers = itertools.count(1)
    tokens = [
        f"{{{{Wildcard({next(wildcard_numbers)})}}}}" if token == "*" else token
        for token in pf.filter.split(".")
    ]
    arguments = ",".join(map(str, [partitions, *(pf.partitioning_wildcards or ())]))
    return f"{{{{Partition({arguments})}}}}." + ".".join(tokens)


def strip_partition(subject: str) -> tuple[int, str]:
    """Split a group message's subject `<partition>.<subject>` into its two parts."""
    head, dot, rest = subject.partition(".")
    if not (dot and head.isascii() and head.isdigit()):
        raise ValueError(
            f"subject {subject!r} has no partition token; the stream must store "
            "'<partition>.<subject>' (add a subject transform with {{partition(N,...)}})"
        )
    return int(head), rest


def partition_for(tokens: Sequence[str] | str, partitions: int) -> int:
    """The partition the server's `{{partition(N, ...)}}` transform gives a subject.

    `tokens` are the selected wildcard tokens, hashed concatenated without separator; a str is
    hashed as it is (pass the whole subject for `{{partition(N)}}`). The hash is 32-bit FNV-1a
    of the UTF-8 bytes, taken modulo `partitions`.
    """
    if partitions < 1:
        raise ValueError(f"partitions is {partitions}; give the number of partitions, 1 or more")
    key = tokens if isinstance(tokens, str) else "".join(tokens)
    digest = _FNV32_OFFSET
    for byte in key.encode("utf-8"):
        digest = ((digest ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return digest % partitions
