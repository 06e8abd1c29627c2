"""Packed tasks read against a real server, driven through the batch coordinator as Spark calls it:
every slot's rows once, and the next batch's ack-only tasks ack them all."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
from spark_helpers import publish, static_group, unacked, wait_until

from nats_spark.jetstream.acks import InProgressKeeper
from nats_spark.jetstream.api import JetStreamApi
from nats_spark.loop import run_sync
from nats_spark.spark.group_source import ledger_protocol
from nats_spark.spark.group_source.driver import batch_coordinator, driver_ledger, group_target
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator
from nats_spark.spark.group_source.driver.consumer_listing import LIST_FROM
from nats_spark.spark.group_source.driver.offsets import SourceOffset
from nats_spark.spark.group_source.ledger import (
    EntryHead,
    EntryState,
    Ledger,
    LedgerBucket,
    read_head,
)
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.group_source.packed_heads import packed_token, task_layouts
from nats_spark.spark.group_source.slot_partition import PackedSlots, SlotPartition
from nats_spark.spark.group_source.task import slot_entry, slot_pulls, slot_reader
from nats_spark.spark.group_source.task.slot_reader import read_packed, read_slot


def packed_options(nats_url: str, stream: str, unique: str, tasks: str, **more: str) -> dict:
    """Options of a query of group `g` of `stream` whose slots `tasks` packed tasks read."""
    return {
        "servers": nats_url,
        "stream": stream,
        "group": "g",
        "maxTasksPerBatch": tasks,
        "ledgerBucket": f"L{unique}",
        **more,
    }


def two_slots_of_20(client, nats_url: str, stream: str, unique: str) -> dict:
    """The options of a query that reads `stream`'s static group of 2 partitions (100 messages
    published) in one packed task, 20 messages a slot."""
    static_group(client, stream, "g", ["m1", "m2"], partitions=2)
    publish(client, stream, 100)
    return packed_options(nats_url, stream, unique, "1", maxMessagesPerPartition="20")


SECOND = "partition-1"  # the second slot of `two_slots_of_20`'s query


def second_slot_closed_while(options: dict, unique: str, meanwhile: threading.Event) -> EntryHead:
    """The head of `SECOND`'s entry once the query's packed task was closed after its first
    rows, while `meanwhile` (a step of that slot made slow) was under way."""
    reader = BatchCoordinator(parse_options(options))
    try:
        task = first_packed_task(reader)
        assert [slot.slot for slot in task.slots] == ["partition-0", SECOND]
        closed_after_first_rows(task, meanwhile)
        head = entry_head(reader, unique, task.slots[1])
        assert head is not None
        return head
    finally:
        run_sync(reader.close())


def closed_after_first_rows(task: PackedSlots, meanwhile: threading.Event | None = None) -> None:
    """Read `task`'s first rows, then close it as Spark stops a task early, once `meanwhile`
    (a step of a slot made slow) is under way."""
    rows = read_packed(task)
    next(rows)
    assert meanwhile is None or meanwhile.wait(15)
    rows.close()


def entry_head(reader: BatchCoordinator, unique: str, slot: SlotPartition) -> EntryHead | None:
    """The head of `slot`'s ledger entry as the bucket (`L<unique>`) holds it now."""

    async def read() -> EntryHead | None:
        kv = await Ledger.bucket(reader.client, f"L{unique}", create=False)
        found = await read_head(Ledger(kv, slot.lineage, task_layouts([slot])), slot.gen, slot.slot)
        return None if found is None else found[0]

    return run_sync(read())


def assert_released_holding(head: EntryHead, count: int) -> None:
    """An entry left unsealed, released for a retry to take over at once, holding `count`."""
    assert (head.state, head.count, head.released) == (EntryState.OPEN, count, True)


