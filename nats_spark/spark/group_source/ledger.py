"""The write-ahead ack ledger's storage: what each task took from NATS, in a JetStream KV bucket.

An entry per (lineage, gen, slot): what one slot (one input partition of a batch: a group
partition, a member, or one reader of a plain consumer) took in one batch. This module is its
keys and bytes; what an entry's states mean, who moves an entry on and what the driver
concludes from it is `ledger_protocol`, the only reader and writer of heads. Keys:

- `<lineage>.<gen>.<slot>`: the head, JSON (format, state, attempt, chunk keys, count, pin,
  max_seq, prefix: the ack subject up to the delivery count, `$JS.ACK.<stream>.<consumer>` or the
  v2 form with domain and account hash, as the server sent it)
- `<lineage>.<gen>.<slot>.<attempt>.<n>`: chunks of deliveries, in delivery order: their count (4
  bytes, little endian), then zstd of three columns of signed 64-bit integers: stream sequence
  and consumer sequence each as the difference to the one before, and the delivery count. In-order
  deliveries repeat one pattern, which zstd stores in a few bytes per thousand messages; format 1
  chunks held the reply subjects themselves (about 73 bytes each) and are still read.
- `query.<stream>.<target>`: the newest lineage and gen handed out for a target, so a restarted
  driver on Spark 4.0/4.1 (whose `latestOffset` gets no start offset) can go on numbering, the
  pins the query's slots hold, so a restarted query resumes them instead of standing by, and
  the newest gen whose entries the driver removed as settled (written before it removes them),
  which fences a task attempt of a committed batch that outlived it, the driver that wrote it,
  and each consumer the query reads as its driver last saw it (created, ack floor), so a restarted
  driver tells a consumer created again while no query ran from the one the query read
- `query.<stream>.<target>.live.<driver>`: a running driver's presence record, written every
  few seconds and removed at stop (`driver.presence`): a stale one is a dead driver's

An ack subject is rebuilt from the prefix and the numbers (nats-server reads only the delivery
count, stream and consumer sequence of an ack subject, and matches explicit acks by stream
sequence). A delivery's timestamp is not stored: a replay reads the message back from the stream,
which holds the same time.

Heads and pointers carry `format` (`LEDGER_FORMAT`; absent in entries written before it existed,
which are format 1). A release that changes what they hold raises the number, reads the formats
it knows and refuses newer ones with one line, since a misread entry would ack the wrong messages.

Settled entries are removed with a stream purge by subject, which leaves no purge marker behind
(a KV purge keeps one per key).

The bucket has no max age: a max age applies to every key by its last write, the pointer and the
sealed entries of a stopped query included, which a restart needs however long the query was
stopped. The protocol removes what it no longer needs itself. A bucket made with a max age (by
the previous release, 7 days, or by an operator) loses it when a driver opens it
(`keep_entries`).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from nats.errors import NoRespondersError
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
)
from nats.js.kv import KeyValue

from nats_spark import __version__
from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, NatsSparkError, NotFound
from nats_spark.jetstream.retry import is_transient, retrying
from nats_spark.spark.group_source.entry_deliveries import (
    CHUNK_MESSAGES,
    EntryDeliveries,
    encode_chunk,
)

log = logging.getLogger(__name__)

_KEY_TOKEN = re.compile(r"^[-_=a-zA-Z0-9]+$")
LEDGER_FORMAT = 2
READABLE_FORMATS = (1, 2)
# Lineages given back that a target's pointer keeps: a task attempt of one that creates its
# entry after the give-back finds its lineage here, and removes the entry (`Pointer.retired`).
RETIRED_KEPT = 16  # 1: chunks of reply subjects, heads without `prefix`
T = TypeVar("T")
StoredValue = KeyValue.Entry  # a key's value and revision, as nats-py reads it


@functools.lru_cache(maxsize=4096)  # a query's few slot names, on every key it reads or writes
def key_token(name: str) -> str:
    """A KV key token for `name`: itself when safe, else `_` and its UTF-8 in hex."""
    if _KEY_TOKEN.match(name) and not name.startswith("_"):
        return name
    return "_" + name.encode().hex()


def name_of(token: str) -> str:
    """The name `key_token` made `token` from."""
    return bytes.fromhex(token[1:]).decode() if token.startswith("_") else token


def readable_format(raw: dict[str, Any], key: str) -> int:
    """The format of `raw` (a stored head or pointer), once it is known to be one this release
    reads."""
    found = raw.get("format", 1)
    if found not in READABLE_FORMATS:
        raise ConfigurationError(
            f"ack ledger entry {key} has format {found!r} but nats-spark {__version__} reads "
            f"formats {', '.join(map(str, READABLE_FORMATS))}: run the release that wrote it, or "
            "start the query with a new checkpoint location"
        )
    return int(found)


class Bucket(Protocol):
    """What the ledger uses of a KV bucket (`LedgerBucket` on a server). `create` and `update`
    raise `KeyWrongLastSequenceError` when the key exists, or when its revision is not `last`;
    `get` raises `KeyNotFoundError` as nats-py does. `keys_matching` lists the keys that match
    a pattern of key tokens (`*` one token) from the bucket stream's subject index, completely:
    nats-py's `keys()` can end early or come back empty while keys exist, and the ledger never
    rests a decision on it."""

    name: str

    async def get(self, key: str) -> StoredValue: ...

    async def create(self, key: str, value: bytes) -> int: ...

    async def update(self, key: str, value: bytes, last: int) -> int: ...

    async def put(self, key: str, value: bytes) -> int: ...

    async def remove(self, key: str) -> None: ...

    async def keys_matching(self, pattern: str) -> list[str]: ...

    async def max_age(self) -> float:
        """Seconds after its last write that the server removes a key (0: never)."""
        ...

    async def clear_max_age(self) -> None:
        """Remove the bucket's max age: its keys stay until removed."""
        ...


