"""The write-ahead ack ledger's storage: what each task took from NATS, in a JetStream KV bucket.

An entry per (lineage, gen, slot): what one slot (one input partition of a batch: a group
partition, a member, or one reader of a plain consumer) took in one batch. This module is its
stored form, whole: the keys, a head's bytes (`EntryHead`, read by `read_head` and written by
compare-and-set in `write_head`), the deliveries its chunks hold (`EntryDeliveries`) and the
pointer; what an entry's states mean, who moves an entry on and what the driver concludes from
it is `ledger_protocol`, and nothing else reads or writes a head's fields. Keys:

- `<lineage>.<gen>.<slot>`: the head, JSON (format, state, attempt, chunk keys, count, pin,
  max_seq, prefix: the ack subject up to the delivery count, `$JS.ACK.<stream>.<consumer>` or the
  v2 form with domain and account hash, as the server sent it; inline: the entry's first record,
  when its chunk is small, kept in the head itself, base64, ahead of the chunks)
- `<lineage>.<gen>.<slot>.<attempt>.<n>`: chunks of deliveries, in delivery order: their count (4
  bytes, little endian), then zstd of three columns of signed 64-bit integers: stream sequence
  and consumer sequence each as the difference to the one before, and the delivery count. In-order
  deliveries repeat one pattern, which zstd stores in a few bytes per thousand messages; format 1
  chunks held the reply subjects themselves (about 73 bytes each) and are still read. Format 3
  keeps a first record of at most `INLINE_BYTES` (as a chunk) in the head (`inline`): a slot
  that takes a few messages a batch writes no chunk, and its ack reads none.
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

import asyncio
import base64
import functools
import json
import logging
import operator
import re
import sys
import uuid
from array import array
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import accumulate, chain, pairwise
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from nats.errors import NoRespondersError
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
)
from nats.js.kv import KeyValue

from nats_spark import __version__
from nats_spark.arrays import int_array, string_scalar
from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, NatsSparkError, NotFound
from nats_spark.jetstream.acks import ACK, ack_commands, ack_prefix
from nats_spark.jetstream.kv_requests import KvRequests
from nats_spark.jetstream.retry import is_transient, retrying
from nats_spark.jetstream.subjects import ack_numbers
from nats_spark.requests_at_once import all_results
from nats_spark.spark.group_source.packed_heads import (
    PackedKey,
    PackedLayouts,
    index_of,
    is_packed_token,
    packed_token,
)
from nats_spark.spark.shared.columns import BATCH_ROWS

log = logging.getLogger(__name__)

_KEY_TOKEN = re.compile(r"^[-_=a-zA-Z0-9]+$")
LEDGER_FORMAT = 3
# 1: chunks of reply subjects, heads without `prefix`; 2: heads without `inline`
READABLE_FORMATS = (1, 2, 3)
# Lineages given back that a target's pointer keeps: a task attempt of one that creates its
# entry after the give-back finds its lineage here, and removes the entry (`Pointer.retired`).
RETIRED_KEPT = 16
T = TypeVar("T")
StoredValue = KeyValue.Entry  # a key's value and revision, as nats-py reads it
# Heads are written at every record, seal and ack: one encoder, not one built per `json.dumps`.
_HEAD_ENCODER = json.JSONEncoder(separators=(",", ":"))
# The ledger stores a task's deliveries in chunks of a record batch's rows (384 KB raw at most,
# below the 1 MB payload limit).
CHUNK_MESSAGES = BATCH_ROWS
# The largest chunk an entry's head keeps inline (format 3): heads are written at every hold
# renewal and read by the driver at every batch, so they stay small. In-order deliveries take
# under a byte each (a few bytes per thousand), redeliveries out of order a few bytes each.
INLINE_BYTES = 1024
_CODEC = pa.Codec("zstd", compression_level=3)  # level 1 barely shortens long repeats
_COLUMNS = 3  # stream sequence and consumer sequence (as differences), delivery count
_WORD = 8
# Deliveries from which `EntryDeliveries.ack_commands` formats with Arrow (about where both ways
# cost the same); the ack subject's timestamp and pending, which the server does not read.
ARROW_FROM = 400
_UNREAD = b"0.0"


@functools.lru_cache(maxsize=4096)  # a query's few slot names, on every key it reads or writes
def key_token(name: str) -> str:
    """A KV key token for `name`: itself when safe, else `_` and its UTF-8 in hex."""
    if _KEY_TOKEN.match(name) and not name.startswith("_"):
        return name
    return "_" + name.encode().hex()


def name_of(token: str) -> str:
    """The name `key_token` made `token` from."""
    return bytes.fromhex(token[1:]).decode() if token.startswith("_") else token


def _entry_of(key: str) -> tuple[int, str]:
    """(gen, slot name) of the entry a head's or chunk's key belongs to."""
    _, gen, token = key.split(".")[:3]
    return int(gen), name_of(token)


@dataclass(frozen=True)
class LineageKeys:
    """What a listing of a lineage's keys found: its entries (gen, slot name), by their heads,
    the entries it found chunks of but no head, the keys of all chunks, and the packed keys
    that hold no head (`packed_heads`), by gen."""

    heads: list[tuple[int, str]]
    headless: list[tuple[int, str]]
    chunks: frozenset[str]
    empty_packed: list[tuple[int, str]]


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


# An entry's deliveries, and their chunks' bytes (pure: no I/O).


@dataclass
class EntryDeliveries:
    """Deliveries a ledger entry recorded, in the order they were taken: the numbers of each
    one's ack subject, and the subject's prefix up to the delivery count (the same for all
    deliveries of one consumer)."""

    prefix: bytes = b""
    stream_seq: list[int] = field(default_factory=list)
    consumer_seq: list[int] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.stream_seq)

    def extend(self, other: EntryDeliveries) -> None:
        if other.prefix and self.prefix and other.prefix != self.prefix:
            raise ValueError(f"deliveries of {other.prefix!r} added to {self.prefix!r}")
        self.prefix = self.prefix or other.prefix
        self.stream_seq += other.stream_seq
        self.consumer_seq += other.consumer_seq
        self.delivered += other.delivered

    def without(self, dropped: set[int]) -> EntryDeliveries:
        """The deliveries whose stream sequence is not in `dropped`."""
        rows = [i for i, seq in enumerate(self.stream_seq) if seq not in dropped]
        return EntryDeliveries(
            self.prefix,
            [self.stream_seq[i] for i in rows],
            [self.consumer_seq[i] for i in rows],
            [self.delivered[i] for i in rows],
        )

    def part(self, start: int, stop: int) -> EntryDeliveries:
        return EntryDeliveries(
            self.prefix,
            self.stream_seq[start:stop],
            self.consumer_seq[start:stop],
            self.delivered[start:stop],
        )

    def subjects(self) -> list[bytes]:
        """Each delivery's ack subject, rebuilt from the prefix and the numbers the server reads
        (timestamp and pending 0, which it does not)."""
        columns = (self.delivered, self.stream_seq, self.consumer_seq)
        return [
            b"%b.%d.%d.%d.%b" % (self.prefix, *numbers, _UNREAD)
            for numbers in zip(*columns, strict=True)
        ]

    def ack_commands(self, kind: bytes = ACK, block: int = 4096) -> list[bytes]:
        """`ack_commands` for these deliveries (`kind`: or restart their ack wait), their ack
        subjects rebuilt from the prefix and the numbers the server reads; timestamp and pending
        are 0, which it does not. Many are formatted by Arrow's string kernels: a block's
        commands end to end in one buffer, no Python step per delivery; a few in Python, where
        the kernels' fixed cost (tens of microseconds) is more than the steps."""
        if len(self) < ARROW_FROM:
            return ack_commands(self.subjects(), kind, block)
        columns = (self.delivered, self.stream_seq, self.consumer_seq)
        numbers = (int_array(column).cast(pa.string()) for column in columns)
        head = string_scalar(b"PUB " + self.prefix)
        tail = string_scalar(_UNREAD + b" 4\r\n%b\r\n" % kind)
        commands = pc.binary_join_element_wise(head, *numbers, tail, string_scalar(b"."))
        offsets, data = (memoryview(buffer) for buffer in commands.buffers()[1:])
        ends = [*range(0, len(commands), block), len(commands)]
        return [
            data[offsets.cast("i")[start] : offsets.cast("i")[end]].tobytes()
            for start, end in pairwise(ends)
        ]

    @classmethod
    def from_replies(cls, replies: Sequence[bytes]) -> EntryDeliveries:
        """From ack reply subjects as the server sent them (one consumer's)."""
        delivered, stream_seq, consumer_seq, _ = ack_numbers(replies)
        return cls(ack_prefix(replies[0]) if replies else b"", stream_seq, consumer_seq, delivered)