def test_a_packed_task_reads_its_slots_slot_by_slot(client, nats_url, unique):
    stream = f"PACK{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 200)
    options = {"servers": nats_url, "stream": stream, "group": "g", "maxTasksPerBatch": "2"}
    reader = BatchCoordinator(parse_options({**options, "ledgerBucket": f"L{unique}"}))
    try:
        start = run_sync(reader.initial_offset())
        end = run_sync(reader.latest_offset(start, None))
        tasks = run_sync(reader.input_partitions(start, end))
        assert len(tasks) == 2 and all(isinstance(t, PackedSlots) for t in tasks)
        seqs: list[int] = []
        for task in tasks:
            assert isinstance(task, PackedSlots)
            assert len(task.slots) == 2
            seqs += [s for b in read_packed(task) for s in b.column("stream_seq").to_pylist()]
        assert sorted(seqs) == list(range(1, 201))
        following = run_sync(reader.latest_offset(end, None))
        for task in run_sync(reader.input_partitions(end, following)):
            assert isinstance(task, PackedSlots)
            assert list(read_packed(task)) == []  # ack-only
        wait_until(lambda: unacked(client, stream, "g") == 0, 30, "acks")
    finally:
        run_sync(reader.close())


def test_a_packed_task_claims_its_slots_at_once(client, nats_url, unique, monkeypatch):
    """A task of 8 slots claims all their entries together before it pulls (a claim is three
    round trips: a slot after another, four at a time, they were most of a packed task's time
    at 128 slots a task); closed after its first rows, it releases the entries of the slots it
    never ran or did not finish, so that a retry takes them over at once. The last slot's
    first pull is slow here, so that the close comes before it records (small slots all ran to
    their seals before the close on a quick machine; a record, once begun, runs to its end and,
    the slot's last, seals the entry)."""
    stream = f"PACKCLAIM{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=8)
    publish(client, stream, 800)
    options = packed_options(nats_url, stream, unique, "1", maxMessagesPerPartition="50")
    claiming = peak = 0
    claim = slot_entry.SlotEntry.claim

    async def counted_claim(entry, *args):
        nonlocal claiming, peak
        claiming += 1
        peak = max(peak, claiming)
        try:
            await claim(entry, *args)
        finally:
            claiming -= 1

    monkeypatch.setattr(slot_entry.SlotEntry, "claim", counted_claim)
    monkeypatch.setattr(slot_reader, "SLOTS_AT_ONCE", 4)
    reader = BatchCoordinator(parse_options(options))
    try:
        task = first_packed_task(reader)
        assert len(task.slots) == 8
        last, pulling_last = task.slots[-1].slot, threading.Event()
        chunks = slot_pulls.SlotPulls.chunks

        async def slow_pulls_of_the_last(pulls):
            if pulls.label == last:
                pulling_last.set()
                await asyncio.sleep(2)  # the task is closed meanwhile
            async for chunk in chunks(pulls):
                yield chunk

        monkeypatch.setattr(slot_pulls.SlotPulls, "chunks", slow_pulls_of_the_last)
        closed_after_first_rows(task, pulling_last)
        assert peak == 8  # four at a time, before
        found = [head for slot in task.slots if (head := entry_head(reader, unique, slot))]
        assert len(found) == 8
        sealed = [head.state is EntryState.SEALED for head in found]
        assert all(head.released or done for head, done in zip(found, sealed, strict=True)), [
            (h.state, h.released, h.count) for h in found
        ]
        assert not sealed[-1]  # closed before it pulled
    finally:
        run_sync(reader.close())