class LedgerBucket:
    """The ledger's KV bucket, its calls retried while the bucket's stream has no leader.

    A write to a stream without a leader finds no responder, just like a write to a deleted
    bucket: the bucket's existence tells the two apart.
    """

    def __init__(self, kv: KeyValue, client: NatsClient, name: str) -> None:
        self.kv = kv
        self.client = client
        self.name = name

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        async def once() -> T:
            try:
                return await call()
            except (NoStreamResponseError, NoRespondersError):
                try:
                    await self.client.api.stream_info(f"KV_{self.name}")
                except NotFound:
                    raise _missing(self.name) from None
                raise _Leaderless from None

        return await retrying(
            once,
            f"{what} in ack ledger bucket {self.name!r}",
            self.client.settings.retry_timeout,
            lambda error: isinstance(error, _Leaderless) or is_transient(error),
            connection=self.client.nc,
        )

    async def get(self, key: str) -> StoredValue:
        return await self._call(f"reading {key}", lambda: self.kv.get(key))

    async def create(self, key: str, value: bytes) -> int:
        return await self._call(f"creating {key}", lambda: self.kv.create(key, value))

    async def update(self, key: str, value: bytes, last: int) -> int:
        return await self._call(f"updating {key}", lambda: self.kv.update(key, value, last=last))

    async def put(self, key: str, value: bytes) -> int:
        return await self._call(f"writing {key}", lambda: self.kv.put(key, value))

    async def remove(self, key: str) -> None:
        """Remove `key` and every key below it (`<key>.>`) from the bucket's stream, leaving
        nothing behind (a KV purge would leave a marker per key)."""
        stream = f"KV_{self.name}"
        for subject in (f"$KV.{self.name}.{key}", f"$KV.{self.name}.{key}.>"):
            await self.client.api.request(f"STREAM.PURGE.{stream}", {"filter": subject})

    async def keys_matching(self, pattern: str) -> list[str]:
        return await self.client.api.kv_keys(self.name, pattern)

    async def max_age(self) -> float:
        return (await self.client.api.stream_info(f"KV_{self.name}")).max_age

    async def clear_max_age(self) -> None:
        """A stream update of the bucket's stream (nats-server allows changing a stream's max
        age; the rest of its configuration is sent back as it is)."""
        info = await self.client.api.stream_info(f"KV_{self.name}")
        await self.client.api.update_stream({**info.config, "max_age": 0})


class _Leaderless(NatsSparkError):
    """The ledger bucket exists but its stream did not answer a write."""


def _missing(name: str) -> ConfigurationError:
    return ConfigurationError(
        f"ack ledger bucket {name!r} does not exist (deleted while the query ran?); restart the "
        "query so the driver recreates it"
    )


