"""A packed task's heads as sections of one key (`packed_heads`): each section behaves as a head
with a key of its own (the same cases give the same outcomes on both), while the slots' writes
and reads share the key's requests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from memory_bucket import MemoryBucket

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError
from nats_spark.loop import Blocking, run_sync
from nats_spark.spark.group_source.ledger import EntryHead, Ledger, read_heads
from nats_spark.spark.group_source.packed_heads import packed_token

GEN = 3
SLOTS = [f"g-partition-{i}" for i in range(64)]


def packed(kv: object, lineage: str = "lin") -> Ledger:
    """A ledger whose batch GEN keeps SLOTS' heads in packed task 0's key."""
    return Ledger(kv, lineage, {GEN: dict.fromkeys(SLOTS, 0)})  # type: ignore[arg-type]


class Counted(MemoryBucket):
    """A memory bucket that counts the requests made of it, by kind."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        self._count("get")
        return await super().get(key)

    async def create(self, key: str, value: bytes) -> int:
        self._count("create")
        return await super().create(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        self._count("update")
        return await super().update(key, value, last)


# The contract: each case runs on a ledger with a key per head and on a packed one.

Case = Callable[[Ledger], Awaitable[object]]


async def create_update_and_read(ledger: Ledger) -> object:
    slot = SLOTS[0]
    first = await ledger.create_head(GEN, slot, b'{"a":1}')
    assert first
    again = await ledger.create_head(GEN, slot, b'{"a":2}')
    stale = await ledger.update_head(GEN, slot, b'{"a":3}', first - 1)
    second = await ledger.update_head(GEN, slot, b'{"a":4}', first)
    assert second and second > first
    stored = await ledger.get_head(GEN, slot)
    assert stored is not None and stored.revision == second
    return again, stale, stored.value, await ledger.get_head(GEN, SLOTS[1])


async def removed_and_created_again(ledger: Ledger) -> object:
    slot = SLOTS[0]
    first = await ledger.create_head(GEN, slot, b'{"a":1}')
    await ledger.delete_entry(GEN, slot)
    gone = await ledger.get_head(GEN, slot)
    on_the_old_revision = await ledger.update_head(GEN, slot, b'{"a":2}', first or 0)
    again = await ledger.create_head(GEN, slot, b'{"a":3}')
    assert again and first and again > first  # never a number it had
    return gone, on_the_old_revision


async def a_slot_s_writes_are_its_own(ledger: Ledger) -> object:
    """Writes of other slots between two of one slot leave its revision alone."""
    mine = await ledger.create_head(GEN, SLOTS[0], b'{"a":1}')
    for slot in SLOTS[1:4]:
        await ledger.create_head(GEN, slot, b'{"b":1}')
    return await ledger.update_head(GEN, SLOTS[0], b'{"a":2}', mine or 0) is not None


async def the_last_head_removed_leaves_no_key(ledger: Ledger) -> object:
    for slot in SLOTS[:2]:
        await ledger.create_head(GEN, slot, b'{"a":1}')
    await ledger.delete_entry(GEN, SLOTS[0])
    kept = await ledger.kv.keys_matching(f"{ledger.lineage}.>")
    await ledger.delete_entry(GEN, SLOTS[1])
    return len(kept), await ledger.kv.keys_matching(f"{ledger.lineage}.>")


async def removed_batch_is_gone(ledger: Ledger) -> object:
    for slot in SLOTS[:3]:
        await ledger.create_head(GEN, slot, b'{"a":1}')
    await ledger.delete_batch(GEN)
    return [await ledger.get_head(GEN, slot) for slot in SLOTS[:3]], await ledger.heads()


async def listed_entries(ledger: Ledger) -> object:
    for slot in SLOTS[:3]:
        await ledger.create_head(GEN, slot, b'{"a":1}')
    await ledger.kv.put(f"{ledger.head_key(GEN, SLOTS[5])}.attempt.0", b"chunk")
    listing = await ledger.listing()
    return await ledger.heads(), listing.heads, listing.headless


CASES = [
    create_update_and_read,
    removed_and_created_again,
    a_slot_s_writes_are_its_own,
    the_last_head_removed_leaves_no_key,
    removed_batch_is_gone,
    listed_entries,
]


@pytest.mark.unit
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_a_section_keeps_a_head_s_contract(case: Case) -> None:
    own = run_sync(case(Ledger(MemoryBucket(), "lin")))  # type: ignore[arg-type]
    assert run_sync(case(packed(MemoryBucket()))) == own


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_a_section_keeps_a_head_s_contract_on_a_server(
    case: Case, client: Blocking[NatsClient], unique: str
) -> None:
    async def both() -> tuple[object, object]:
        kv = await Ledger.bucket(client.target, f"L{unique}", create=True)
        return await case(Ledger(kv, "own")), await case(packed(kv, "packed"))

    own, on_sections = run_sync(both())
    assert on_sections == own


# What the sections share.


@pytest.mark.unit
def test_a_task_s_claims_go_out_in_one_write_and_its_reads_in_one_get() -> None:
    kv = Counted()
    ledger = packed(kv)

    async def claims_then_reads() -> list[int | None]:
        created = await asyncio.gather(
            *(ledger.create_head(GEN, slot, b'{"s":"%s"}' % slot.encode()) for slot in SLOTS)
        )
        kv.calls.clear()
        found = await asyncio.gather(*(ledger.get_head(GEN, slot) for slot in SLOTS))
        assert [f.value for f in found if f] == [b'{"s":"%s"}' % s.encode() for s in SLOTS]
        return list(created)

    created = run_sync(claims_then_reads())
    assert all(created)
    assert kv.calls == {"get": 1}
    assert len(kv.values) == 1  # the packed key, nothing per slot


@pytest.mark.unit
def test_the_driver_reads_a_packed_key_once_however_many_of_its_heads_it_reads() -> None:
    """Two keys of 128 heads each and 3 heads of their own keys (a batch of offset v1): the
    driver's reads of all of them cost a get per key, not one per `AT_ONCE` heads."""
    kv = Counted()
    slots = [f"g-partition-{i}" for i in range(256)]
    own = [f"o-partition-{i}" for i in range(3)]
    ledger = Ledger(kv, "lin", {GEN: {slot: i // 128 for i, slot in enumerate(slots)}})  # type: ignore[arg-type]
    keys = [(GEN, slot) for slot in slots] + [(GEN - 1, slot) for slot in own]

    async def written_then_read() -> list[tuple[EntryHead, int] | None]:
        for gen, slot in keys:
            await ledger.create_head(gen, slot, EntryHead(attempt=slot).to_bytes())
        kv.calls.clear()
        return await read_heads(ledger, [*keys, (GEN, "g-partition-never")])

    found = run_sync(written_then_read())
    assert kv.calls == {"get": 2 + 3 + 1}
    assert [f[0].attempt if f else None for f in found] == [slot for _, slot in keys] + [None]


@pytest.mark.unit
def test_a_listing_reads_the_packed_keys_of_its_batches_at_once() -> None:
    """A restart lists the packed keys of every batch not settled: each get waits here until
    all three are out, which one read after the other never are."""
    keys = [(gen, f"g-partition-{i}") for gen in (1, 2, 3) for i in range(2)]
    layouts = {gen: {slot: 0 for g, slot in keys if g == gen} for gen in (1, 2, 3)}

    class AllOut(MemoryBucket):
        gets = 0
        out = asyncio.Event()

        async def get(self, key: str):  # type: ignore[no-untyped-def]
            AllOut.gets += 1
            if AllOut.gets == 3:
                AllOut.out.set()
            await asyncio.wait_for(AllOut.out.wait(), 2)
            return await super().get(key)

    async def listed() -> list[tuple[int, str]]:
        kv = MemoryBucket()
        written = Ledger(kv, "lin", layouts)  # type: ignore[arg-type]
        for gen, slot in keys:
            await written.create_head(gen, slot, b"{}")
        reader = AllOut()
        reader.values = kv.values
        return (await Ledger(reader, "lin").listing()).heads  # type: ignore[arg-type]

    assert run_sync(listed()) == keys


@pytest.mark.unit
def test_two_processes_writing_one_key_keep_each_other_s_sections() -> None:
    kv = Counted()
    first, second = packed(kv), packed(kv)  # each with its own handle on the key

    async def interleaved() -> None:
        revisions = await asyncio.gather(
            *(
                (first if i % 2 else second).create_head(GEN, slot, b"{}")
                for i, slot in enumerate(SLOTS)
            )
        )
        assert all(revisions)
        # A compare-and-set on a revision another process moved on is refused, not the others.
        moved = await first.update_head(GEN, SLOTS[0], b'{"m":1}', revisions[0] or 0)
        assert moved
        stale, fresh = await asyncio.gather(
            second.update_head(GEN, SLOTS[0], b'{"m":2}', revisions[0] or 0),
            second.update_head(GEN, SLOTS[1], b'{"m":3}', revisions[1] or 0),
        )
        assert stale is None and fresh
        assert sorted(await packed(kv).heads()) == [(GEN, slot) for slot in sorted(SLOTS)]

    run_sync(interleaved())


@pytest.mark.unit
def test_a_write_whose_answer_was_lost_reads_as_refused_and_then_as_its_own() -> None:
    """As with a head's own key: the retry of a write that landed is refused, and the head read
    back is the one written (`ledger.own_write_or_taken_over`)."""
    kv = MemoryBucket()
    ledger = packed(kv)

    async def lost() -> None:
        mine = await ledger.create_head(GEN, SLOTS[0], b'{"a":1}')
        kv.lost_answer = lambda key: True
        assert await ledger.update_head(GEN, SLOTS[0], b'{"a":2}', mine or 0) is None
        kv.lost_answer = None
        stored = await ledger.get_head(GEN, SLOTS[0])
        assert stored is not None and stored.value == b'{"a":2}'

    run_sync(lost())


@pytest.mark.unit
def test_two_writes_of_one_slot_in_one_key_write_are_judged_one_after_the_other() -> None:
    """Two updates of one slot on the same revision, sent together: the second is judged on
    the first's write and refused."""
    ledger = packed(Counted())

    async def twice() -> None:
        first = await ledger.create_head(GEN, SLOTS[0], b'{"a":1}')
        again, later = await asyncio.gather(
            ledger.update_head(GEN, SLOTS[0], b'{"a":2}', first or 0),
            ledger.update_head(GEN, SLOTS[0], b'{"a":3}', first or 0),
        )
        assert again and later is None  # the second judged on the first's write

    run_sync(twice())


@pytest.mark.unit
def test_an_older_release_refuses_a_packed_key_with_its_one_line() -> None:
    kv = MemoryBucket()
    run_sync(packed(kv).create_head(GEN, SLOTS[0], b"{}"))
    key = f"lin.{GEN}.{packed_token(0)}"
    value, _ = kv.values[key]
    with pytest.raises(ConfigurationError, match="has format 4 but nats-spark"):
        EntryHead.from_bytes(value, key)


@pytest.mark.unit
def test_a_write_refused_on_what_the_process_knew_is_judged_again_on_a_read() -> None:
    """Another process removed the batch (the driver's purge): what this one knew of the key is
    stale, and a create of a slot it knew there succeeds, as on a head's own key."""
    kv = MemoryBucket()
    ledger, driver = packed(kv), packed(kv)

    async def created_again() -> int | None:
        await ledger.create_head(GEN, SLOTS[0], b'{"a":1}')
        await driver.delete_batch(GEN)
        return await ledger.create_head(GEN, SLOTS[0], b'{"a":2}')

    assert run_sync(created_again())


class Gated(MemoryBucket):
    """A memory bucket whose next get, once `hold` is set, reads the value as it is when sent
    and answers only once `hold` is set (`held` meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: asyncio.Event | None = None
        self.held = False

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        hold, self.hold = self.hold, None
        found = await super().get(key)
        if hold is not None:
            self.held = True
            await hold.wait()
        return found


@pytest.mark.unit
def test_a_read_never_joins_a_get_sent_before_it_was_asked() -> None:
    """A get in flight when another process's write ended may miss that write: a read asked
    after the write sends its own."""
    kv = Gated()
    ledger, other = packed(kv), packed(kv)

    async def read_after_a_write() -> tuple[bytes | None, bytes | None]:
        first = await other.create_head(GEN, SLOTS[0], b'{"a":1}')
        kv.hold = answer = asyncio.Event()
        early = asyncio.ensure_future(ledger.get_head(GEN, SLOTS[0]))
        while not kv.held:
            await asyncio.sleep(0)
        assert await other.update_head(GEN, SLOTS[0], b'{"a":2}', first or 0)
        late = asyncio.ensure_future(ledger.get_head(GEN, SLOTS[0]))
        await asyncio.sleep(0)
        answer.set()
        return (await early).value, (await late).value  # type: ignore[union-attr]

    early, late = run_sync(read_after_a_write())
    assert (early, late) == (b'{"a":1}', b'{"a":2}')