def test_a_slot_cancelled_before_its_first_step_releases_its_entry(
    client, nats_url, unique, monkeypatch
):
    """A task that ends in the loop round one of its slots starts in cancels that slot's steps
    before they ever ran (they are what releases an entry they end without sealing): its entry
    is released all the same, so that a retry takes it over at once instead of waiting for it
    to go quiet. Made certain here: every slot after the first is cancelled as it starts."""
    stream = f"PACKUNRUN{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 200)
    options = packed_options(nats_url, stream, unique, "1", maxMessagesPerPartition="20")

    class CancelledAsItStarts(slot_reader._SlotAhead):
        def __init__(self, reader, queued) -> None:
            super().__init__(reader, queued)
            if reader.partition is not task.slots[0]:
                self.running.cancel()

    monkeypatch.setattr(slot_reader, "_SlotAhead", CancelledAsItStarts)
    monkeypatch.setattr(slot_reader, "SLOTS_AT_ONCE", 2)
    reader = BatchCoordinator(parse_options(options))
    try:
        task = first_packed_task(reader)
        assert len(task.slots) == 4
        closed_after_first_rows(task)  # the second slot's steps were cancelled before they ran
        found = [entry_head(reader, unique, slot) for slot in task.slots[1:]]
        assert [head and head.released for head in found] == [True, True, True], found
    finally:
        run_sync(reader.close())


def not_knowing_its_last_record(monkeypatch) -> None:
    """Slots that do not know which record is their last (as when a pull ends with less than
    they may take): they seal in a write of its own, after their last rows."""
    monkeypatch.setattr(slot_pulls.SlotPulls, "over", lambda _: False)


@pytest.mark.parametrize("knows_last", [False, True])
def test_a_slot_cancelled_while_it_records_keeps_what_it_recorded_and_releases(
    client, nats_url, unique, monkeypatch, knows_last
):
    """A task that ends while one of its slots records (its write is slow here) lets the write
    finish: the slot gives none of what it recorded back (another reader of the consumer could
    take a message a retry then commits from the entry) and releases the entry at its revision
    after the write; or, when it knew the record was its last (it took its 20), the write
    sealed the entry, which a retry replays. Cut off from the write's end, it gave back all 20
    at c1ade61; on today's code its give-back fails at once instead (the cancelled write's
    `finish` raises), NAKing nothing, so this test no longer tells: the simulation's mutant
    `recorder-cut-off-from-its-write` does (early-stop worlds)."""
    if not knows_last:
        not_knowing_its_last_record(monkeypatch)
    options = two_slots_of_20(client, nats_url, f"PACKSLOWREC{unique}", unique)
    writing = threading.Event()
    update_head = Ledger.update_head

    async def slow_second_slot(ledger, gen, slot, *args):
        if slot == SECOND and not writing.is_set():  # its record's head write
            writing.set()
            await asyncio.sleep(2)  # a slow write: the task ends meanwhile
        return await update_head(ledger, gen, slot, *args)

    given_back: list[bytes] = []
    publish_acks = slot_reader.publish_acks

    async def naks_seen(nc, replies, kind):
        given_back.extend(replies)
        await publish_acks(nc, replies, kind=kind)

    monkeypatch.setattr(Ledger, "update_head", slow_second_slot)
    monkeypatch.setattr(slot_reader, "publish_acks", naks_seen)
    monkeypatch.setattr(slot_reader, "SLOTS_AT_ONCE", 2)
    head = second_slot_closed_while(options, unique, writing)
    if knows_last:
        assert (head.state, head.count) == (EntryState.SEALED, 20)
    else:
        assert_released_holding(head, 20)
    assert given_back == []


def test_a_slot_cancelled_while_it_seals_leaves_its_entry_sealed_or_released(
    client, nats_url, unique, monkeypatch
):
    """A task that ends while one of its slots seals (the seal's write is slow here: the task
    ends before it is sent) releases that slot's entry. The slot took its head for sealed
    before the write, so it skipped the release: the entry stayed OPEN and held, and the
    batch's next read stood by `HOLD_QUIET` for it (found by a foreachBatch that asks
    `isEmpty()` first: tests/spark/group_source/test_early_stops.py). A seal of its own: one
    with the last record is a record's write (above)."""
    not_knowing_its_last_record(monkeypatch)
    options = two_slots_of_20(client, nats_url, f"PACKSLOWSEAL{unique}", unique)
    sealing = threading.Event()
    update_head = Ledger.update_head

    async def slow_seal_of_second_slot(ledger, gen, slot, value, revision):
        sealed = EntryHead.from_bytes(value, slot).state is EntryState.SEALED
        if slot == SECOND and sealed:
            sealing.set()
            await asyncio.sleep(2)  # a slow write: the task ends meanwhile
        return await update_head(ledger, gen, slot, value, revision)

    monkeypatch.setattr(Ledger, "update_head", slow_seal_of_second_slot)
    assert_released_holding(second_slot_closed_while(options, unique, sealing), 20)