class Ledger:
    """One query lineage's entries in the ledger bucket."""

    def __init__(self, kv: Bucket, lineage: str) -> None:
        self.kv = kv
        self.lineage = lineage

    @staticmethod
    async def bucket(
        client: NatsClient, name: str, create: bool, replicas: int = 1
    ) -> LedgerBucket:
        """The ledger bucket; the driver creates it, executors only open it."""

        async def open_or_create() -> KeyValue:
            try:
                return await client.js.key_value(name)
            except BucketNotFoundError:
                if not create:
                    raise _missing(name) from None
            return await client.js.create_key_value(bucket=name, history=1, replicas=replicas)

        kv = await retrying(
            open_or_create, f"opening ack ledger bucket {name!r}", client.settings.retry_timeout
        )
        return LedgerBucket(kv, client, name)

    def head_key(self, gen: int, slot: str) -> str:
        return f"{self.lineage}.{gen}.{key_token(slot)}"

    async def get_head(self, gen: int, slot: str) -> StoredValue | None:
        """The stored head of the entry (None: there is none); `ledger_protocol` reads it."""
        try:
            return await self.kv.get(self.head_key(gen, slot))
        except KeyNotFoundError:
            return None

    async def create_head(self, gen: int, slot: str, value: bytes) -> int | None:
        """Create the head; None when it exists already (another attempt was first)."""
        try:
            return await self.kv.create(self.head_key(gen, slot), value)
        except KeyWrongLastSequenceError:
            return None

    async def update_head(self, gen: int, slot: str, value: bytes, revision: int) -> int | None:
        """Compare-and-set the head; None when its revision is no longer `revision`."""
        try:
            return await self.kv.update(self.head_key(gen, slot), value, last=revision)
        except KeyWrongLastSequenceError:
            return None

    async def write_chunks(
        self, gen: int, slot: str, attempt: str, first: int, taken: EntryDeliveries
    ) -> list[str]:
        """Store `taken` as chunks `first`, `first` + 1, ... of `attempt`; returns their keys."""
        keys: list[str] = []
        for start in range(0, len(taken), CHUNK_MESSAGES):
            key = f"{self.head_key(gen, slot)}.{attempt}.{first + len(keys)}"
            await self.kv.put(key, encode_chunk(taken.part(start, start + CHUNK_MESSAGES)))
            keys.append(key)
        return keys

    async def read_chunk(self, key: str) -> bytes:
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            raise NatsSparkError(
                f"ack ledger chunk {key} is missing (bucket purged or expired?); the batch "
                "cannot be replayed exactly: restart the query with a new checkpoint"
            ) from None
        return entry.value or b""

    async def heads(self) -> list[tuple[int, str]]:
        """(gen, slot name) of every entry of this lineage (a head's key has three tokens, its
        chunks' five)."""
        keys = await self.kv.keys_matching(f"{self.lineage}.*.*")
        split = (key.split(".") for key in keys)
        return sorted((int(gen), name_of(token)) for _, gen, token in split)

    async def delete_entry(self, gen: int, slot: str) -> None:
        """Remove the entry: its head and the chunks of every attempt."""
        await self.kv.remove(self.head_key(gen, slot))

    async def remove_chunks(self, keys: Iterable[str]) -> None:
        for key in keys:
            await self.kv.remove(key)


async def keep_entries(kv: Bucket) -> None:
    """Before a driver plans on the bucket: remove its max age, which would expire the entries
    and the pointer of a query stopped longer than it (a restart would emit the messages of its
    last committed batch again); refuse, with the fix, where the user may not."""
    age = await kv.max_age()
    if not age:
        return
    try:
        await kv.clear_max_age()
    except NatsSparkError as error:
        stream = f"KV_{kv.name}"
        raise ConfigurationError(
            f"ack ledger bucket {kv.name!r} has a max age of {age:g} s, which would expire "
            f"entries a stopped query needs to restart exactly once, and removing it failed "
            f"({error}); allow the user to publish to $JS.API.STREAM.UPDATE.{stream}, or "
            f"remove it: nats stream edit {stream} --max-age=0"
        ) from None
    log.info("ack ledger bucket %r: removed its max age of %g s", kv.name, age)


def pointer_key(stream: str, target: str) -> str:
    return f"query.{key_token(stream)}.{key_token(target)}"


@dataclass
class Pointer:
    """A target's newest lineage and gen, the pins its slots last held, the newest gen of the
    lineage with an entry removed as settled (a task attempt of that gen or an older one is a
    zombie of a committed batch and must not create its entry again), the lineages of
    earlier checkpoints' queries that the next batch planned gives back (kept here until then,
    so that a driver killed before that batch does not forget them), and the newest
    `RETIRED_KEPT` lineages given back (a task attempt of one that outlived the give-back and
    creates an entry removes it: with no max age on the bucket, nothing else would), and the
    driver that wrote it, whose presence record tells whether its pins are a live query's, and
    by stream and name the [created, ack floor] of each consumer the query reads, as its driver
    last saw them (`SeenConsumers.stored`; absent in an older release's pointer)."""

    lineage: str
    gen: int
    pins: dict[str, str] = field(default_factory=dict)
    settled: int = 0
    replaced: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    driver: str | None = None  # the driver that wrote it (`presence`); None: an older release's
    consumers: dict[str, dict[str, list[Any]]] = field(default_factory=dict)


async def read_pointer(kv: Bucket, key: str) -> Pointer | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    data = json.loads(entry.value or b"{}")
    readable_format(data, key)
    return Pointer(
        data["lineage"],
        int(data["gen"]),
        data.get("pins", {}),
        int(data.get("settled", 0)),
        list(data.get("replaced", [])),
        list(data.get("retired", [])),
        data.get("driver"),
        data.get("consumers", {}),
    )


async def write_pointer(kv: Bucket, key: str, pointer: Pointer) -> None:
    await kv.put(key, json.dumps({"format": LEDGER_FORMAT, **vars(pointer)}).encode())
