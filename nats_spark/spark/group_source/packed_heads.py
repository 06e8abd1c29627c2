"""The heads of a packed task's entries kept together, as sections of one KV key.

Every slot keeps its own ledger entry, and `ledger_protocol` moves each one on as before; only
where a head is stored changes. The heads of the slots one packed task reads in a batch are
sections of one key, `<lineage>.<gen>.<packed token>` (`slot_packing.layout`: a key per task,
of `SECTIONS_PER_KEY` heads at most): a task's claims, records,
seals, hold renewals and releases, the next batch's ack reads and acked marks, and the driver's
reads of them then cost a request per task rather than one per slot, whose server and client
costs grew with the slots (issue 48). A section behaves as a key of its own:

- **Writes** (create, compare-and-set update, removal) of one key's sections go out together:
  one write of the key in flight per process, each taking every section write queued while the
  last one was out. It is a compare-and-set of the whole key on the revision it was based on;
  when another process wrote the key since, the key is read again and each section write
  judged anew. A section write succeeds when its own condition holds on the key as the writes
  before it in the same key write left it (create: no such section; update: the section's
  revision is the one given), so two processes never lose each other's sections, and one
  refused section does not hold the others back.
- **A section's revision** is the key's revision its write was based on. The key's revision
  grows with every write of it, so a slot's revision grows with every write of its head, and a
  head removed and written again never gets a number it had: what a slot's compare-and-set
  relies on. A key is created empty before its first section, so every section write has a
  base.
- **Reads** of the sections of one key share one get, when they are made before it goes out
  (a read that joins one sent earlier could miss a write that ended before it began).
- **Removal** of a section is a write without a condition; a removed batch's keys go with their
  chunks in the one purge of the batch (`Ledger.delete_batch`).

Ordering: section writes of one process reach the key in the order they were made. Two of
one slot in one key write are judged one after the other; the second can hold only where it
needs no revision of the first's (a create after a removal), so every revision a caller gets
is one no other write of its slot got. A write whose caller was cancelled still goes out (the
request was made; what it did is read back, as after an answer lost), which keeps a later
write of the same process from overtaking it.

Stored form, format 4: `{"format": 4, "sections": {slot: [revision, head]}}`, `head` the
slot's head as its own key would hold it (a string of JSON). A release that does not know
format 4 reads it as a head and refuses it with its one line (`readable_format`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from nats_spark.errors import ConfigurationError
from nats_spark.spark.group_source.slot_partition import SlotPartition

PACKED_FORMAT = 4
# Heads one packed key holds at most: a head is about 300 bytes, and one whose first record is
# kept inline (`ledger.INLINE_BYTES`) up to about 1.7 KB, so a key of 128 stays far below the
# server's 1 MB payload (and below a quarter of it) however its slots record.
SECTIONS_PER_KEY = 128
# A packed key's last token begins with the hex form of NUL, which no slot name's token does
# (`ledger.key_token`): it never names a slot's own entry.
PACKED_TOKEN_PREFIX = "_00"
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_EMPTY = _ENCODER.encode({"format": PACKED_FORMAT, "sections": {}}).encode()


def packed_token(index: int) -> str:
    """The last token of packed key `index` of a batch: `key_token("\\0heads-<index>")`."""
    return "_" + f"\0heads-{index}".encode().hex()


def is_packed_token(token: str) -> bool:
    return token.startswith(PACKED_TOKEN_PREFIX)


class SectionStore(Protocol):
    """What of the ledger bucket the sections use (`ledger.Bucket`'s methods)."""

    name: str

    async def get(self, key: str) -> KeyValue.Entry: ...

    async def create(self, key: str, value: bytes) -> int: ...

    async def update(self, key: str, value: bytes, last: int) -> int: ...


Sections = dict[str, tuple[int, str]]  # by slot: the section's revision and its head's JSON


@dataclass(frozen=True)
class _Stored:
    """A packed key as read or written: its revision (0: no such key) and sections."""

    revision: int
    sections: Sections


_ABSENT = _Stored(0, {})


def decode_sections(data: bytes, key: str) -> Sections:
    raw = json.loads(data)
    if raw.get("format") != PACKED_FORMAT:
        raise ConfigurationError(
            f"ack ledger entry {key} has format {raw.get('format')!r} where a packed task's "
            f"heads (format {PACKED_FORMAT}) were expected: start the query with a new "
            "checkpoint location"
        )
    return {slot: (int(revision), head) for slot, (revision, head) in raw["sections"].items()}


def _encode(sections: Sections) -> bytes:
    return _ENCODER.encode({"format": PACKED_FORMAT, "sections": sections}).encode()


@dataclass
class _Write:
    """One section write waiting for its key's write: `last` None creates, an int updates on
    that revision, `head` None removes."""

    slot: str
    head: str | None
    last: int | None
    done: asyncio.Future[int | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def judged(self, sections: Sections, revision: int) -> bool:
        """Whether it holds on `sections`; applies it there (a section written on `revision`)."""
        current = sections.get(self.slot)
        if self.head is None:
            sections.pop(self.slot, None)
            return True
        if (current is None) if self.last is None else (current and current[0] == self.last):
            sections[self.slot] = (revision, self.head)
            return True
        return False


class PackedKey:
    """One packed key as one process reads and writes it: the reads it shares and the section
    writes it groups."""

    def __init__(self, kv: SectionStore, key: str) -> None:
        self.kv, self.key = kv, key
        self._known: _Stored | None = None  # as this process last read or wrote it
        self._reading: asyncio.Future[_Stored] | None = None  # a read not sent yet
        self._queued: list[_Write] = []
        self._writing: asyncio.Future[None] | None = None

    async def section(self, slot: str) -> KeyValue.Entry | None:
        """The slot's head as stored now, with its revision; None when it has none."""
        return (await self.sections_of([slot]))[0]

    async def sections_of(self, slots: Sequence[str]) -> list[KeyValue.Entry | None]:
        """`section` of each of `slots`, from one read."""
        stored = (await self._read()).sections
        return [self._entry(stored.get(slot)) for slot in slots]

    def _entry(self, section: tuple[int, str] | None) -> KeyValue.Entry | None:
        if section is None:
            return None
        revision, head = section
        return KeyValue.Entry(self.kv.name, self.key, head.encode(), revision, None, None, None)

    async def slots(self) -> list[str]:
        """The slots with a section now."""
        return sorted((await self._read()).sections)

    async def create(self, slot: str, head: bytes) -> int | None:
        """The section's revision; None when the slot has a section already."""
        return await self._write(_Write(slot, head.decode(), None))

    async def update(self, slot: str, head: bytes, last: int) -> int | None:
        """The section's new revision; None when its revision is no longer `last`."""
        return await self._write(_Write(slot, head.decode(), last))

    async def remove(self, slot: str) -> bool:
        """Whether the key holds no head any more, as far as this process knows."""
        await self._write(_Write(slot, None, None))
        return self._known is not None and not self._known.sections

    async def _read(self) -> _Stored:
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._get())
        return await asyncio.shield(self._reading)

    async def _get(self) -> _Stored:
        self._reading = None  # sent from here on: later reads send their own
        try:
            entry = await self.kv.get(self.key)
        except KeyNotFoundError:
            stored = _ABSENT
        else:
            stored = _Stored(entry.revision or 0, decode_sections(entry.value or b"", self.key))
        if self._known is None or stored.revision > self._known.revision:
            self._known = stored  # an answer older than what this process wrote is not taken
        return stored

    async def _refreshed(self) -> _Stored:
        """The key read after a write of it failed: taken whatever it holds (removed, too)."""
        self._known = await self._read()
        return self._known

    async def _write(self, write: _Write) -> int | None:
        self._queued.append(write)
        if self._writing is None:
            self._writing = asyncio.ensure_future(self._write_queued())
        return await write.done

    async def _write_queued(self) -> None:
        try:
            while self._queued:
                writes, self._queued = self._queued, []
                await self._write_together(writes)
        finally:
            self._writing = None
            queued, self._queued = self._queued, []
            for write in queued:  # ended by its process's end (its tasks cancelled): so are they
                with contextlib.suppress(RuntimeError):  # its loop closed already
                    write.done.cancel()

    async def _write_together(self, writes: list[_Write]) -> None:
        fresh = False  # read since `writes` were taken: a refused one is refused
        try:
            stored = self._known or await self._refreshed()
            while True:
                sections = dict(stored.sections)
                held = [write.judged(sections, stored.revision) for write in writes]
                if not all(held) and not fresh:
                    stored, fresh = await self._refreshed(), True
                    continue
                if sections == stored.sections:
                    break  # nothing to write: refused, or removals of sections that are gone
                try:
                    if not stored.revision:  # no key yet: an empty one first (see above)
                        self._known = _Stored(await self.kv.create(self.key, _EMPTY), {})
                    else:
                        revision = await self.kv.update(
                            self.key, _encode(sections), stored.revision
                        )
                        self._known = _Stored(revision, sections)
                        break
                except KeyWrongLastSequenceError:
                    self._known = None
                    stored, fresh = await self._refreshed(), True
                    continue
                stored = self._known
        except BaseException as error:
            self._known = None  # it may have landed: read it again before the next write
            for write in writes:
                if write.done.done():
                    continue
                if isinstance(error, Exception):
                    write.done.set_exception(error)
                else:  # the process ends (its loop's tasks cancelled or closed): so do they
                    write.done.cancel()
            if not isinstance(error, Exception):
                raise
            return
        for write, holds in zip(writes, held, strict=True):
            if not write.done.done():
                write.done.set_result(stored.revision if holds else None)


# By batch (gen), each packed slot's task index (`slot_packing.layout`): where its head is kept.
# A batch not in it keeps a key per head.
PackedLayouts = dict[int, dict[str, int]]


def task_layouts(partitions: Iterable[SlotPartition]) -> PackedLayouts:
    """The layouts a task's input partitions were handed, as one (a ledger's, which a listing
    may add to)."""
    return {gen: dict(slots) for p in partitions for gen, slots in p.layouts.items()}


def index_of(token: str) -> int:
    """The index of a packed key, from its last token."""
    return int(bytes.fromhex(token[1:]).decode().removeprefix("\0heads-"))