def test_a_slot_cancelled_while_its_keeper_stops_releases_its_entry(
    client, nats_url, unique, monkeypatch
):
    """A task that ends while one of its slots, done pulling, waits for its keeper's last
    round (slow here) releases that slot's entry: the cancel reached the keeper's task
    through the wait, and the release, which waits for that task again, never came. (A slot
    that knew its last record sealed with it, and has nothing to release.)"""
    not_knowing_its_last_record(monkeypatch)
    options = two_slots_of_20(client, nats_url, f"PACKSLOWKEEP{unique}", unique)
    stopping = threading.Event()
    run = InProgressKeeper.run

    async def slow_last_round_of_second_slot(keeper):
        await run(keeper)
        if keeper.label == f"slot {SECOND}":
            stopping.set()
            await asyncio.sleep(2)  # its last round's flush: the task ends meanwhile

    monkeypatch.setattr(InProgressKeeper, "run", slow_last_round_of_second_slot)
    assert_released_holding(second_slot_closed_while(options, unique, stopping), 20)


async def until(holds, what: str, timeout: float = 15.0) -> None:
    """Wait on the task's loop until `holds()`; fail naming `what` (a step that should run
    meanwhile did not: it waits for the one held)."""
    deadline = time.monotonic() + timeout
    while not holds():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        await asyncio.sleep(0.01)


def test_a_packed_task_claims_while_it_acks_and_marks_while_it_pulls(
    client, nats_url, unique, monkeypatch
):
    """The next batch's task acks what batch 0's left while its 4 slots claim their entries,
    and marks those entries acked while its slots pull: the ack flush here waits until all
    4 claims are done, the marks until a slot has recorded, and neither waits for the other
    (one after the other, at 256 slots and a steady rate, they were two fifths of a task's
    time). Before the task ends, the entries are marked."""
    stream = f"PACKOVERLAP{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 400)
    options = packed_options(nats_url, stream, unique, "1", maxMessagesPerPartition="50")
    done: Counter[str] = Counter()
    claim, record = slot_entry.SlotEntry.claim, slot_entry.SlotEntry.record
    send, mark = ledger_protocol.send_acks, ledger_protocol.mark_acked

    async def counted_claim(entry, *args):
        await claim(entry, *args)
        done["claimed"] += 1

    async def counted_record(entry, *args):
        found = await record(entry, *args)
        done["recorded"] += 1
        return found

    async def acks_after_the_claims(nc, commands, count):
        await until(lambda: done["claimed"] == 4, "the claims while the acks wait")
        return await send(nc, commands, count)

    async def marks_after_a_record(ledger, due):
        await until(lambda: done["recorded"] > 0, "a slot's record while the marks wait")
        await mark(ledger, due)

    monkeypatch.setattr(slot_entry.SlotEntry, "claim", counted_claim)
    monkeypatch.setattr(slot_entry.SlotEntry, "record", counted_record)
    monkeypatch.setattr(ledger_protocol, "send_acks", acks_after_the_claims)
    monkeypatch.setattr(ledger_protocol, "mark_acked", marks_after_a_record)
    reader = BatchCoordinator(parse_options(options))
    try:
        start = run_sync(reader.initial_offset())
        first = run_sync(reader.latest_offset(start, None))
        (task,) = run_sync(reader.input_partitions(start, first))
        assert isinstance(task, PackedSlots)
        read = {s for b in read_packed(task) for s in b.column("stream_seq").to_pylist()}
        assert len(read) == 200
        done.clear()
        following = run_sync(reader.latest_offset(first, None))
        (task,) = run_sync(reader.input_partitions(first, following))
        assert isinstance(task, PackedSlots) and len(task.slots) == 4
        more = [s for b in read_packed(task) for s in b.column("stream_seq").to_pylist()]
        assert more and not read & set(more)

        async def states() -> list:
            kv = await Ledger.bucket(reader.client, f"L{unique}", create=False)
            ledger = Ledger(kv, first.lineage, task_layouts(task.slots))
            return [(await read_head(ledger, first.gen, s.slot))[0].state for s in task.slots]

        assert run_sync(states()) == [EntryState.ACKED] * 4
    finally:
        run_sync(reader.close())


