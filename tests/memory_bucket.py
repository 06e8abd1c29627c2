"""The ack ledger's KV bucket in memory, for unit tests of the ledger, dedupe and planner.

It has the interface the ledger uses (`nats_spark.spark.group_source.ledger.Bucket`) and
nats-server's compare-and-set, as nats-py reports it: every write takes the bucket stream's next
sequence as the key's revision; `create` fails with `KeyWrongLastSequenceError` while the key
has a value, `update` when the key's revision is not `last` (0: the key has none); `get` raises
`KeyNotFoundError`; `keys_matching` lists every key that matches, as the bucket stream's subject
index does. `remove` is the stream purge by
subject the ledger uses: the key and every key below it are gone without a marker, so the key
can be created again. The ledger never deletes or purges keys through KV (those leave markers,
which `create` would write over), so neither is here. tests/bucket_contract.py holds the
contract; tests/spark/group_source/test_ledger_bucket.py runs it against both.

A bucket may have a max age (`expire_after`, seconds; 0: none), as a bucket made by the previous
release (7 days) or by an operator has: as in nats-server, a key is gone once its last write is
that old (history 1: its one message), whatever the key, the pointer included. Time is
`nats_spark.clock`'s (the simulation's virtual time there).

A fault, for the simulation (tests/simulation): `lost_answer` makes a compare-and-set write that
took effect answer as a conflict, as the retry of a write whose answer was lost does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from nats_spark import clock
from nats_spark.spark.group_source.ledger import Ledger, key_token
from nats_spark.spark.group_source.packed_heads import (
    PACKED_TOKEN_PREFIX,
    decode_sections,
    is_packed_token,
)
from nats_spark.spark.group_source.slot_partition import SlotPartition
from nats_spark.spark.group_source.task.slot_entry import SlotEntry


class MemoryBucket:
    def __init__(self, name: str = "ledger", expire_after: float = 0.0) -> None:
        self.name = name
        self.last_seq = 0  # of the bucket's stream: the newest revision handed out
        self.values: dict[str, tuple[bytes, int]] = {}  # by key: value and revision
        self.expire_after = expire_after  # the bucket's max age
        self.written: dict[str, float] = {}  # by key: when it was last written
        self.reads = 0  # `get` calls, for tests of what a reader reads again
        self.lost_answer: Callable[[str], bool] | None = None  # per key written: answer lost?
        # By key: every value and revision written since it was last removed; by key removed
        # and not written since, the same, of which a server restarted uncleanly may bring one
        # back (`bring_back`).
        self.revisions: dict[str, list[tuple[bytes, int]]] = {}
        self.removed: dict[str, list[tuple[bytes, int]]] = {}

    def expire(self) -> None:
        """Forget the keys whose last write is the max age old (the server's expiry)."""
        if not self.expire_after:
            return
        oldest = clock.monotonic() - self.expire_after
        for key in [k for k, when in self.written.items() if when <= oldest]:
            del self.values[key], self.written[key]
            self.revisions.pop(key, None)

    async def max_age(self) -> float:
        return self.expire_after

    async def clear_max_age(self) -> None:
        self.expire_after = 0.0

    async def get(self, key: str) -> KeyValue.Entry:
        self.reads += 1
        self.expire()
        if key not in self.values:
            raise KeyNotFoundError
        value, revision = self.values[key]
        return KeyValue.Entry(self.name, key, value, revision, None, None, None)

    async def create(self, key: str, value: bytes) -> int:
        self.expire()
        if key in self.values:
            raise KeyWrongLastSequenceError(description=_wrong(self.values[key][1]))
        return self._checked_write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        self.expire()
        revision = self.values[key][1] if key in self.values else 0
        if revision != last:
            raise KeyWrongLastSequenceError(description=_wrong(revision))
        return self._checked_write(key, value)

    async def put(self, key: str, value: bytes) -> int:
        return self._write(key, value)

    async def remove(self, key: str) -> None:
        for stored in [k for k in self.values if k == key or k.startswith(f"{key}.")]:
            del self.values[stored], self.written[stored]
            self.removed[stored] = self.revisions.pop(stored)

    def bring_back(self, chosen: Callable[[int], int | None]) -> list[str]:
        """A server restarted uncleanly: removed keys come back, each at the revision `chosen`
        picks of its revisions (None: it stays gone). nats-server can lose the tombstone of a
        removal, and writes none when a key's newer revision pushes out an older one
        (nats-server #7384, #8505): the newest or an older one returns. The keys."""
        back = []
        for key in sorted(self.removed):
            pick = chosen(len(self.removed[key]))
            if pick is not None:
                revision = self.removed.pop(key)[pick]
                self.values[key], self.revisions[key] = revision, [revision]
                self.written[key] = clock.monotonic()
                back.append(key)
        return back

    async def keys_matching(self, pattern: str) -> list[str]:
        self.expire()
        wanted = pattern.split(".")
        return [key for key in self.values if _matches(wanted, key.split("."))]

    def _checked_write(self, key: str, value: bytes) -> int:
        revision = self._write(key, value)
        if self.lost_answer is not None and self.lost_answer(key):
            raise KeyWrongLastSequenceError(description=_wrong(revision))
        return revision

    def _write(self, key: str, value: bytes) -> int:
        self.removed.pop(key, None)  # what a restart would bring back is older: it stays gone
        self.last_seq += 1
        self.values[key] = (value, self.last_seq)
        self.revisions.setdefault(key, []).append(self.values[key])
        self.written[key] = clock.monotonic()
        return self.last_seq


def unpacked(values: Mapping[str, tuple[bytes, int]]) -> dict[str, tuple[bytes, int]]:
    """A ledger bucket's keys and values, each packed task's key (`packed_heads`) given as its
    sections, each under its own head's key with the section's revision: what a checker that
    reads heads by their keys reads."""
    found: dict[str, tuple[bytes, int]] = {}
    for key, stored in values.items():
        prefix, _, token = key.rpartition(".")
        if key.count(".") == 2 and is_packed_token(token):
            for slot, (revision, head) in decode_sections(stored[0], key).items():
                found[f"{prefix}.{key_token(slot)}"] = (head.encode(), revision)
        else:
            found[key] = stored
    return found


def stored_head(values: Mapping[str, tuple[bytes, int]], key: str) -> tuple[bytes, int] | None:
    """The head stored under `key` (its own, or a section of its batch's packed key) and its
    revision, read from the bucket's values themselves."""
    if (stored := values.get(key)) is not None:
        return stored
    prefix, _, token = key.rpartition(".")
    for packed, (value, _) in values.items():
        if packed.startswith(f"{prefix}.{PACKED_TOKEN_PREFIX}") and packed.count(".") == 2:
            sections = decode_sections(value, packed)
            for slot, (revision, head) in sections.items():
                if key_token(slot) == token:
                    return head.encode(), revision
    return None


def sections_written(
    values: Mapping[str, list[tuple[bytes, int]]], key: str, value: bytes, last: int
) -> list[str]:
    """The heads a write of packed key `key` on revision `last` writes (their keys): the
    sections `value` holds other than the key held at `last` (`values`: each key's revisions)."""
    prefix, _, token = key.rpartition(".")
    if key.count(".") != 2 or not is_packed_token(token):
        return []
    before = next((v for v, revision in values.get(key, []) if revision == last), None)
    held = decode_sections(before, key) if before else {}
    written = decode_sections(value, key)
    return [f"{prefix}.{key_token(slot)}" for slot, s in written.items() if held.get(slot) != s]


def attempt(kv: MemoryBucket, partition: SlotPartition) -> SlotEntry:
    """A task attempt's ledger entry on `kv`, not claimed yet (it needs no client: the ledger is
    given)."""
    entry = SlotEntry(None, partition)  # type: ignore[arg-type]
    entry.ledger = Ledger(kv, partition.lineage)
    return entry


def _wrong(revision: int) -> str:
    return f"wrong last sequence: {revision}"


def _matches(wanted: list[str], parts: list[str]) -> bool:
    """Whether a key's tokens match a subject pattern's (`*` one token, a last `>` the rest)."""
    if wanted[-1] == ">":
        return len(parts) >= len(wanted) and _matches(wanted[:-1], parts[: len(wanted) - 1])
    return len(parts) == len(wanted) and all(
        w in ("*", p) for w, p in zip(wanted, parts, strict=True)
    )