def encode_chunk(found: EntryDeliveries) -> bytes:
    """A chunk's stored form (format 2): the count, then the columns, zstd-compressed."""
    columns = array("q", _differences(found.stream_seq))
    columns += array("q", _differences(found.consumer_seq))
    columns += array("q", found.delivered)
    if sys.byteorder == "big":
        columns.byteswap()
    return len(found).to_bytes(4, "little") + _CODEC.compress(columns.tobytes(), asbytes=True)


def decode_chunk(data: bytes, prefix: bytes) -> EntryDeliveries:
    count = int.from_bytes(data[:4], "little")
    if not count:
        return EntryDeliveries(prefix)
    columns = array("q")
    columns.frombytes(_CODEC.decompress(data[4:], count * _COLUMNS * _WORD, asbytes=True))
    if sys.byteorder == "big":
        columns.byteswap()
    return EntryDeliveries(
        prefix,
        list(accumulate(columns[:count])),
        list(accumulate(columns[count : 2 * count])),
        columns[2 * count :].tolist(),
    )


def _differences(values: list[int]) -> map[int]:
    return map(operator.sub, values, chain((0,), values))


def decode_replies(data: bytes) -> list[bytes]:
    """A format 1 chunk's reply subjects (releases before format 2 wrote those)."""
    size = int.from_bytes(data[:4], "little")
    if not size:
        return []
    return _CODEC.decompress(data[4:], size, asbytes=True).split(b"\n")