def first_slot_pulls_last(monkeypatch, task: PackedSlots, wait: float = 0.0) -> list[str]:
    """Make `task`'s first slot pull only once all its other slots have recorded their rows
    (and `wait` seconds more); returns the slots in the order their records were done."""
    recorded: list[str] = []
    record, pull = slot_entry.SlotEntry.record, slot_reader.SlotReader.pull_record_batches
    first, others = task.slots[0].slot, len(task.slots) - 1

    async def noted_record(entry, *args):
        found = await record(entry, *args)
        recorded.append(entry.partition.slot)
        return found

    async def first_pulls_last(self, *args):
        if self.partition.slot == first:
            await until(lambda: len(set(recorded)) == others, "the other slots' records")
            await asyncio.sleep(wait)
        async for batch in pull(self, *args):
            yield batch

    monkeypatch.setattr(slot_entry.SlotEntry, "record", noted_record)
    monkeypatch.setattr(slot_reader.SlotReader, "pull_record_batches", first_pulls_last)
    return recorded


def first_packed_task(reader: BatchCoordinator) -> PackedSlots:
    """The one packed task of the query's first batch."""
    start = run_sync(reader.initial_offset())
    end = run_sync(reader.latest_offset(start, None))
    (task,) = run_sync(reader.input_partitions(start, end))
    assert isinstance(task, PackedSlots)
    return task


def test_a_packed_task_starts_a_slot_as_another_s_steps_end(client, nats_url, unique, monkeypatch):
    """Two slots at a time of 6: the first slot's pull waits until all 5 others have recorded
    their rows. Each starts as one before it ends, ahead of the first (a slot's steps are round
    trips: a task of many slots waited for the slowest of each four before); their rows still
    come out slot by slot, in the task's order."""
    stream = f"PACKAHEAD{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=6)
    publish(client, stream, 600)
    options = packed_options(nats_url, stream, unique, "1", maxMessagesPerPartition="20")
    monkeypatch.setattr(slot_reader, "SLOTS_AT_ONCE", 2)
    reader = BatchCoordinator(parse_options(options))
    try:
        task = first_packed_task(reader)
        recorded = first_slot_pulls_last(monkeypatch, task)
        partitions = [p for b in read_packed(task) for p in b.column("partition").to_pylist()]
        assert len(partitions) == 120 and task.slots[0].slot not in recorded[:5]
        order = [int(s.slot.removeprefix("partition-")) for s in task.slots]
        assert partitions == sorted(partitions, key=order.index)
    finally:
        run_sync(reader.close())


