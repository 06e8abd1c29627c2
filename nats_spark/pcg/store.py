"""Group configs in the KV buckets the Go library uses, read and written with compare-and-set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nats.errors import NoRespondersError
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
)
from nats.js.kv import KeyValue

from nats_spark.errors import ConfigurationError, NatsSparkError, NotFound
from nats_spark.jetstream.retry import retrying
from nats_spark.pcg.config import ElasticConfig, GroupConfigError, StaticConfig
from nats_spark.pcg.kinds import GroupKind

if TYPE_CHECKING:  # annotations only: parsing a format's options imports pcg, not the connection
    from nats_spark.client import NatsClient

GroupConfig = StaticConfig | ElasticConfig


class GroupNotFound(ConfigurationError):
    """No config for the group in the KV bucket(s)."""


class GroupChanged(NatsSparkError):
    """A compare-and-set update lost against a concurrent writer."""


def group_key(stream: str, group: str) -> str:
    return f"{stream}.{group}"


@dataclass(frozen=True)
class GroupEntry:
    """A group's config as stored, with the KV revision it was read at."""

    kind: GroupKind
    stream: str
    group: str
    config: GroupConfig
    revision: int

    @property
    def key(self) -> str:
        return group_key(self.stream, self.group)


async def _bucket(client: NatsClient, kind: GroupKind) -> KeyValue | None:
    try:
        return await client.js.key_value(kind.bucket)
    except BucketNotFoundError:
        return None


async def _read(client: NatsClient, kind: GroupKind, stream: str, group: str) -> GroupEntry | None:
    key = group_key(stream, group)

    async def read_once() -> KeyValue.Entry | None:
        kv = await _bucket(client, kind)
        if kv is None:
            return None
        try:
            return await kv.get(key)
        except KeyNotFoundError:  # also raised for a deleted key
            return None

    what = f"reading {kind.bucket}/{key}"
    entry = await retrying(read_once, what, client.settings.retry_timeout, connection=client.nc)
    if entry is None:
        return None
    where = f"{kind.bucket}/{key}"
    config = kind.config_type.from_json(entry.value or b"", key=where)
    try:
        config.validate()
    except GroupConfigError as error:
        raise error.at(f"group config for {where}") from None
    return GroupEntry(kind, stream, group, config, entry.revision or 0)


async def load_group(
    client: NatsClient, stream: str, group: str, kind: GroupKind | None = None
) -> GroupEntry:
    """The group's entry; with `kind=None` both buckets are searched."""
    kinds = [kind] if kind else list(GroupKind)
    found = [entry for k in kinds if (entry := await _read(client, k, stream, group)) is not None]
    if not found:
        where = " or ".join(k.bucket for k in kinds)
        raise GroupNotFound(
            f"consumer group {group!r} on stream {stream!r} not found in KV bucket {where}; "
            "create it first (nats-pcg static|elastic create ...) or check stream and group"
            f"{await _groups_there(client, stream)}"
        )
    if len(found) > 1:
        raise ConfigurationError(
            f"consumer group {group!r} on stream {stream!r} exists both as static and elastic "
            "group; set groupType to static or elastic"
        )
    return found[0]


async def _groups_there(client: NatsClient, stream: str) -> str:
    """The groups `stream` has, of both kinds, for the error that names a missing one."""
    try:
        named = [
            f"{name} ({kind.value})"
            for kind in GroupKind
            for name in await list_groups(client, kind, stream)
        ]
    except Exception:  # a user who may read a group but not list a bucket: the error without
        return ""
    listed = f"groups on {stream!r}: {', '.join(named)}" if named else f"{stream!r} has no groups"
    return f" ({listed})"


def _unanswered(error: BaseException) -> bool:
    """A write no stream answered was not stored (a new bucket's stream has no leader yet):
    safe to send again, unlike one that timed out."""
    return isinstance(error, (NoStreamResponseError, NoRespondersError))


async def create_group(
    client: NatsClient, kind: GroupKind, stream: str, group: str, config: GroupConfig
) -> GroupEntry:
    """Store a new group config; the bucket is made on first use with the stream's replicas."""
    config.validate()
    try:
        info = await client.api.stream_info(stream)
    except NotFound:
        raise GroupNotFound(f"stream {stream!r} does not exist; create it first") from None
    kv = await _bucket(client, kind)
    if kv is None:
        kv = await client.js.create_key_value(bucket=kind.bucket, replicas=info.replicas, history=1)
    key = group_key(stream, group)
    try:
        revision = await retrying(
            lambda: kv.create(key, config.to_json()),
            f"writing {kind.bucket}/{key}",
            client.settings.retry_timeout,
            _unanswered,
        )
    except KeyWrongLastSequenceError:
        raise ConfigurationError(
            f"{kind.value} consumer group {group!r} on stream {stream!r} already exists; "
            "delete it first or pick another name"
        ) from None
    return GroupEntry(kind, stream, group, config, revision)


async def update_group(client: NatsClient, entry: GroupEntry, config: GroupConfig) -> GroupEntry:
    """Replace the config if nobody wrote it since `entry` was read (compare-and-set)."""
    config.validate()
    kv = await _bucket(client, entry.kind)
    if kv is None:
        raise GroupNotFound(f"KV bucket {entry.kind.bucket} is gone; recreate the group")
    try:
        revision = await retrying(
            lambda: kv.update(entry.key, config.to_json(), last=entry.revision),
            f"writing {entry.kind.bucket}/{entry.key}",
            client.settings.retry_timeout,
            _unanswered,
        )
    except KeyWrongLastSequenceError:
        raise GroupChanged(
            f"consumer group {entry.group!r} changed while it was being updated; retry"
        ) from None
    return GroupEntry(entry.kind, entry.stream, entry.group, config, revision)


async def delete_group_entry(client: NatsClient, kind: GroupKind, stream: str, group: str) -> bool:
    """Delete the group's KV entry; False when there was none."""
    if await _read(client, kind, stream, group) is None:
        return False
    kv = await _bucket(client, kind)
    assert kv is not None
    await kv.delete(group_key(stream, group))
    return True


async def list_groups(client: NatsClient, kind: GroupKind, stream: str) -> list[str]:
    """Names of the stream's groups of `kind`, sorted."""
    kv = await _bucket(client, kind)
    if kv is None:
        return []
    # From the bucket stream's subject index: nats-py's `kv.keys()` can come back short.
    prefix = group_key(stream, "")
    groups = []
    for key in await client.api.kv_keys(kind.bucket, f"{prefix}>"):
        try:
            await kv.get(key)
        except KeyNotFoundError:  # deleted: its subject holds the delete marker
            continue
        groups.append(key[len(prefix) :])
    return sorted(groups)