# An entry's head.


class EntryState(StrEnum):
    OPEN = "open"  # a task attempt is (or was) recording
    SEALED = "sealed"  # the attempt finished: the entry is what the batch emitted
    ACKED = "acked"  # the batch was committed and its acks published


class ChunkMissing(NatsSparkError):
    """A chunk an entry's head names is not in the bucket."""


class LedgerConflict(NatsSparkError):
    """Another attempt of the same task took the entry over; this attempt must stop."""


class TakenOver(LedgerConflict):
    """A head write found the head written by another attempt since (it took the entry over),
    or found it removed. The attempt may still end with the entry's sealed content
    (`await_sealed`). `holder`: the attempt the head names now (None: removed)."""

    def __init__(self, message: str, holder: str | None) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass
class EntryHead:
    state: EntryState = EntryState.OPEN
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    chunks: list[str] = field(default_factory=list)
    count: int = 0
    max_seq: int = 0
    pin: str | None = None
    prefix: str | None = None  # of the deliveries' ack subjects (format 2)
    format: int = LEDGER_FORMAT  # how its chunks are stored
    released: bool = False  # OPEN, and its holder gave it up: take it over at once
    # The first record's chunk, base64 (format 3, `keep_inline`): its deliveries come first
    inline: str = ""

    def to_bytes(self) -> bytes:
        # Its fields in order (what `asdict` gives, without copying them first: heads are
        # written at every record, seal and ack); without an empty `inline`, so that a format 2
        # head acked by this release stays as that release wrote it.
        fields = vars(self)
        if not self.inline:
            fields = {name: value for name, value in fields.items() if name != "inline"}
        return _HEAD_ENCODER.encode(fields).encode()

    def recorded(self) -> tuple[str, list[str]]:
        """Where what it recorded so far is stored (`inline`, `chunks`): what a record that
        follows it keeps."""
        return self.inline, self.chunks

    @classmethod
    def from_bytes(cls, data: bytes, key: str) -> EntryHead:
        raw = json.loads(data)
        raw["format"] = readable_format(raw, key)
        raw["state"] = EntryState(raw["state"])
        return cls(**raw)


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

    Gets and writes are plain requests (`KvRequests`: nats-py's semantics, a fraction of its
    CPU; every slot of every batch makes several). A write to a stream without a leader finds no
    responder, just like a write to a deleted bucket: the bucket's existence tells the two apart.
    """

    def __init__(self, client: NatsClient, name: str) -> None:
        self.client = client
        self.name = name
        self.requests = KvRequests(
            client.routed_requests, name, client.api.prefix, client.api.timeout
        )

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
        return await self._call(f"reading {key}", lambda: self.requests.get(key))

    async def create(self, key: str, value: bytes) -> int:
        return await self._call(f"creating {key}", lambda: self.requests.create(key, value))

    async def update(self, key: str, value: bytes, last: int) -> int:
        return await self._call(f"updating {key}", lambda: self.requests.update(key, value, last))

    async def put(self, key: str, value: bytes) -> int:
        return await self._call(f"writing {key}", lambda: self.requests.put(key, value))

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

    def __init__(self, kv: Bucket, lineage: str, layouts: PackedLayouts | None = None) -> None:
        self.kv = kv
        self.lineage = lineage
        # Where the heads of packed tasks' slots are kept together (`packed_heads`): the
        # batches of offset v2, as their offsets say or a listing found.
        self.layouts: PackedLayouts = layouts if layouts is not None else {}
        self._packed: dict[str, PackedKey] = {}  # this process's handle on each packed key

    def _section(self, gen: int, slot: str) -> PackedKey | None:
        """The packed key holding the slot's head in batch `gen`; None: the head's own key."""
        index = self.layouts.get(gen, {}).get(slot)
        return (
            None
            if index is None
            else self._packed_key(f"{self.lineage}.{gen}.{packed_token(index)}")
        )

    def _packed_key(self, key: str) -> PackedKey:
        found = self._packed.get(key)
        if found is None:
            found = self._packed[key] = PackedKey(self.kv, key)
        return found

    @staticmethod
    async def bucket(
        client: NatsClient, name: str, create: bool, replicas: int = 1
    ) -> LedgerBucket:
        """The ledger bucket; the driver creates it, executors only open it (nats-py's
        `key_value` checks that it is a bucket)."""

        async def open_or_create() -> None:
            try:
                await client.js.key_value(name)
            except BucketNotFoundError:
                if not create:
                    raise _missing(name) from None
                await client.js.create_key_value(bucket=name, history=1, replicas=replicas)

        await retrying(
            open_or_create, f"opening ack ledger bucket {name!r}", client.settings.retry_timeout
        )
        return LedgerBucket(client, name)

    def head_key(self, gen: int, slot: str) -> str:
        return f"{self.lineage}.{gen}.{key_token(slot)}"

    async def get_head(self, gen: int, slot: str) -> StoredValue | None:
        """The stored head of the entry (None: there is none); `read_head` reads it."""
        if (packed := self._section(gen, slot)) is not None:
            return await packed.section(slot)
        return await self._get_own_head(gen, slot)

    async def get_heads(self, keys: Sequence[tuple[int, str]]) -> list[StoredValue | None]:
        """The stored heads of the entries `keys` (gen, slot), as `get_head` reads each: a
        packed key's asked sections from one get (a key of 128 heads read `AT_ONCE` heads at a
        time was read twice, and a get of one costs the server and the client ten times a
        head's own), the heads of their own keys `AT_ONCE` at a time."""
        by_key: dict[str, tuple[PackedKey, list[int]]] = {}
        own = []
        for i, (gen, slot) in enumerate(keys):
            if (packed := self._section(gen, slot)) is None:
                own.append(i)
            else:
                by_key.setdefault(packed.key, (packed, []))[1].append(i)
        found: list[StoredValue | None] = [None] * len(keys)
        sections = await all_results(
            (packed.sections_of([keys[i][1] for i in at]) for packed, at in by_key.values()),
            at_once=max(1, len(by_key)),
        )
        for (_, at), of_key in zip(by_key.values(), sections, strict=True):
            for i, section in zip(at, of_key, strict=True):
                found[i] = section
        heads = await all_results(self._get_own_head(*keys[i]) for i in own)
        for i, head in zip(own, heads, strict=True):
            found[i] = head
        return found

    async def _get_own_head(self, gen: int, slot: str) -> StoredValue | None:
        try:
            return await self.kv.get(self.head_key(gen, slot))
        except KeyNotFoundError:
            return None

    async def create_head(self, gen: int, slot: str, value: bytes) -> int | None:
        """Create the head; None when it exists already (another attempt was first)."""
        if (packed := self._section(gen, slot)) is not None:
            return await packed.create(slot, value)
        try:
            return await self.kv.create(self.head_key(gen, slot), value)
        except KeyWrongLastSequenceError:
            return None

    async def update_head(self, gen: int, slot: str, value: bytes, revision: int) -> int | None:
        """Compare-and-set the head; None when its revision is no longer `revision`."""
        if (packed := self._section(gen, slot)) is not None:
            return await packed.update(slot, value, revision)
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
            raise ChunkMissing(
                f"ack ledger chunk {key} is missing (bucket purged or expired?); the batch "
                "cannot be replayed exactly: restart the query with a new checkpoint"
            ) from None
        return entry.value or b""

    async def heads(self) -> list[tuple[int, str]]:
        """(gen, slot name) of every entry of this lineage (a head's key has three tokens, its
        chunks' five; a packed key's sections are read)."""
        keys = await self.kv.keys_matching(f"{self.lineage}.*.*")
        entries, _ = await self._entries_of(keys)
        return sorted(entries)

    async def listing(self) -> LineageKeys:
        """The entries of this lineage, and those of its chunks no head was listed beside, in
        one listing of its keys."""
        heads: list[str] = []
        chunks: set[str] = set()
        for key in await self.kv.keys_matching(f"{self.lineage}.>"):
            if key.count(".") == 2:
                heads.append(key)
            else:
                chunks.add(key)
        entries, empty = await self._entries_of(heads)
        chunked = {_entry_of(key) for key in chunks}
        return LineageKeys(sorted(entries), sorted(chunked - entries), frozenset(chunks), empty)

    async def _entries_of(
        self, heads: Iterable[str]
    ) -> tuple[set[tuple[int, str]], list[tuple[int, str]]]:
        """(gen, slot name) of the entries whose heads `heads` are: a slot's own key names
        one, a packed key those of its sections, which this ledger then knows where to find;
        and the packed keys of `heads` that hold none, (gen, key)."""
        entries: set[tuple[int, str]] = set()
        packed = []
        for key in heads:
            if is_packed_token(key.rsplit(".", 1)[1]):
                packed.append(key)
            else:
                entries.add(_entry_of(key))
        # read at once: a restart lists the packed keys of every batch not settled yet
        sections = await all_results(self._packed_key(key).slots() for key in packed)
        empty = []
        for key, slots in zip(packed, sections, strict=True):
            _, gen, token = key.split(".")
            if not slots:
                empty.append((int(gen), key))
            self.layouts.setdefault(int(gen), {}).update(dict.fromkeys(slots, index_of(token)))
            entries.update((int(gen), slot) for slot in slots)
        return entries, sorted(empty)

    async def remove_headless(self, entries: Iterable[tuple[int, str]]) -> None:
        """Remove the chunks of `entries` whose head is gone: an attempt that outlived its entry
        wrote them after the entry was removed, found its head write failing and was killed
        before it removed them (`ledger_protocol.record`). No attempt writes such an entry's
        chunks any more (its head is gone for good: the fence stops a create). Each head is read
        first: a listing of many pages is not of one instant."""
        for gen, slot in entries:
            if await self.get_head(gen, slot) is None:
                log.info(
                    "removing ledger chunks of %s, whose head is gone", self.head_key(gen, slot)
                )
                await self.delete_entry(gen, slot)

    async def remove_empty_packed(self, keys: Iterable[str]) -> None:
        """Remove packed keys that hold no head, of batches fenced off (`Pointer.settled`) or
        of a lineage given back: the key is created empty before its first section is written
        (`packed_heads`), and an attempt that outlived its batch's removal and was killed in
        between left it, which no removal of an entry would take. An attempt writing a section
        into it meanwhile finds the fence raised and removes what it wrote."""
        for key in keys:
            log.info("removing ledger key %s, a packed task's heads, holding none", key)
            await self.kv.remove(key)

    async def delete_entry(self, gen: int, slot: str) -> None:
        """Remove the entry: its head and the chunks of every attempt."""
        if (packed := self._section(gen, slot)) is not None and await packed.remove(slot):
            # Its last head gone, the key goes too (an attempt fenced off after its batch's
            # removal would leave it behind for good). Whoever writes a head into it after
            # this finds the fence raised (every removal follows the fence) and removes that.
            await self.kv.remove(packed.key)
        await self.kv.remove(self.head_key(gen, slot))

    async def delete_batch(self, gen: int) -> None:
        """Remove every entry of batch `gen`: the heads and chunks of all its slots."""
        await self.kv.remove(f"{self.lineage}.{gen}")

    async def remove_chunks(self, keys: Iterable[str]) -> None:
        for key in keys:
            await self.kv.remove(key)