def test_the_slots_ahead_of_a_packed_task_queue_within_their_bound(
    client, nats_url, unique, monkeypatch
):
    """While the first slot waits, the slots ahead queue their record batches up to the bound
    they share, not a bound each (16 slots at a time each queueing two batches would hold four
    times the rows 4 did): with a bound below a batch, one batch at a time; the others wait to
    queue theirs until the first slot's rows come out."""
    stream = f"PACKQUEUE{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=6)
    publish(client, stream, 600)
    options = packed_options(nats_url, stream, unique, "1", maxMessagesPerPartition="20")
    take = slot_reader.QueuedAhead.take
    peak, sizes = 0, []
    monkeypatch.setattr(slot_reader, "QUEUED_AHEAD", 1)

    async def noted_take(queued, slot, size):
        nonlocal peak
        counted = await take(queued, slot, size)
        peak = max(peak, queued.held)
        sizes.append(counted)
        return counted

    monkeypatch.setattr(slot_reader.QueuedAhead, "take", noted_take)
    reader = BatchCoordinator(parse_options(options))
    try:
        task = first_packed_task(reader)
        first_slot_pulls_last(monkeypatch, task, wait=0.2)  # they would queue then, unbound
        rows = [s for b in read_packed(task) for s in b.column("stream_seq").to_pylist()]
        assert len(set(rows)) == 120
        counted = [size for size in sizes if size]
        # one at a time (a slot waiting when its turn to emit comes queues uncounted)
        assert counted and peak == max(counted) < 2 * min(counted)
    finally:
        run_sync(reader.close())


class LedgerCalls:
    """The ledger bucket's requests while `on`, by what they ask: `get head`, `update chunk`..."""

    def __init__(self, monkeypatch) -> None:
        self.on = False
        self.counts: Counter[str] = Counter()
        for name in ("get", "create", "update", "put"):
            monkeypatch.setattr(
                LedgerBucket, name, self._counted(name, getattr(LedgerBucket, name))
            )
        send = ledger_protocol.send_acks

        async def counted_send(nc, commands, count):
            if self.on and commands:
                self.counts["ack flush"] += 1
            return await send(nc, commands, count)

        monkeypatch.setattr(ledger_protocol, "send_acks", counted_send)

    def _counted(self, name, call):
        async def counted(bucket, key, *args, **kwargs):
            if self.on:
                kind = (
                    "pointer" if key.startswith("query.") else ("head", "chunk")[key.count(".") > 2]
                )
                self.counts[f"{name} {kind}"] += 1
            return await call(bucket, key, *args, **kwargs)

        return counted


def test_a_packed_task_does_its_slots_ledger_work_together(client, nats_url, unique, monkeypatch):
    """8 slots in 2 tasks over 4 batches of a backlog, each slot taking 20 a batch: a slot's next
    messages come before what other slots took last batch, so every slot dedupes against the
    earlier entries. A task acks its slots' committed entries with one flush and reads the
    entries they dedupe against once for them all."""
    stream = f"PACKOPS{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=8)
    publish(client, stream, 1600)
    options = packed_options(nats_url, stream, unique, "2", maxMessagesPerPartition="20")
    reader = BatchCoordinator(parse_options(options))
    calls = LedgerCalls(monkeypatch)
    slot_batches = tasks_run = 0
    try:
        end = run_sync(reader.initial_offset())
        for _ in range(4):
            start, end = end, run_sync(reader.latest_offset(end, None))
            tasks = run_sync(reader.input_partitions(start, end))
            calls.on = True
            rows = sum(len(b) for task in tasks for b in read_packed(task))
            calls.on = False
            assert rows == sum(plan.limit for plan in end.slots.values())
            slot_batches += len(end.slots)
            tasks_run += len(tasks)
            run_sync(reader.commit(end))
    finally:
        run_sync(reader.close())
    assert calls.counts["ack flush"] <= tasks_run  # a slot's acks each, before
    gets = sum(count for what, count in calls.counts.items() if what.startswith("get"))
    # a slot acks (a head and a chunk) and claims (a head and the pointer); the earlier entries
    # are read once per task (5.75 a slot, before)
    assert gets / slot_batches < 5, calls.counts


def test_a_slot_that_takes_a_few_messages_writes_its_head_only(
    client, nats_url, unique, monkeypatch
):
    """8 slots in 2 tasks over 3 batches of 4 messages a slot: each slot's record is kept in its
    entry's head (ledger format 3), so no task writes a chunk, and the acks of the batch before
    read none (a put and a get a slot and batch, before); the record is the slot's last (it
    took what it was planned), so its head write seals the entry too: with the acked mark of
    the batch before, two head writes a slot and batch (three, before)."""
    stream = f"PACKINLINE{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=8)
    options = packed_options(nats_url, stream, unique, "2")
    reader = BatchCoordinator(parse_options(options))
    calls = LedgerCalls(monkeypatch)
    rows = 0
    try:
        end = run_sync(reader.initial_offset())
        for round in range(3):
            publish(client, stream, 32, start=32 * round)
            start, end = end, run_sync(reader.latest_offset(end, None))
            calls.on = True
            for task in run_sync(reader.input_partitions(start, end)):
                rows += sum(len(batch) for batch in read_packed(task))
            calls.on = False
            run_sync(reader.commit(end))
    finally:
        run_sync(reader.close())
    assert rows == 96
    assert calls.counts["put chunk"] == calls.counts["get chunk"] == 0, calls.counts
    assert calls.counts["update head"] <= 2 * 8 * 3, calls.counts