# Reading and writing heads and their deliveries: the one place they are read and written.


async def read_head(ledger: Ledger, gen: int, slot: str) -> tuple[EntryHead, int] | None:
    """The entry's head and its revision; None when there is none."""
    return _head_of(ledger, gen, slot, await ledger.get_head(gen, slot))


async def read_heads(
    ledger: Ledger, keys: Sequence[tuple[int, str]]
) -> list[tuple[EntryHead, int] | None]:
    """`read_head` of each of the entries `keys` (gen, slot), read together
    (`Ledger.get_heads`)."""
    stored = await ledger.get_heads(keys)
    return [_head_of(ledger, gen, slot, s) for (gen, slot), s in zip(keys, stored, strict=True)]


def _head_of(
    ledger: Ledger, gen: int, slot: str, stored: StoredValue | None
) -> tuple[EntryHead, int] | None:
    if stored is None:
        return None
    head = EntryHead.from_bytes(stored.value or b"", ledger.head_key(gen, slot))
    return head, stored.revision or 0


async def read_deliveries(ledger: Ledger, head: EntryHead) -> EntryDeliveries:
    """What the entry of `head` recorded, in the order it was taken."""
    return (await read_all_deliveries(ledger, [head]))[0]


async def read_all_deliveries(ledger: Ledger, heads: Sequence[EntryHead]) -> list[EntryDeliveries]:
    """What the entries of `heads` recorded, each in the order it was taken. Their chunks are
    read at once: an entry of many small pulls has a chunk per pull (thousands in a long batch
    of one-message pulls), which one get after the other took the driver's keeper longer than
    the ack wait it keeps."""
    keys = [key for head in heads for key in head.chunks]
    chunks = iter(await all_results(ledger.read_chunk(key) for key in keys))
    found = []
    for head in heads:
        deliveries = inline_deliveries(head)
        for _ in head.chunks:
            deliveries.extend(chunk_deliveries(next(chunks), head))
        found.append(deliveries)
    return found


def inline_deliveries(head: EntryHead) -> EntryDeliveries:
    """What `head` holds itself (`inline`, format 3): the deliveries ahead of its chunks'."""
    prefix = (head.prefix or "").encode()
    if not head.inline:
        return EntryDeliveries(prefix)
    return decode_chunk(base64.b64decode(head.inline), prefix)


def keep_inline(head: EntryHead, taken: EntryDeliveries) -> bool:
    """Whether `taken` goes into `head` itself (`inline`, set here): when it is the first the
    entry records and its chunk is at most `INLINE_BYTES`. Its record then writes no chunk, and
    a read of the entry reads none."""
    if head.inline or head.chunks or not taken or len(taken) > CHUNK_MESSAGES:
        return False
    data = encode_chunk(taken)
    if len(data) > INLINE_BYTES:
        return False
    head.inline = base64.b64encode(data).decode()
    return True


def chunk_deliveries(data: bytes, head: EntryHead) -> EntryDeliveries:
    """A chunk of `head`'s entry, in the format the head says."""
    if head.format == 1:
        return EntryDeliveries.from_replies(decode_replies(data))
    return decode_chunk(data, (head.prefix or "").encode())


async def recorded_in(ledger: Ledger, gen: int, slots: Iterable[str]) -> set[int]:
    """Every stream sequence the entries of `slots` in batch `gen` have recorded, read now."""
    recorded: set[int] = set()
    for slot in slots:
        found = await read_head(ledger, gen, slot)
        if found is not None:
            recorded.update((await read_deliveries(ledger, found[0])).stream_seq)
    return recorded