def test_planning_works_out_a_batchs_shared_facts_once(client, nats_url, unique, monkeypatch):
    """What every slot of a batch shares is worked out once a batch, not once per slot (per
    slot, planning grew with the square of the slots: 256 slots took 0.7 s a batch): the
    entries whose redeliveries tasks drop, the slots by consumer, and the group's consumers,
    which stay while the group's config does. 16 slots, 3 batches, 2 idle plans."""
    stream = f"PLANONCE{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=16)
    calls: Counter[str] = Counter()

    def counted(module, name):
        real = getattr(module, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    counted(driver_ledger.DriverLedger, "dedupe_spans")
    counted(batch_coordinator, "readers_by_consumer")
    counted(group_target, "_consumers")
    options = {"servers": nats_url, "stream": stream, "group": "g", "ledgerBucket": f"L{unique}"}
    reader = BatchCoordinator(parse_options({**options, "maxMessagesPerPartition": "5"}))
    batches = 0
    try:
        end = run_sync(reader.initial_offset())
        for round in range(5):
            if round < 3:
                publish(client, stream, 160, start=160 * round)
            start, end = end, run_sync(reader.latest_offset(end, None))
            if end is start:
                continue
            batches += 1
            for task in run_sync(reader.input_partitions(start, end)):
                for _ in read_packed(task) if isinstance(task, PackedSlots) else read_slot(task):
                    pass
            run_sync(reader.commit(end))
    finally:
        run_sync(reader.close())
    assert batches >= 3
    assert calls["dedupe_spans"] <= batches  # one stream
    assert calls["readers_by_consumer"] == batches
    assert calls["_consumers"] == 1, calls


def test_planning_reads_no_head_its_tasks_cannot_have_written(
    client, nats_url, unique, monkeypatch
):
    """`partitions()` of a batch the driver just planned reads none of that batch's heads (no
    task has it yet): it read them all, found none and forgot them, a round trip per slot and a
    walk over all entries per slot of every batch. 16 slots, 3 batches."""
    stream = f"PLANUNREAD{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=16)
    options = packed_options(nats_url, stream, unique, "2")
    reader = BatchCoordinator(parse_options(options))
    calls = LedgerCalls(monkeypatch)
    try:
        end = run_sync(reader.initial_offset())
        for round in range(3):
            publish(client, stream, 64, start=64 * round)
            start, end = end, run_sync(reader.latest_offset(end, None))
            assert len(end.slots) == 16
            calls.on = True
            tasks = run_sync(reader.input_partitions(start, end))
            calls.on = False
            for task in tasks:
                assert isinstance(task, PackedSlots)
                for _ in read_packed(task):
                    pass
            run_sync(reader.commit(end))
    finally:
        run_sync(reader.close())
    assert calls.counts["get head"] == 0, calls.counts  # 16 a batch, before


def test_planning_lists_the_consumers_of_a_stream_many_slots_read(
    client, nats_url, unique, monkeypatch
):
    """At 8 partitions and more, planning reads its consumers' infos from one `CONSUMER.LIST`
    page instead of a request each (an idle trigger too: at 256 slots, one request instead of
    256), and what it plans is the same: every message once."""
    stream = f"PACKLIST{unique}"
    partitions = LIST_FROM
    static_group(client, stream, "g", ["m1", "m2"], partitions=partitions)
    publish(client, stream, 160)
    asked: list[str] = []
    request = JetStreamApi.request

    async def noted(api, subject, body=None):
        asked.append(subject)
        return await request(api, subject, body)

    monkeypatch.setattr(JetStreamApi, "request", noted)
    reader = BatchCoordinator(parse_options(packed_options(nats_url, stream, unique, "2")))
    try:
        start = run_sync(reader.initial_offset())
        end = run_sync(reader.latest_offset(start, None))
        assert sum(plan.limit for plan in end.slots.values()) == 160
        seqs = [
            s
            for task in run_sync(reader.input_partitions(start, end))
            for b in read_packed(task)
            for s in b.column("stream_seq").to_pylist()
        ]
        assert sorted(seqs) == list(range(1, 161))
        asked.clear()
        idle = run_sync(reader.latest_offset(end, None))  # the acks' batch
        assert asked.count(f"CONSUMER.LIST.{stream}") == 1, asked
        slot_infos = [a for a in asked if a.startswith(f"CONSUMER.INFO.{stream}.g-partition-")]
        assert slot_infos == [], asked  # (the Go layout's member consumers are still watched)
        assert not any(plan.limit for plan in idle.slots.values())
    finally:
        run_sync(reader.close())


def test_packed_heads_share_their_task_s_key_and_a_batch_logged_before_keeps_a_key_each(
    client, nats_url, unique
):
    """A packed batch (offset version 2) keeps its slots' heads in one key of its task's; one
    logged by the release before (version 1, the same packing) runs again with a key per head,
    as its first run wrote them, and the next batch, packed, acks those entries and keeps its
    own heads in its task's key: exactly once across the upgrade."""
    stream = f"PACKHEADS{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 200)
    options = packed_options(nats_url, stream, unique, "1", maxMessagesPerPartition="30")
    reader = BatchCoordinator(parse_options(options))

    async def keys() -> list[str]:
        kv = await Ledger.bucket(reader.client, f"L{unique}", create=False)
        return sorted(k for k in await kv.keys_matching(">") if not k.startswith("query."))

    def read(start, end) -> list[int]:
        (task,) = run_sync(reader.input_partitions(start, end))
        assert isinstance(task, PackedSlots)
        return [s for b in read_packed(task) for s in b.column("stream_seq").to_pylist()]

    try:
        start = run_sync(reader.initial_offset())
        planned = run_sync(reader.latest_offset(start, None))
        assert planned.to_json()["v"] == 2
        logged_before = SourceOffset.from_json({**planned.to_json(), "v": 1})
        first = read(start, logged_before)
        assert len(first) == 120
        lineage = logged_before.lineage
        assert run_sync(keys()) == [f"{lineage}.1.partition-{p}" for p in range(4)]
        following = run_sync(reader.latest_offset(logged_before, None))
        second = read(logged_before, following)
        assert len(second) == 80 and not set(first) & set(second)
        assert [k for k in run_sync(keys()) if k.startswith(f"{lineage}.2.")] == [
            f"{lineage}.2.{packed_token(0)}"
        ]
        wait_until(lambda: unacked(client, stream, "g") == 80, 30, "batch 1's acks")

        async def batch_1_states() -> list[EntryState]:
            kv = await Ledger.bucket(reader.client, f"L{unique}", create=False)
            ledger = Ledger(kv, lineage)  # the heads' own keys
            return [(await read_head(ledger, 1, f"partition-{p}"))[0].state for p in range(4)]

        assert run_sync(batch_1_states()) == [EntryState.ACKED] * 4
    finally:
        run_sync(reader.close())