async def write_head(ledger: Ledger, gen: int, slot: str, head: EntryHead, revision: int) -> int:
    """Compare-and-set the head on `revision`; `LedgerConflict` when someone else wrote it
    since."""
    written = await ledger.update_head(gen, slot, head.to_bytes(), revision)
    if written is not None:
        return written
    return await own_write_or_taken_over(ledger, gen, slot, head)


async def own_write_or_taken_over(ledger: Ledger, gen: int, slot: str, head: EntryHead) -> int:
    """After a compare-and-set of `head` failed: its revision when the head is that write,
    retried after its answer was lost; `TakenOver` otherwise."""
    found = await read_head(ledger, gen, slot)
    if found is not None and found[0] == head:
        return found[1]
    raise TakenOver(
        f"ledger entry {ledger.head_key(gen, slot)} was taken over by another task attempt",
        found[0].attempt if found is not None else None,
    )


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
    last saw them (`SeenConsumers.stored`; absent in an older release's pointer), and the same
    of each replaced lineage, as it was when replaced: a restarted checkpoint whose first batch
    Spark runs again comes back to its lineage after `initialOffset` began another; the
    consumers taken as created again after a batch not committed yet was planned."""

    lineage: str
    gen: int
    pins: dict[str, str] = field(default_factory=dict)
    settled: int = 0
    replaced: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    driver: str | None = None  # the driver that wrote it (`presence`); None: an older release's
    consumers: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    replaced_consumers: dict[str, dict[str, dict[str, list[Any]]]] = field(default_factory=dict)
    # By stream and name: the stream sequences an earlier checkpoint's query acked above the
    # consumer's ack floor, whose entries a give-back removed, as [first, last] spans
    # (`SeenConsumers.acked_earlier`)
    acked_earlier: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    # [stream, consumer, gen] of each consumer taken as created again after batch `gen` was
    # planned, until it commits: a run of a batch up to it again tells its tasks
    # (`DriverLedger.started_over`)
    started_over: list[list[Any]] = field(default_factory=list)


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
        data.get("replaced_consumers", {}),
        data.get("acked_earlier", {}),
        data.get("started_over", []),
    )


class PointerReads:
    """Reads of one pointer shared by the callers that ask before the read is sent: each gets a
    read sent after it asked, as the fence check after a create needs (`check_fence`), and the
    claims of a packed task, whose creates answer together, share one read."""

    def __init__(self, kv: Bucket, key: str) -> None:
        self.kv = kv
        self.key = key
        self._next: asyncio.Future[Pointer | None] | None = None  # not sent yet

    async def read(self) -> Pointer | None:
        if self._next is None:
            self._next = asyncio.ensure_future(self._send())
        return await asyncio.shield(self._next)

    async def _send(self) -> Pointer | None:
        self._next = None  # a caller from now on needs a read sent after it asked
        return await read_pointer(self.kv, self.key)


async def write_pointer(kv: Bucket, key: str, pointer: Pointer) -> None:
    await kv.put(key, json.dumps({"format": LEDGER_FORMAT, **vars(pointer)}).encode())
