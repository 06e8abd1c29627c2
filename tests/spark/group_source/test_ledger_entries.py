"""The ack ledger's entries on an in-memory bucket: a task's `SlotEntry` (claim, take over, a
zombie fenced by compare-and-set, seal, siblings), its `SlotHistory` (acks of committed entries,
dedupe of earlier batches) and the driver's `DriverLedger` (pointer, heads, settling, acks at
stop)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import time
import uuid
from collections.abc import AsyncGenerator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from memory_bucket import MemoryBucket, attempt
from spark_helpers import unkept

from nats_spark import clock
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConfigurationError, NatsSparkError
from nats_spark.jetstream import acks
from nats_spark.jetstream.pull import Deliveries
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.loop import run_sync
from nats_spark.requests_at_once import AT_ONCE
from nats_spark.spark.group_source import ledger, ledger_protocol
from nats_spark.spark.group_source.driver.driver_ledger import DriverLedger
from nats_spark.spark.group_source.driver.offsets import SlotPlan, SourceOffset
from nats_spark.spark.group_source.driver.sealed_keeper import SealedKeeper
from nats_spark.spark.group_source.ledger import (
    EntryHead,
    EntryState,
    Ledger,
    LedgerConflict,
    Pointer,
    PointerReads,
    read_deliveries,
    read_head,
    read_pointer,
    write_pointer,
)
from nats_spark.spark.group_source.ledger_protocol import Horizon
from nats_spark.spark.group_source.slot_partition import (
    ConsumerSighting,
    Recreation,
    SlotPartition,
    SlotReading,
)
from nats_spark.spark.group_source.task import slot_reader
from nats_spark.spark.group_source.task.columns import SlotColumns
from nats_spark.spark.group_source.task.slot_entry import SlotEntry
from nats_spark.spark.group_source.task.slot_history import (
    DedupeReads,
    SlotHistory,
    ack_committed_together,
    mark_acked_together,
)
from tests.simulation import scheduler
from tests.simulation.scheduler import START_TIME, VirtualLoop

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("short_holds")]

PREFIX = b"$JS.ACK.S.c1"


@pytest.fixture
def kv() -> MemoryBucket:
    return MemoryBucket()


def log_updates(
    kv: MemoryBucket, monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, object]]
) -> None:
    """From now on, each update of `kv` appends ("update", its key) to `steps`."""
    update = kv.update

    async def updating(key: str, value: bytes, last: int) -> int:
        steps.append(("update", key))
        return await update(key, value, last)

    monkeypatch.setattr(kv, "update", updating)


@pytest.fixture
def given_back(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The ack commands the ledger protocol sends (NAKs of give-backs, acks), as sent."""
    sent: list[bytes] = []

    async def send(nc: object, commands: list[bytes], count: int) -> int:
        sent.extend(commands)
        return count

    monkeypatch.setattr(ledger_protocol, "send_acks", send)
    return sent


@pytest.fixture
def lineage() -> str:
    """A lineage of its own per test: workers keep what they read of entries by lineage."""
    return uuid.uuid4().hex


def input_partition(lineage: str, gen: int = 1, slot: str = "m1", **fields: Any) -> SlotPartition:
    base: dict[str, Any] = dict(
        reading=SlotReading(ConnectionSettings(), "ledger", 100, 1.0, False, True),
        pointer_key="query.S.g",
        lineage=lineage,
        gen=gen,
        slot=slot,
        stream="S",
        consumer="c1",
        priority_group="PCG",
        member=slot,
        partitioned=False,
        limit=100,
        pin_id="pin-1",
        committed=(),
        dedupe=(),
    )
    return SlotPartition(**{**base, **fields})


def claimed(kv: MemoryBucket, p: SlotPartition) -> SlotEntry:
    """A task attempt's entry, claimed (its client is never used: the ledger is given)."""
    entry = attempt(kv, p)
    run_sync(entry.claim())
    return entry


def take(entry: SlotEntry, seqs: list[int], delivered: int = 1) -> tuple[list[int], set[int]]:
    """Record deliveries of `seqs` (stream and consumer sequence alike); returns the stream
    sequences of the rows handed out and what was dropped."""
    return run_sync(recording(entry, seqs, delivered))


async def recording(
    entry: SlotEntry, seqs: list[int], delivered: int
) -> tuple[list[int], set[int]]:
    columns = SlotColumns("S", entry.partition.member, False, False)
    for seq in seqs:
        columns.add(b"S.k", b"%d" % seq, None, delivered, seq, seq, 0)
    replies = [b"%b.%d.%d.%d.0.0" % (PREFIX, delivered, seq, seq) for seq in seqs]
    rows, dropped = await entry.record(columns, replies, entry.head.pin, time.monotonic())
    return rows.column("stream_seq").to_pylist(), dropped


def stored(kv: MemoryBucket, lineage: str, gen: int, slot: str = "m1") -> tuple[Any, list[int]]:
    """The head of entry (gen, slot) and the stream sequences it holds, read back."""
    ledger = Ledger(kv, lineage)
    found = run_sync(read_head(ledger, gen, slot))
    assert found is not None
    return found[0], run_sync(read_deliveries(ledger, found[0])).stream_seq


def sealed(kv: MemoryBucket, lineage: str, gen: int, seqs: list[int], slot: str = "m1") -> None:
    entry = claimed(kv, input_partition(lineage, gen, slot, pin_id=f"pin-{gen}"))
    if seqs:
        take(entry, seqs)
    run_sync(entry.seal())


LAST_DELIVERED = 40  # the consumer sequence of the consumer's last delivery, as CLIENT says


async def _consumer_info(stream: str, consumer: str) -> ConsumerInfo:
    return ConsumerInfo({"delivered": {"stream_seq": 9, "consumer_seq": LAST_DELIVERED}})


CLIENT: Any = SimpleNamespace(nc=None, denied=[], api=SimpleNamespace(consumer_info=_consumer_info))


# SlotEntry


def test_a_retry_of_a_sealed_entry_replays_exactly_it(kv: MemoryBucket, lineage: str) -> None:
    first = claimed(kv, input_partition(lineage))
    assert take(first, [1, 2, 3]) == ([1, 2, 3], set())
    run_sync(first.seal())
    head, seqs = stored(kv, lineage, 1)
    assert (head.state, head.count, head.max_seq, head.pin, seqs) == (
        EntryState.SEALED,
        3,
        3,
        "pin-1",
        [1, 2, 3],
    )
    retry = claimed(kv, input_partition(lineage))
    assert retry.fixed and retry.recorded_earlier.stream_seq == [1, 2, 3]


def test_a_retry_takes_an_open_entry_over_and_the_zombie_is_fenced(
    kv: MemoryBucket, lineage: str
) -> None:
    zombie = claimed(kv, input_partition(lineage))
    take(zombie, [1, 2])
    retry = claimed(kv, input_partition(lineage))
    assert not retry.fixed and retry.recorded_earlier.stream_seq == [1, 2] and retry.taken == {1, 2}
    assert retry.head.attempt != zombie.head.attempt
    take(retry, [3])
    with pytest.raises(LedgerConflict):
        take(zombie, [4])  # its revision is stale: nothing of it lands
    with pytest.raises(LedgerConflict):
        run_sync(zombie.seal())
    run_sync(retry.seal())
    head, seqs = stored(kv, lineage, 1)
    assert (head.state, seqs) == (EntryState.SEALED, [1, 2, 3])


def test_a_zombie_that_records_after_its_entry_was_removed_leaves_no_chunk(
    kv: MemoryBucket, lineage: str
) -> None:
    """A zombie's chunks are written before its head: once the entry is gone (settled, or given
    back), its head write fails and nothing would remove the chunk until the bucket's max age."""
    zombie = claimed(kv, input_partition(lineage))
    take(zombie, [1])
    run_sync(Ledger(kv, lineage).delete_entry(1, "m1"))
    with pytest.raises(LedgerConflict):
        take(zombie, [2])
    assert not [key for key in kv.values if key.startswith(lineage)]


def cancel_a_zombie_s_record(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch, call: str, key: str | None
) -> None:
    """A zombie (its entry removed since its last record) records once more and is cancelled
    while the bucket's `call` (naming `key`; None: any) has landed or been read and its answer
    is still out; the cancellation must still leave nothing of the lineage in the bucket."""
    zombie = claimed(kv, input_partition(lineage))
    take(zombie, [1])
    run_sync(Ledger(kv, lineage).delete_entry(1, "m1"))
    original = getattr(kv, call)

    async def cancelled_while_its_answer_is_out() -> None:
        reached, answered = asyncio.Event(), asyncio.Event()

        async def held(held_key: str, *args: Any) -> Any:
            try:  # done at the server; its answer (a value or an error) is out
                answer = await original(held_key, *args)
            finally:
                if key is None or held_key == key:
                    reached.set()
                    await answered.wait()
            return answer

        monkeypatch.setattr(kv, call, held)
        recording_more = asyncio.ensure_future(recording(zombie, [2], 1))
        await reached.wait()
        recording_more.cancel()
        answered.set()
        with pytest.raises(asyncio.CancelledError):
            await recording_more

    run_sync(cancelled_while_its_answer_is_out())
    assert not [key for key in kv.values if key.startswith(lineage)]


def test_a_zombie_cancelled_once_its_head_write_failed_still_removes_its_chunk(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same when the attempt is cancelled while it reads the head after its failed write (a
    packed task cancels its other slots when one fails; seed 1893 of the simulation's worlds
    with another client, packed tasks and pauses): nothing of its write is in flight then."""
    head_key = Ledger(kv, lineage).head_key(1, "m1")
    cancel_a_zombie_s_record(kv, lineage, monkeypatch, "get", head_key)


def test_a_zombie_cancelled_while_its_chunk_write_is_out_still_removes_its_chunk(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same when the attempt is cancelled while its chunk write's answer is out, before it
    sent its head write (seed 1861 of the simulation's worlds with packed tasks and pauses): the
    record runs to its end, so its failed head write removes the chunk."""
    cancel_a_zombie_s_record(kv, lineage, monkeypatch, "put", None)


def test_a_zombie_leaves_the_chunks_a_retry_adopted(kv: MemoryBucket, lineage: str) -> None:
    """The zombie's write lands, its answer is lost, and a retry takes the entry over (naming
    that write's chunk) before the zombie reads the head again: its write fails, and the chunk
    stays, as the retry's entry needs it."""
    zombie = claimed(kv, input_partition(lineage))
    key = Ledger(kv, lineage).head_key(1, "m1")

    def retry_takes_over(written: str) -> bool:
        if written != key:
            return False
        previous = EntryHead.from_bytes(kv.values[key][0], key)
        retry = ledger_protocol.take_over(previous, "pin-2", "retry")
        kv.values[key] = (retry.to_bytes(), kv.last_seq)
        return True

    kv.lost_answer = retry_takes_over
    with pytest.raises(LedgerConflict):
        take(zombie, [1])
    kv.lost_answer = None
    head, seqs = stored(kv, lineage, 1)
    assert head.attempt != zombie.head.attempt and seqs == [1]


def test_a_retry_reads_again_when_the_zombie_records_while_it_takes_over(
    kv: MemoryBucket, lineage: str
) -> None:
    """The zombie records once more between the retry's read of the open entry and its
    compare-and-set: the retry reads the entry again and takes it over with that record too,
    rather than fail (a zombie that kept recording could fail every attempt of its task)."""
    zombie = claimed(kv, input_partition(lineage))
    take(zombie, [1, 2])
    retry = attempt(kv, input_partition(lineage))
    update = kv.update

    async def zombie_records_first(key: str, value: bytes, last: int) -> int:
        kv.update = update  # type: ignore[method-assign]
        await recording(zombie, [3], 1)
        return await update(key, value, last)

    kv.update = zombie_records_first  # type: ignore[method-assign]
    run_sync(retry.claim())
    assert (
        retry.recorded_earlier.stream_seq == [1, 2, 3] and retry.head.attempt != zombie.head.attempt
    )
    with pytest.raises(LedgerConflict):
        take(zombie, [4])
    take(retry, [5])
    assert stored(kv, lineage, 1)[1] == [1, 2, 3, 5]


def test_a_retry_stands_by_for_a_live_holder_and_replays_its_seal(
    kv: MemoryBucket, lineage: str
) -> None:
    """Issue 45, hole 5: an attempt that finds another's OPEN entry moving (a speculative copy
    beside a live attempt) does not take it over: it waits for the seal and replays it."""
    holder = claimed(kv, input_partition(lineage))
    take(holder, [1, 2])
    copy = attempt(kv, input_partition(lineage))

    async def beside() -> None:
        claiming = asyncio.ensure_future(copy.claim())
        for seq in range(3, 8):  # the holder goes on: its head moves
            await asyncio.sleep(ledger_protocol.HOLD_QUIET / 2)
            await recording(holder, [seq], 1)
        await holder.seal()
        await claiming

    run_sync(beside())
    assert copy.fixed and copy.recorded_earlier.stream_seq == [1, 2, 3, 4, 5, 6, 7]
    assert stored(kv, lineage, 1)[0].attempt == holder.head.attempt


def test_a_released_entry_is_taken_over_at_once(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt that fails (or is closed) before it seals releases its entry: its retry takes
    it over without standing by; one killed -9 leaves it to stand still for HOLD_QUIET."""
    monkeypatch.setattr(ledger_protocol, "HOLD_QUIET", 60.0)
    failed = claimed(kv, input_partition(lineage))
    take(failed, [1, 2])
    run_sync(failed.release())
    retry = attempt(kv, input_partition(lineage))
    run_sync(asyncio.wait_for(retry.claim(), 5))
    assert not retry.fixed and retry.recorded_earlier.stream_seq == [1, 2]
    assert stored(kv, lineage, 1)[0].attempt == retry.head.attempt


def test_an_attempt_that_never_claimed_its_entry_releases_nothing(
    kv: MemoryBucket, lineage: str
) -> None:
    """An attempt that ends before it claims (an ack-only partition, a failed claim) has no
    entry to release: a head write on revision 0 would create one, released."""
    run_sync(attempt(kv, input_partition(lineage)).release())
    assert run_sync(read_head(Ledger(kv, lineage), 1, "m1")) is None


def test_an_attempt_whose_seal_failed_releases_its_entry(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seal whose write fails leaves the attempt's head OPEN, so that its release still marks
    the entry released (a retry then takes it over at once, not after HOLD_QUIET)."""
    entry = claimed(kv, input_partition(lineage))
    take(entry, [1, 2])

    async def refused(key: str, value: bytes, last: int) -> int:
        raise RuntimeError("the seal's write failed")

    with monkeypatch.context() as failing:
        failing.setattr(kv, "update", refused)
        with pytest.raises(RuntimeError):
            run_sync(entry.seal())
    run_sync(entry.release())
    head = stored(kv, lineage, 1)[0]
    assert (head.state, head.released) == (EntryState.OPEN, True)


def test_a_first_attempt_that_loses_the_create_takes_the_winner_over(
    kv: MemoryBucket, lineage: str
) -> None:
    winner = attempt(kv, input_partition(lineage))
    loser = claimed(kv, input_partition(lineage))  # created it first ...
    run_sync(winner.claim())  # ... so this one finds it open and takes it over
    with pytest.raises(LedgerConflict):
        take(loser, [1])
    take(winner, [2])
    assert stored(kv, lineage, 1)[1] == [2]


def test_siblings_never_both_emit_a_redelivered_message(
    kv: MemoryBucket, lineage: str, caplog: pytest.LogCaptureFixture
) -> None:
    a = claimed(kv, input_partition(lineage, slot="c#0", siblings=("c#1",)))
    b = claimed(kv, input_partition(lineage, slot="c#1", siblings=("c#0",)))
    take(a, [1, 2, 3])
    rows, dropped = take(b, [3, 4], delivered=2)  # 3 came back to b after a took it
    assert (rows, dropped) == ([4], {3})
    assert stored(kv, lineage, 1, "c#1")[1] == [4]
    assert stored(kv, lineage, 1, "c#0")[1] == [1, 2, 3]  # a emitted 3: the warning says so
    assert "this slot drops them (the sibling emits them" in caplog.text


def test_what_the_batch_holds_is_the_slot_s_records_and_its_siblings(
    kv: MemoryBucket, lineage: str
) -> None:
    """What a refusal's advice must not start past (`Recreation.starting_by`): a run again of
    the batch replays every slot's records; a slot without siblings reads nothing for it."""
    a = claimed(kv, input_partition(lineage, slot="c#0", siblings=("c#1",)))
    b = claimed(kv, input_partition(lineage, slot="c#1", siblings=("c#0",)))
    take(a, [4, 5, 6])
    b.taken.update([7, 8])  # as its acceptance took them, before their record
    take(b, [7, 8])
    assert run_sync(b.held_by_the_batch()) == {4, 5, 6, 7, 8}
    alone = claimed(kv, input_partition(lineage, slot="m1"))
    alone.taken.add(9)
    reads = kv.reads
    assert run_sync(alone.held_by_the_batch()) == {9}
    assert kv.reads == reads


def test_a_sibling_counts_a_late_take_from_its_pull_request(kv: MemoryBucket, lineage: str) -> None:
    """A task's process paused between the server's send of a delivery and its take (a GC):
    the ack wait ran out meanwhile, and a sibling took the redelivery and recorded it first.
    Taken late as a first delivery, the message is checked against the siblings' records and
    dropped: its age counts from the pull request, not from the take, and a renewal (`+WPI`)
    before the take covers nothing of it."""
    a = claimed(kv, input_partition(lineage, slot="c#0", siblings=("c#1",), ack_wait=4.0))
    b = claimed(kv, input_partition(lineage, slot="c#1", siblings=("c#0",), ack_wait=4.0))
    assert take(b, [3], delivered=2) == ([3], set())
    columns = SlotColumns("S", a.partition.member, False, False)
    columns.add(b"S.k", b"3", None, 1, 3, 3, 0)
    now = clock.monotonic()
    columns.taken_from(now - 5.0)  # the request went out 5 s ago; taken just now
    replies = [b"%b.1.3.3.0.0" % PREFIX]
    rows, dropped = run_sync(a.record(columns, replies, a.head.pin, now - 6.0))
    assert (rows.num_rows, dropped) == (0, {3})


# SlotHistory


def test_a_task_acks_its_committed_entries_once(
    kv: MemoryBucket, lineage: str, published_acks: list[bytes]
) -> None:
    sealed(kv, lineage, 1, [1, 2])
    sealed(kv, lineage, 2, [])
    claimed(kv, input_partition(lineage, 3))  # open: a batch not committed, never acked
    p = input_partition(lineage, 4, committed=(1, 2, 3))
    assert run_sync(SlotHistory(CLIENT, Ledger(kv, lineage), p).ack_committed()) == 2
    assert published_acks == [b"$JS.ACK.S.c1.1.1.1.0.0", b"$JS.ACK.S.c1.1.2.2.0.0"]
    assert stored(kv, lineage, 1)[0].state is EntryState.ACKED
    assert stored(kv, lineage, 3)[0].state is EntryState.OPEN
    # the zombie beside its retry (or the retry itself) finds them acked
    assert run_sync(SlotHistory(CLIENT, Ledger(kv, lineage), p).ack_committed()) == 0
    assert len(published_acks) == 2


def test_a_task_of_packed_slots_acks_all_their_committed_entries_with_one_flush(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes: list[int] = []

    async def send(nc: object, commands: list[bytes], count: int) -> int:
        flushes.append(count)
        return count

    monkeypatch.setattr(ledger_protocol, "send_acks", send)
    sealed(kv, lineage, 1, [1, 2], slot="m1")
    sealed(kv, lineage, 1, [3], slot="m2")
    sealed(kv, lineage, 2, [4], slot="m2")
    sealed(kv, lineage, 1, [5], slot="m3")
    reads_before = kv.reads
    partitions = [
        input_partition(lineage, 3, "m1", committed=(1,)),
        input_partition(lineage, 3, "m2", committed=(1, 2)),
        input_partition(lineage, 3, "m3", committed=()),  # nothing due
    ]
    histories = [SlotHistory(CLIENT, Ledger(kv, lineage), p) for p in partitions]
    acked = run_sync(ack_committed_together(CLIENT, histories))
    assert flushes == [4]  # the four messages of the three due entries, in one flush
    assert kv.reads - reads_before == 3  # a head per due entry (it holds its record), as alone
    assert stored(kv, lineage, 1, "m1")[0].state is EntryState.SEALED  # marked next, meanwhile
    run_sync(mark_acked_together(acked))
    reads_before = kv.reads
    # each slot's own step finds them acked: nothing read or sent again
    assert [run_sync(h.ack_committed()) for h in histories] == [0, 0, 0]
    assert flushes == [4] and kv.reads == reads_before
    for slot, gen in (("m1", 1), ("m2", 1), ("m2", 2)):
        assert stored(kv, lineage, gen, slot)[0].state is EntryState.ACKED
    assert stored(kv, lineage, 1, "m3")[0].state is EntryState.SEALED  # not this batch's due


def test_refused_acks_fail_and_stay_due(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client: Any = SimpleNamespace(nc=None, denied=[])

    async def refused(nc: object, commands: list[bytes], count: int) -> int:
        client.denied.append('Permissions Violation for Publish to "$JS.ACK.S.c1.1.1.1.0.0"')
        return count

    monkeypatch.setattr(ledger_protocol, "send_acks", refused)
    sealed(kv, lineage, 1, [1])
    history = SlotHistory(client, Ledger(kv, lineage), input_partition(lineage, 2, committed=(1,)))
    with pytest.raises(ConfigurationError, match=r"allow the user to publish to \$JS.ACK.S.>"):
        run_sync(history.ack_committed())
    assert stored(kv, lineage, 1)[0].state is EntryState.SEALED


def test_dedupe_holds_earlier_batches_and_reads_a_sealed_entry_once(
    kv: MemoryBucket, lineage: str
) -> None:
    sealed(kv, lineage, 1, [1, 2])
    sealed(kv, lineage, 3, [5])  # gen 2 has no entry of m1
    take(claimed(kv, input_partition(lineage, 4)), [9])  # open: emitted nothing
    p = input_partition(lineage, 5, dedupe=(("m1", 1, 4),))
    assert run_sync(SlotHistory(CLIENT, Ledger(kv, lineage), p).dedupe()) == {1, 2, 5}
    reads = kv.reads
    assert run_sync(SlotHistory(CLIENT, Ledger(kv, lineage), p).dedupe()) == {1, 2, 5}
    assert kv.reads - reads == 1  # the open gen 4 is looked at again


def test_a_task_of_packed_slots_reads_the_entries_they_dedupe_against_once(
    kv: MemoryBucket, lineage: str
) -> None:
    sealed(kv, lineage, 1, [1, 2], slot="m1")
    sealed(kv, lineage, 1, [3], slot="m2")
    spans = (("m1", 1, 1), ("m2", 1, 1))
    partitions = [input_partition(lineage, 2, slot, dedupe=spans) for slot in ("m1", "m2", "m3")]
    histories = [SlotHistory(CLIENT, Ledger(kv, lineage), p) for p in partitions]
    shared = DedupeReads(histories)
    for history in histories:
        history.shared = shared
    reads = kv.reads

    async def all_slots_at_once() -> list[set[int]]:
        return list(await asyncio.gather(*(h.dedupe() for h in histories)))

    assert run_sync(all_slots_at_once()) == [{1, 2, 3}] * 3
    assert kv.reads - reads == 2  # the head of each entry (it holds its record), once for all
    assert run_sync(histories[0].dedupe()) == {1, 2, 3}
    assert kv.reads - reads == 2


# SlotReader: an attempt failing mid-batch


class _Pulled:
    """A slot's pulls (`SlotPulls`) whose one request delivered `chunk`, taken `taken_after`
    seconds after the request was sent."""

    def __init__(self, chunk: Deliveries, taken_after: float = 0.0) -> None:
        self.chunk = chunk
        self.taken_after = taken_after

    async def chunks(self) -> AsyncGenerator[tuple[Deliveries, float], None]:
        yield self.chunk, clock.monotonic() - self.taken_after

    def took(self, taken: int, acked: int) -> None:
        return None

    def over(self) -> bool:
        return False  # as after a pull that brought less than the slot may take


class _Consumer:
    """The slot's pull consumer: no request of it is still out."""

    pin_id = None

    def requested_since(self) -> float:
        return clock.monotonic()

    async def collect_late(self, patience: float) -> Deliveries:
        return Deliveries()

    async def close(self) -> None:
        return None


def first_deliveries(*seqs: int) -> Deliveries:
    """First deliveries of `seqs` (stream and consumer sequence alike), as a pull hands them."""
    found = Deliveries()
    for seq in seqs:
        found.subjects.append(b"S.k")
        found.replies.append(b"%b.1.%d.%d.0.0" % (PREFIX, seq, seq))
        found.data.append(b"%d" % seq)
        found.headers.append(None)
    return found


def captured_acks(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, expected: bytes
) -> list[bytes]:
    """The ack subjects `module` publishes from now on (`publish_acks`), all of kind `expected`."""
    captured: list[bytes] = []

    async def publish_acks(nc: object, replies: list[bytes], kind: bytes = acks.ACK) -> int:
        assert kind == expected
        captured.extend(replies)
        return len(replies)

    monkeypatch.setattr(module, "publish_acks", publish_acks)
    return captured


def one_pull_attempt(
    monkeypatch: pytest.MonkeyPatch,
    kv: MemoryBucket,
    p: SlotPartition,
    pulled: _Pulled,
    consumer: _Consumer | None = None,
) -> slot_reader.SlotReader:
    """A first attempt of `p` whose one pull delivers `pulled`'s chunk (on `consumer`: by
    default, no request of it is still out)."""
    monkeypatch.setattr(slot_reader, "SlotPulls", lambda *_: pulled)
    slot_consumer = consumer or _Consumer()
    client: Any = SimpleNamespace(nc=None, pull_consumer=lambda *_, **__: slot_consumer)
    reader = slot_reader.SlotReader(p, client)
    reader.entry.ledger = Ledger(kv, p.lineage)
    return reader


def given_back_by_failing_attempt(
    monkeypatch: pytest.MonkeyPatch,
    kv: MemoryBucket,
    p: SlotPartition,
    chunk: Deliveries,
    error: type[Exception],
) -> list[bytes]:
    """A first attempt of `p` whose one pull delivered `chunk` and whose acceptance of it fails
    with `error`: the ack subjects it NAKed as it stopped."""
    naked = captured_acks(monkeypatch, slot_reader, acks.NAK)
    reader = one_pull_attempt(monkeypatch, kv, p, _Pulled(chunk))

    async def pulling() -> None:
        await reader.begin()
        async for _ in reader.pull_record_batches():
            raise AssertionError("nothing was taken")

    with pytest.raises(error):
        run_sync(pulling())
    return naked


def test_a_chunk_whose_dedupe_read_fails_is_given_back_whole(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The earlier batch's entry a chunk may hold redeliveries of was given back by a new
    checkpoint between the reads of its head and its chunk: the attempt fails, and NAKs what
    the chunk delivered (the keeper holds none of it), which else would wait out its ack wait,
    behind newer messages of its keys."""
    monkeypatch.setattr(ledger, "INLINE_BYTES", -1)  # a record in a chunk, as a big one
    sealed(kv, lineage, 1, [1, 2])
    for key in run_sync(kv.keys_matching(f"{lineage}.1.m1.>")):
        run_sync(kv.remove(key))  # the head is read yet
    p = input_partition(lineage, 2, dedupe=(("m1", 1, 1),), dedupe_through=2)
    chunk = first_deliveries(2, 3)
    assert given_back_by_failing_attempt(monkeypatch, kv, p, chunk, NatsSparkError) == (
        chunk.replies
    )


def test_a_chunk_of_a_consumer_created_again_is_given_back_whole(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a new consumer delivers again, at or below the ack floor, stops the batch before
    any of its chunk is taken: all of it is given back, what came after the floor too."""
    sighting = ConsumerSighting(10, 0, Recreation("recreate it at ", 11))
    p = input_partition(lineage, 1, consumer_sighting=sighting)
    chunk = first_deliveries(1, 2, 12)
    assert given_back_by_failing_attempt(monkeypatch, kv, p, chunk, ConfigurationError) == (
        chunk.replies
    )


class _TakenOverThenGivenBack(_Pulled):
    """Pulls delivering 1, then 2, after which another attempt of the query takes the entry
    over; a redelivery of 1 comes to a request still out once the attempt's write found that,
    as a new checkpoint's give-back removes the entry (when `given_back`) and NAKs 1."""

    def __init__(self, kv: MemoryBucket, p: SlotPartition, given_back: bool) -> None:
        super().__init__(first_deliveries(1))
        self.ledger = Ledger(kv, p.lineage)
        self.given_back = given_back

    async def chunks(self) -> AsyncGenerator[tuple[Deliveries, float], None]:
        yield first_deliveries(1), clock.monotonic()
        while not (found := await read_head(self.ledger, 1, "m1")) or not found[0].count:
            await asyncio.sleep(0)  # 1's record lands
        head, revision = found
        taker = dataclasses.replace(head, attempt="bbbbbbbbbbbb")
        await ledger.write_head(self.ledger, 1, "m1", taker, revision)
        yield first_deliveries(2), clock.monotonic()

    def consumer(self) -> _Consumer:
        pulls = self

        class _LateRedelivery(_Consumer):
            async def collect_late(self, patience: float) -> Deliveries:
                if pulls.given_back:
                    await pulls.ledger.delete_entry(1, "m1")
                return redelivered(1)

        return _LateRedelivery()


def redelivered(seq: int) -> Deliveries:
    """The second delivery of `seq` (consumer sequence 10 more)."""
    found = Deliveries()
    found.subjects.append(b"S.k")
    found.replies.append(b"%b.2.%d.%d.0.0" % (PREFIX, seq, seq + 10))
    found.data.append(b"%d" % seq)
    found.headers.append(None)
    return found


@pytest.mark.parametrize("given_back", [True, False])
def test_a_redelivery_that_came_after_the_take_over_is_given_back_once_the_entry_is(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch, given_back: bool
) -> None:
    """An attempt that lost its entry to another attempt of the query leaves a recorded message
    that came again to it to that attempt's keeper (seed 851). Not once a new checkpoint's
    give-back removed the entry meanwhile: the give-back NAKed the delivery the entry named,
    and the redelivery came to this attempt after; left unNAKed, it would wait out its ack
    wait behind newer messages of its key (seed 1141 of the worlds of mutant
    cancelled-record-leaves-its-chunks). 2, unrecorded, is given back either way."""
    naked = captured_acks(monkeypatch, slot_reader, acks.NAK)
    p = input_partition(lineage, 1)
    pulled = _TakenOverThenGivenBack(kv, p, given_back)
    reader = one_pull_attempt(monkeypatch, kv, p, pulled, pulled.consumer())

    async def pulling() -> None:
        await reader.begin()
        async for _ in reader.pull_record_batches():
            pass

    with pytest.raises(ledger.TakenOver):
        run_sync(pulling())
    expected = first_deliveries(2).replies + (redelivered(1).replies if given_back else [])
    assert naked == expected


def renewed_as_taken(
    monkeypatch: pytest.MonkeyPatch, kv: MemoryBucket, p: SlotPartition, taken_after: float
) -> list[bytes]:
    """A first attempt of `p` whose one pull delivered messages 1 and 2, taken `taken_after`
    seconds after the request was sent and recorded: the ack subjects whose wait it restarted
    before the keeper's first round."""
    renewed = captured_acks(monkeypatch, acks, acks.IN_PROGRESS)
    reader = one_pull_attempt(monkeypatch, kv, p, _Pulled(first_deliveries(1, 2), taken_after))

    async def pulling() -> list[int]:
        await reader.begin()
        return [
            s
            for b in [b async for b in reader.pull_record_batches()]
            for s in b.column("stream_seq").to_pylist()
        ]

    assert run_sync(pulling()) == [1, 2]
    return renewed


@pytest.mark.parametrize(("taken_after", "renewed"), [(2.0, [1, 2]), (0.1, [])])
def test_a_chunk_taken_late_has_its_ack_wait_restarted_as_it_is_taken(
    kv: MemoryBucket,
    lineage: str,
    monkeypatch: pytest.MonkeyPatch,
    taken_after: float,
    renewed: list[int],
) -> None:
    """What a request delivers may reach the task half the ack wait after the request was sent
    (`SlotPullPolicy`), and a nats-server restarted meanwhile counts the wait from the whole
    second before the delivery (`encodeConsumerState`): left to the keeper's next round, a third
    of the wait later, a 4 s wait could run out first. Taken more than a sixth of the wait after
    its request, a chunk has its wait restarted at once; taken sooner, it waits for the round
    (a `+WPI` per message is not free)."""
    p = input_partition(lineage, 1, ack_wait=4.0)
    expected = first_deliveries(*renewed).replies
    assert renewed_as_taken(monkeypatch, kv, p, taken_after) == expected


def test_a_take_over_restarts_the_wait_of_what_it_took_over_before_its_reads(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry restarts the ack wait of what it took over before its take-over's write (seed
    110 of the simulation's slow-ledger worlds with a 4 s wait: one ran out in the write) and
    again as it lands, before the fence and sibling reads, a round trip or more each (seed
    18241 of the worlds with another client: a redelivery a sibling had dropped as recorded ran
    out in them). Its keeper goes on with what is left once the claim dropped what a sibling
    recorded too."""
    p = input_partition(lineage, slot="c#0", siblings=("c#1",), ack_wait=4.0)
    failed = claimed(kv, p)
    take(failed, [1, 2])
    run_sync(failed.release())
    take(claimed(kv, input_partition(lineage, slot="c#1", siblings=("c#0",))), [2])
    steps: list[tuple[str, object]] = []
    get = kv.get

    async def getting(key: str) -> Any:
        steps.append(("get", key))
        return await get(key)

    async def renewing(nc: object, commands: list[bytes], count: int) -> int:
        assert all(b"+WPI" in command for command in commands)
        steps.append(("+WPI", count))
        return count

    monkeypatch.setattr(kv, "get", getting)
    log_updates(kv, monkeypatch, steps)
    monkeypatch.setattr(acks, "send_acks", renewing)
    retry = slot_reader.SlotReader(p, SimpleNamespace(nc=None))  # type: ignore[arg-type]
    retry.entry.ledger = Ledger(kv, lineage)

    async def claiming() -> list[int]:
        await retry.claim()
        await retry.stop_keeping()
        return list(retry.keeper.held)

    assert run_sync(claiming()) == [1]  # 2 is the sibling's to keep
    taken_over = steps.index(("update", Ledger(kv, lineage).head_key(1, "c#0")))
    assert steps[taken_over - 1 : taken_over + 2] == [
        ("+WPI", 2),
        ("update", Ledger(kv, lineage).head_key(1, "c#0")),
        ("+WPI", 2),
    ]


def test_a_take_over_keeps_what_it_took_over_through_the_claims_later_reads(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its take-over's write the claim reads the pointer (the fence) and its siblings'
    entries, each a ledger round trip: under slow answers they took 4.1 s, and a keeper whose
    rounds began once the claim was done came a third of the 6 s wait later still, after the
    wait restarted as the write landed had run out (seed 662 of the simulation's slow-ledger
    worlds with early stops). Its rounds start as the write lands: here a fence read of 1 s under
    a 0.6 s wait (a round every 0.2 s) meets four of them."""
    p = input_partition(lineage, ack_wait=0.6)
    failed = claimed(kv, p)
    take(failed, [1, 2])
    run_sync(failed.release())
    steps: list[tuple[str, object]] = []
    get = kv.get

    async def getting(key: str) -> Any:
        if key == p.pointer_key:
            steps.append(("fence read", key))
            await asyncio.sleep(1.0)
            steps.append(("fence read", "answered"))
        return await get(key)

    async def renewing(nc: object, commands: list[bytes], count: int) -> int:
        assert all(b"+WPI" in command for command in commands)
        steps.append(("+WPI", count))
        return count

    monkeypatch.setattr(kv, "get", getting)
    monkeypatch.setattr(acks, "send_acks", renewing)
    retry = slot_reader.SlotReader(p, SimpleNamespace(nc=None))  # type: ignore[arg-type]
    retry.entry.ledger = Ledger(kv, lineage)

    async def claiming() -> None:
        await retry.claim()
        await retry.stop_keeping()

    scheduler.run(VirtualLoop(), claiming())
    fence = steps.index(("fence read", p.pointer_key))
    answered = steps.index(("fence read", "answered"))
    assert steps[fence + 1 : answered] == [("+WPI", 2)] * 4


def test_a_take_over_the_fence_refuses_keeps_nothing(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take-over's keeper rounds start as its write lands; when the fence then refuses the
    claim (the attempt outlived its batch, settled meanwhile), what it took over is not its to
    keep, and the rounds end with the claim."""
    p = input_partition(lineage, ack_wait=0.6)
    failed = claimed(kv, p)
    take(failed, [1, 2])
    run_sync(failed.release())
    run_sync(write_pointer(kv, "query.S.g", Pointer(lineage, 2, settled=1)))
    renewed: list[int] = []

    async def renewing(nc: object, commands: list[bytes], count: int) -> int:
        renewed.append(count)
        return count

    monkeypatch.setattr(acks, "send_acks", renewing)
    retry = slot_reader.SlotReader(p, SimpleNamespace(nc=None))  # type: ignore[arg-type]
    retry.entry.ledger = Ledger(kv, lineage)

    async def claiming() -> list[int]:
        with pytest.raises(LedgerConflict, match="outlived"):
            await retry.claim()
        refused = len(renewed)
        await asyncio.sleep(2.0)
        return renewed[refused:]

    assert scheduler.run(VirtualLoop(), claiming()) == []
    assert renewed  # the restarts before and as the take-over's write landed


def test_an_attempt_restarts_the_wait_of_what_it_recorded_before_it_releases_its_entry(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a released entry holds is kept by nobody until its taker restarts it, seconds later
    (a batch's full read starts once the job reading its tasks first ends; the claim is three
    ledger round trips or more): seed 52 of the simulation's slow-ledger worlds with a 6 s wait,
    where it ran out first and another client took a message the batch committed. An attempt
    restarts it before its release, even half a second after its keeper's last round (a seal
    would not, under a sixth of a 12 s wait), but only what surely still has its wait running: a
    delivery held since more than half the wait (`surely_running`) may be another reader's."""
    now = [1000.0]
    monkeypatch.setattr(clock, "_source", lambda: now[0])
    steps: list[tuple[str, object]] = []

    async def renewing(nc: object, commands: list[bytes], count: int) -> int:
        assert all(b"+WPI" in command for command in commands)
        steps.append(("+WPI", count))
        return count

    monkeypatch.setattr(acks, "send_acks", renewing)
    p = input_partition(lineage, ack_wait=12.0)
    reader = slot_reader.SlotReader(p, SimpleNamespace(nc=None))  # type: ignore[arg-type]
    reader.entry.ledger = Ledger(kv, lineage)
    run_sync(reader.claim())
    take(reader.entry, [1, 2])
    reader.keeper.hold([1, 2], first_deliveries(1, 2).replies, now[0])
    reader.keeper.hold([3], first_deliveries(3).replies, now[0] - 7.0)  # may have run out
    log_updates(kv, monkeypatch, steps)
    reader.keeper.renewed = now[0]
    now[0] += 0.5
    run_sync(reader.abandon())
    assert steps == [("+WPI", 2), ("update", Ledger(kv, lineage).head_key(1, "m1"))]


@pytest.mark.parametrize("given_back", [False, True])
def test_a_closed_attempt_leaves_a_recorded_delivery_that_came_again_to_its_release(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch, given_back: bool
) -> None:
    """An attempt Spark closed holds 2, recorded, delivered to it again (its wait ran out in a
    stall). Neither closed nor failed tells it who has the entry; its release does. Landed, a
    retry of the query takes the entry over and commits 2: the attempt restarts the wait of the
    later delivery (the taker's `+WPI` then keeps it), where a NAK let another client of the
    consumer take it first (seed 723 of the simulation's slow-ledger worlds with early stops).
    Refused, a new checkpoint's give-back took the entry, whose NAK of 2 is what may have
    brought it again: the attempt NAKs it, or it waits out its wait behind newer messages of its
    key (seed 162)."""
    now = [1000.0]
    monkeypatch.setattr(clock, "_source", lambda: now[0])
    steps: list[tuple[str, object]] = []

    async def acking(nc: object, commands: list[bytes], count: int) -> int:
        sent = b"".join(commands)
        steps.append(("-NAK" if b"-NAK" in sent else "+WPI" if b"+WPI" in sent else "?", count))
        return count

    monkeypatch.setattr(acks, "send_acks", acking)
    p = input_partition(lineage, ack_wait=12.0)
    reader = slot_reader.SlotReader(p, SimpleNamespace(nc=None))  # type: ignore[arg-type]
    reader.entry.ledger = Ledger(kv, lineage)
    run_sync(reader.claim())
    take(reader.entry, [1, 2])
    reader.keeper.hold([1, 2], first_deliveries(1, 2).replies, now[0])
    now[0] += 1.0
    reader.keeper.redelivered(2, b"$JS.ACK.S.C.2.2.3.0.0", now[0])
    consumer: Any = _Consumer()
    recorder = slot_reader.Recorder(reader.entry, reader.keeper, consumer)
    recorder.recorded.update((1, 2))
    # Closed (neither taken over nor lost): it gives back nothing it recorded, 2 neither, and
    # leaves 2 to its release.
    run_sync(reader.give_back_unrecorded(recorder, consumer, kept_by_taker=False, lost=False))
    assert reader.came_again_undecided and steps == []
    if given_back:
        run_sync(ledger_protocol._taken_from_its_attempt(Ledger(kv, lineage), 1, "m1"))
    log_updates(kv, monkeypatch, steps)
    run_sync(reader.abandon())
    key = Ledger(kv, lineage).head_key(1, "m1")
    later = ("-NAK", 1) if given_back else ("+WPI", 1)
    assert steps == [("+WPI", 1), ("update", key), later]


# DriverLedger


def driver(kv: MemoryBucket) -> DriverLedger:
    ledger = DriverLedger("S", "query.S.g")
    ledger.attach(kv)
    return ledger


def test_the_pointer_hands_lineage_gen_and_pins_to_a_restarted_driver(kv: MemoryBucket) -> None:
    first = driver(kv)
    assert run_sync(first.adopt(None))
    first.pins = {"m1": "pin-1"}
    offset = run_sync(first.new_offset({"m1": SlotPlan(5)}))
    assert (offset.lineage, offset.gen) == (first.lineage, 1)
    restarted = driver(kv)
    assert run_sync(restarted.adopt(None))
    assert (restarted.lineage, restarted.head_gen) == (first.lineage, 1)
    assert restarted.pins == {"m1": "pin-1"}
    assert restarted.last_query_pins == {"pin-1"}


def test_a_pin_only_the_last_query_s_entries_hold_is_its_own_for_a_new_checkpoint(
    kv: MemoryBucket,
) -> None:
    """A query killed before its driver planned past the batch whose task took the pin: the
    pointer does not name the pin, the batch's entry does. A query on a new checkpoint counts
    it as the last query's (released once that query's driver is found dead, not waited out);
    the same checkpoint's next driver takes it as its own."""
    first = driver(kv)
    run_sync(first.adopt(None))
    run_sync(first.new_offset({"m1": SlotPlan(5)}))
    assert first.lineage is not None
    sealed(kv, first.lineage, 1, [1, 2])
    new_checkpoint = driver(kv)
    run_sync(new_checkpoint.adopt(SourceOffset.initial("another")))
    assert new_checkpoint.last_query_pins == {"pin-1"}
    same = driver(kv)
    run_sync(same.adopt(None))
    assert same.pins == {"m1": "pin-1"} and same.last_query_pins == frozenset()


def test_the_pointer_hands_the_consumers_as_last_seen_to_the_lineages_next_driver(
    kv: MemoryBucket,
) -> None:
    """Each consumer's creation time and ack floor outlive the driver (one record each, rewritten
    with the pointer); a driver of another lineage (a new checkpoint) does not take them, nor
    does one reading a pointer written before they were kept."""
    first = driver(kv)
    assert run_sync(first.adopt(None))
    seen = {"S": {"C": ["2026-11-28T19:00:00Z", 41]}}
    first.seen.remember(seen)
    run_sync(first.new_offset({"m1": SlotPlan(5)}))
    run_sync(first.new_offset({"m1": SlotPlan(5)}))
    pointer = run_sync(read_pointer(kv, "query.S.g"))
    assert pointer is not None and pointer.consumers == seen
    restarted = driver(kv)
    assert run_sync(restarted.adopt(None))
    assert restarted.seen.stored() == seen
    assert restarted.seen.next_after_acked("S", "C") == 42
    other = driver(kv)
    assert run_sync(other.adopt(SourceOffset.initial(uuid.uuid4().hex)))
    assert other.seen.stored() == {}
    older = {k: v for k, v in vars(pointer).items() if k != "consumers"}
    run_sync(kv.put("query.S.g", json.dumps({"format": 2, **older}).encode()))
    assert run_sync(driver(kv).adopt(None))


def test_only_an_entry_a_removal_left_is_taken_for_one_that_came_back() -> None:
    """An adopting driver removes again what a server restarted uncleanly brought back: an entry
    of a fenced gen missing chunks, or sealed with messages below the second newest gen that
    has entries. The newest committed batch's sealed entries, waiting for the next batch's
    acks, and any entry past the fence are the query's."""
    head = EntryHead(EntryState.SEALED, "a", ["L.3.m1.a.0"], 2, max_seq=9)
    listed = frozenset({"L.3.m1.a.0"})
    came_back = ledger_protocol.came_back
    assert not came_back(head, 3, fenced=3, kept_from=3, listed=listed)  # may wait for acks
    assert came_back(head, 2, fenced=3, kept_from=3, listed=listed)  # acked before 3 committed
    assert came_back(head, 3, fenced=3, kept_from=3, listed=frozenset())  # its chunk removed
    assert not came_back(head, 4, fenced=3, kept_from=9, listed=frozenset())  # past the fence
    acked = EntryHead(EntryState.ACKED, "a", ["L.3.m1.a.0"], 2, max_seq=9)
    assert not came_back(acked, 1, fenced=3, kept_from=9, listed=listed)  # kept, acks lost


def test_a_lineage_taken_up_again_after_initial_offset_keeps_its_consumers_as_seen(
    kv: MemoryBucket,
) -> None:
    """A restarted checkpoint whose first batch Spark runs again: `initialOffset` begins another
    lineage (the pointer then names it, the first replaced), and the batch's offset takes the
    first up again. Its consumers as its last driver saw them come back with it, from this
    driver or the next one; given back, the replaced lineages' go too."""
    first = driver(kv)
    assert run_sync(first.adopt(None))
    seen = {"S": {"C": ["2026-11-28T19:00:00Z", 41]}}
    first.seen.remember(seen)
    logged = run_sync(first.new_offset({"m1": SlotPlan(5)}))
    restarted = driver(kv)
    run_sync(restarted.adopt(SourceOffset.initial(uuid.uuid4().hex)))
    run_sync(restarted.clear_pins())
    assert restarted.seen.stored() == {}
    restarted.forget_lineage()
    assert run_sync(restarted.adopt(logged))
    assert restarted.seen.stored() == seen
    again = driver(kv)  # killed before it planned: the next one takes it up the same way
    assert run_sync(again.adopt(logged))
    assert again.seen.stored() == seen
    run_sync(again.give_back_replaced(CLIENT))
    run_sync(again.save_pointer())
    pointer = run_sync(read_pointer(kv, "query.S.g"))
    assert pointer is not None and pointer.replaced_consumers == {}


def test_heads_tell_pins_unacked_and_sealed_entries(kv: MemoryBucket, lineage: str) -> None:
    sealed(kv, lineage, 1, [1, 2, 3])
    sealed(kv, lineage, 2, [4, 5])
    sealed(kv, lineage, 2, [], slot="m2")
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 2)))
    assert sorted(ledger.entries) == [(1, "m1"), (2, "m1"), (2, "m2")]
    assert ledger.pins == {"m1": "pin-2", "m2": "pin-2"}  # the newest entry's, per slot
    assert sorted(ledger.unacked()) == [("m1", 2), ("m1", 3), ("m2", 0)]
    assert ledger.has_sealed()
    assert ledger.acks_due(1) == {"m1": (1,)}
    assert ledger.committed_unacked(1) == {"m1": 3}  # what m1's next task acks before it pulls
    assert ledger.committed_unacked(2) == {"m1": 5, "m2": 0}


def test_what_a_batch_run_again_holds_is_told_apart_from_what_was_committed(
    kv: MemoryBucket, lineage: str
) -> None:
    """Judging a consumer created again as batch 2, logged and not committed, runs again: its
    entries (open ones too: a retry takes them over and replays them) hold what it replays,
    apart from what committed batches emitted; at planning (no batch run again) they hold
    nothing read."""
    sealed(kv, lineage, 1, [1, 2])
    take(claimed(kv, input_partition(lineage, 2)), [4, 5])
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 2)))
    within = range(1, 10)
    assert run_sync(ledger.held_seqs(["m1"], within, 1, 2)) == ({1, 2}, {4, 5})
    assert run_sync(ledger.held_seqs(["m1"], within, 1)) == ({1, 2}, set())


class KeeperRounds:
    """The driver's keeper (12 s ack wait) of batch 1's entry of `lineage`, claimed holding
    `seqs`, on a clock of its own (`now`, from 1000 s); `look(at)` runs a round at `at` seconds
    and counts the deliveries it restarted (each `+WPI`)."""

    def __init__(
        self, kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch, seqs: list[int]
    ) -> None:
        self.now = 1000.0
        monkeypatch.setattr(clock, "_source", lambda: self.now)
        self.restarted: list[int] = []
        monkeypatch.setattr(acks, "send_acks", self._send)
        self.entry = claimed(kv, input_partition(lineage, 1))
        take(self.entry, seqs)
        self.ledger = driver(kv)
        run_sync(self.ledger.adopt(SourceOffset(lineage, 1)))
        self.keeper = SealedKeeper(lambda: CLIENT, self.ledger, ack_wait=12.0)

    async def _send(self, nc: object, commands: list[bytes], count: int) -> int:
        assert all(command.endswith(b" 4\r\n+WPI\r\n") for command in commands)
        self.restarted.append(count)
        return count

    def look(self, at: float) -> int:
        self.now = 1000.0 + at
        self.restarted.clear()
        run_sync(self.keeper.renew())
        return sum(self.restarted)


def test_the_driver_restarts_the_ack_wait_of_sealed_entries_only_before_it_runs_short(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper looks every twelfth of the ack wait (a second here). An entry first found
    sealed at 1 s was sealed after the look at 0 s, with at least five sixths of its 12 s wait
    left (`SlotReader.seal`): it expires at 10 s at the earliest. It is restarted at the first look
    after which less than a third (4 s) would be left at the next look: at 6 s; then again at
    14 s. A keeper's first look (a restarted driver) restarts every sealed entry at once."""
    rounds = KeeperRounds(kv, lineage, monkeypatch, [1, 2, 3])
    look, ledger = rounds.look, rounds.ledger
    assert look(0) == 0  # open: nothing to keep
    run_sync(rounds.entry.seal())
    assert [look(t) for t in range(1, 6)] == [0] * 5
    assert look(6) == 3
    assert [look(t) for t in range(7, 14)] == [0] * 7
    assert look(14) == 3

    again = SealedKeeper(lambda: CLIENT, ledger, ack_wait=12.0)
    rounds.now = 1012.0
    wpi = [b"$JS.ACK.S.c1.1.%d.%d.0.0" % (s, s) for s in (1, 2, 3)]
    assert run_sync(again.due()) == (acks.ack_commands(wpi, acks.IN_PROGRESS), 3)

    # Under a short ack wait (3 s: a look every 0.25 s) two thirds are kept: restarted at the
    # second look that finds it sealed, as before.
    short = SealedKeeper(lambda: CLIENT, ledger, ack_wait=3.0)
    rounds.now = 2000.0
    short.lineage, short.looked, short.started = lineage, rounds.now - 0.25, {}  # not sealed then
    assert run_sync(short.due()) == ([], 0)
    rounds.now += 0.25
    assert run_sync(short.due())[1] == 3

    # Shortened once a consumer with a shorter wait comes into view: as if started with it.
    shortened = SealedKeeper(lambda: CLIENT, ledger, ack_wait=12.0)
    shortened.shorten(3.0)
    assert (shortened.wait, shortened.left, shortened.ack_wait) == (
        short.wait,
        short.left,
        short.ack_wait,
    )


def test_the_driver_keeps_a_released_entry_until_an_attempt_takes_it_over(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt Spark closed early releases its entry holding what it recorded, and the full
    read's attempt that takes it over may start only after the early job's other task ends,
    past the ack wait (seeds 280, 735 of the slow-ledger worlds with early stops): the keeper
    restarts the wait of a released entry's deliveries as it does a sealed one's, dated a sixth
    of the wait earlier (the taker may seal it right after the look): found open at 0 s (due
    again from 6 s), restarted at 6 s and 12 s; taken over, its taker keeps it."""
    monkeypatch.setattr(ledger_protocol, "HOLD_QUIET", 60.0)
    rounds = KeeperRounds(kv, lineage, monkeypatch, [1, 2])
    look = rounds.look
    assert look(0) == 0  # open and held: its holder keeps it
    run_sync(rounds.entry.release())
    assert [look(t) for t in range(1, 6)] == [0] * 5
    assert look(6) == 2
    assert [look(t) for t in range(7, 12)] == [0] * 5
    assert look(12) == 2
    taker = attempt(kv, input_partition(lineage, 1))
    run_sync(asyncio.wait_for(taker.claim(), 5))
    assert [look(t) for t in range(13, 30)] == [0] * 17


def test_the_sealed_keeper_reads_an_entry_only_once_its_wait_may_be_due(
    kv: MemoryBucket, lineage: str, published_acks: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch planned after a look, sealed, and acked by the next batch's task before its wait
    may be due is not read at any look until then (its wait started no earlier than 2 s before
    that look: due from 6 s on); found acked then, it is read by neither the keeper nor planning
    again. Another lineage adopted: its entries may be due at once."""
    now = [1000.0]
    monkeypatch.setattr(clock, "_source", lambda: now[0])
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 0)))
    keeper = SealedKeeper(lambda: CLIENT, ledger, ack_wait=12.0)
    assert run_sync(keeper.due()) == ([], 0)  # the look at 0 s: nothing planned yet
    ledger.expect(1, ["m1"])
    sealed(kv, lineage, 1, [1, 2, 3])
    reads = kv.reads
    for at in range(1, 6):
        now[0] = 1000.0 + at
        assert run_sync(keeper.due()) == ([], 0)
    assert kv.reads == reads
    p = input_partition(lineage, 2, committed=(1,))
    assert run_sync(SlotHistory(CLIENT, Ledger(kv, lineage), p).ack_committed()) == 3
    now[0] = 1006.0
    reads = kv.reads
    assert run_sync(keeper.due()) == ([], 0)
    assert kv.reads == reads + 1  # its head, found acked
    for at in (7.0, 20.0):
        now[0] = 1000.0 + at
        run_sync(keeper.due())
    run_sync(ledger.load_unacked_heads())
    assert kv.reads == reads + 1

    other = uuid.uuid4().hex
    sealed(kv, other, 1, [4])
    run_sync(ledger.adopt(SourceOffset(other, 1)))
    assert run_sync(keeper.due())[1] == 1  # at 20 s, as at a restart


def test_the_sealed_keeper_reads_the_chunks_of_due_entries_at_once(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry of one-message pulls has a chunk per message: read one after the other, a round
    over two such entries of 3,600 chunks each took 27 s on a loaded machine, far past the 1 s
    wait it was to restart, and every message came back. The round reads them at once."""
    for slot in ("m1", "m2"):
        entry = claimed(kv, input_partition(lineage, 1, slot))
        for seq in range(1, 41):
            take(entry, [seq])
        run_sync(entry.seal())
    in_flight, most = [0], [0]
    read_chunk = Ledger.read_chunk

    async def counted(self: Ledger, key: str) -> bytes:
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0)
        in_flight[0] -= 1
        return await read_chunk(self, key)

    monkeypatch.setattr(Ledger, "read_chunk", counted)
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 1)))
    keeper = SealedKeeper(lambda: CLIENT, ledger, ack_wait=12.0)
    assert run_sync(keeper.due())[1] == 80
    assert most[0] == AT_ONCE  # as many as one caller keeps in flight


def test_a_keeper_round_slower_than_its_period_does_not_put_off_the_next() -> None:
    """Rounds are due a third of the ack wait after the previous one started: one whose flush
    took most of the period is followed at once, not a third of the wait later (rounds 0.6 s
    apart under a 1 s wait let messages come back on a loaded machine)."""
    loop = VirtualLoop()
    started: list[float] = []

    class SlowRounds(acks.InProgressKeeper):
        async def renew(self) -> None:
            started.append(loop.time())
            await asyncio.sleep(0.4 if len(started) < 3 else 0.1)
            if len(started) == 5:
                self.stop()

    scheduler.run(loop, SlowRounds(None, ack_wait=0.6, label="slot").run())  # type: ignore[arg-type]
    gaps = [round(later - earlier, 6) for earlier, later in itertools.pairwise(started)]
    assert started[0] == pytest.approx(START_TIME + 0.2)
    assert gaps == [0.4, 0.4, 0.2, 0.2]


def test_a_checkpoints_first_batch_gives_back_an_entry_created_after_its_driver_adopted(
    kv: MemoryBucket, lineage: str, given_back: list[bytes]
) -> None:
    """Spark 4.0/4.1 plan a new checkpoint's first batch (gen 3) in the stored lineage; its
    earlier gens are an earlier query's. A task attempt of that query that creates its gen-2
    entry after the new driver adopted the lineage (and before the fence) is given back too:
    else its messages would stay held, their redeliveries dropped as emitted. One that creates
    it after the fence finds it."""
    sealed(kv, lineage, 1, [1, 2])
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 3)))
    zombie = claimed(kv, input_partition(lineage, gen=2))
    take(zombie, [3])
    run_sync(ledger.give_back_before(CLIENT, 3))
    assert run_sync(Ledger(kv, lineage).heads()) == []
    assert b"".join(given_back).count(b"-NAK") == 3
    late = attempt(kv, input_partition(lineage, gen=2))
    with pytest.raises(LedgerConflict):
        run_sync(late.claim())
    assert run_sync(Ledger(kv, lineage).heads()) == []


def test_a_retry_fenced_by_a_give_back_leaves_what_its_entry_holds_to_be_given_back(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch, given_back: list[bytes]
) -> None:
    """Seed 3182 of the replaced-mid-batch worlds: an attempt of the stopped query recorded 1
    and 2 in its gen-2 entry and crashed; a new checkpoint's first batch (gen 3, Spark 4.0/4.1)
    fenced gen 2, and a retry of the stopped query took the entry over before the give-back
    listed the entries. The retry stops at the fence; had it removed the entry, nothing would
    name 1 and 2, which waited out their ack wait behind newer messages of their keys. It
    leaves it, and the give-back NAKs them."""
    crashed = claimed(kv, input_partition(lineage, gen=2))
    take(crashed, [1, 2])
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 3)))
    retry = attempt(kv, input_partition(lineage, gen=2))
    listing = Ledger.heads

    async def retry_takes_over_first(self: Ledger) -> list[tuple[int, str]]:
        with pytest.raises(LedgerConflict, match="outlived"):
            await retry.claim()
        return await listing(self)

    monkeypatch.setattr(Ledger, "heads", retry_takes_over_first)
    run_sync(ledger.give_back_before(CLIENT, 3))
    assert retry.taken == {1, 2}  # it took the entry over before it found the fence
    assert b"".join(given_back).count(b"-NAK") == 2
    assert run_sync(Ledger(kv, lineage).listing()).heads == []


def test_a_give_back_takes_the_entry_from_an_attempt_still_recording_in_it(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch, given_back: list[bytes]
) -> None:
    """A task attempt of the earlier query records in its OPEN entry while a new checkpoint's
    driver gives the entry back. Had it recorded after the give-back read what to NAK, that
    delivery would be removed un-NAKed and wait out its ack wait behind newer messages of its
    key; the give-back takes the entry first, so that write fails (found by seed 39465)."""
    zombie = claimed(kv, input_partition(lineage))
    take(zombie, [1, 2])
    read = read_deliveries
    recorded_meanwhile: list[int] = []

    async def zombie_records_meanwhile(ledger: Ledger, head: Any) -> Any:
        with contextlib.suppress(LedgerConflict):
            recorded_meanwhile.extend((await recording(zombie, [3], 1))[0])
        return await read(ledger, head)

    monkeypatch.setattr(ledger_protocol, "read_deliveries", zombie_records_meanwhile)
    run_sync(ledger_protocol.give_back(CLIENT, Ledger(kv, lineage), [(1, "m1")], unkept))
    assert recorded_meanwhile == []
    assert b"".join(given_back).count(b"-NAK") == 2


def test_a_give_back_takes_the_entry_from_an_attempt_whose_write_answered_as_a_conflict(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch, given_back: list[bytes]
) -> None:
    """Seed 13576 of the replaced-mid-batch worlds: an attempt's write recording 2 took effect
    and answered as a conflict (its answer lost, the retry found the revision moved on); before
    it read the head back, a new checkpoint's give-back took the entry from it. Had the give-back
    rewritten the head as it was, the attempt would take it for its own write, record 3 on the
    give-back's revision after the give-back read what to NAK, and 3 would be removed un-NAKed.
    Rewritten under the give-back's name, the attempt finds the entry taken over."""
    zombie = claimed(kv, input_partition(lineage))
    take(zombie, [1])
    key = Ledger(kv, lineage).head_key(1, "m1")
    kv.lost_answer = lambda written: written == key
    taken, read_on = asyncio.Event(), asyncio.Event()
    read_back, read = ledger.read_head, ledger_protocol.read_deliveries
    giving_back: list[asyncio.Future[int]] = []

    async def taken_before_the_read_back(*args: Any) -> Any:
        kv.lost_answer = None
        giving_back.append(
            asyncio.ensure_future(
                ledger_protocol.give_back(CLIENT, Ledger(kv, lineage), [(1, "m1")], unkept)
            )
        )
        await taken.wait()
        monkeypatch.setattr(ledger, "read_head", read_back)
        return await read_back(*args)

    async def read_once_the_attempt_went_on(*args: Any) -> Any:
        taken.set()
        await read_on.wait()
        return await read(*args)

    monkeypatch.setattr(ledger, "read_head", taken_before_the_read_back)
    monkeypatch.setattr(ledger_protocol, "read_deliveries", read_once_the_attempt_went_on)
    recorded_after_the_take: list[int] = []

    async def attempt_goes_on() -> None:
        with contextlib.suppress(LedgerConflict):
            await recording(zombie, [2], 1)
            recorded_after_the_take.extend((await recording(zombie, [3], 1))[0])
        read_on.set()
        await giving_back[0]

    run_sync(attempt_goes_on())
    assert recorded_after_the_take == []
    assert b"".join(given_back).count(b"-NAK") == 2  # 1, and 2, whose write took effect


def test_a_give_back_naks_with_the_consumers_last_delivery(
    kv: MemoryBucket, lineage: str, given_back: list[bytes]
) -> None:
    """An entry names the delivery it recorded; the message may have been delivered again since
    and the ack floor passed that delivery, and nats-server ignores a -NAK whose consumer
    sequence is at or below the ack floor's (`processNak`; it finds the message by its stream
    sequence). So the give-back NAKs with the consumer's last delivery's sequence, inside the
    window whenever anything is pending (seeds 1494, 1571, 3433 and 3992 of the simulation,
    whose server ignores such a NAK, broke key order before)."""
    sealed(kv, lineage, 1, [1, 2])
    run_sync(ledger_protocol.give_back(CLIENT, Ledger(kv, lineage), [(1, "m1")], unkept))
    subjects = [line for line in b"".join(given_back).split(b"\r\n") if line.startswith(b"PUB ")]
    assert [subject.split(b" ")[1].split(b".")[5:7] for subject in subjects] == [
        [b"1", b"%d" % LAST_DELIVERED],
        [b"2", b"%d" % LAST_DELIVERED],
    ]
    assert run_sync(Ledger(kv, lineage).heads()) == []


def test_a_give_back_naks_past_an_entry_that_took_nothing(
    kv: MemoryBucket, lineage: str, given_back: list[bytes]
) -> None:
    """An earlier query's task attempt created its entry and died before it took anything: the
    give-back NAKs the other entries' messages all the same. It once failed on the empty entry,
    after it had removed the entries and before it NAKed a message (they waited out their ack
    wait behind newer ones of their keys: seed 1132 of the simulation)."""
    claimed(kv, input_partition(lineage, slot="m0"))
    sealed(kv, lineage, 1, [1, 2])
    keys = [(1, "m0"), (1, "m1")]
    assert run_sync(ledger_protocol.give_back(CLIENT, Ledger(kv, lineage), keys, unkept)) == 2
    assert b"".join(given_back).count(b"-NAK") == 2
    assert run_sync(Ledger(kv, lineage).heads()) == []


def test_a_give_back_gives_back_an_acked_entry_too(
    kv: MemoryBucket, lineage: str, given_back: list[bytes]
) -> None:
    """A server restart loses the acks its consumer store had not written (the last 100 ms):
    the messages of an ACKED entry come back after their ack wait. A new checkpoint that gave
    back only unacked entries read newer messages of their keys first (found by seed 482 once
    the simulated server restarted); it NAKs an acked entry's deliveries too, which the server
    ignores for what is no longer pending."""
    sealed(kv, lineage, 1, [1, 2])
    run_sync(ledger_protocol.ack(CLIENT, Ledger(kv, lineage), 1, "m1", "S"))
    assert stored(kv, lineage, 1)[0].state is EntryState.ACKED
    given_back.clear()  # the acks
    run_sync(ledger_protocol.give_back(CLIENT, Ledger(kv, lineage), [(1, "m1")], unkept))
    assert b"".join(given_back).count(b"-NAK") == 2
    assert run_sync(Ledger(kv, lineage).heads()) == []


def query_that_acked_4_to_8(kv: MemoryBucket) -> DriverLedger:
    """A query's driver whose batch 1 sealed 4-8 of slot m1 and acked them."""
    earlier = driver(kv)
    run_sync(earlier.adopt(None))
    run_sync(earlier.new_offset({"m1": SlotPlan(5)}))
    assert earlier.lineage is not None
    sealed(kv, earlier.lineage, 1, [4, 5, 6, 7, 8])
    run_sync(ledger_protocol.ack(CLIENT, Ledger(kv, earlier.lineage), 1, "m1", "S"))
    return earlier


def test_a_give_back_marks_what_the_acked_entries_held_for_the_next_drivers(
    kv: MemoryBucket, given_back: list[bytes]
) -> None:
    """Server restarts lost the acks of 1-3 while an earlier checkpoint's query acked 4-8, so
    the consumer's ack floor stayed 0; the give-back to a new checkpoint's query removes the
    entry of 4-8. A consumer created again below 8 delivers them again and nothing drops them
    (seed 11950 of the simulation's worlds with the recreation): the give-back reports the
    sequences its acked entries held, by consumer (a sealed entry, never acked, none), and the
    pointer keeps them for the target's next drivers."""
    earlier = query_that_acked_4_to_8(kv)
    sealed(kv, earlier.lineage, 2, [9, 10])
    new_checkpoint = driver(kv)
    run_sync(new_checkpoint.adopt(SourceOffset.initial(uuid.uuid4().hex)))
    run_sync(new_checkpoint.give_back_replaced(CLIENT))
    assert new_checkpoint.seen.acked_earlier == {("S", "c1"): {4, 5, 6, 7, 8}}
    run_sync(new_checkpoint.new_offset({"m1": SlotPlan(5)}))
    pointer = run_sync(read_pointer(kv, "query.S.g"))
    assert pointer is not None and pointer.acked_earlier == {"S": {"c1": [[4, 8]]}}
    restarted = driver(kv)
    run_sync(restarted.adopt(None))
    assert restarted.seen.acked_earlier == {("S", "c1"): {4, 5, 6, 7, 8}}
    kept: list[ledger_protocol.Marks] = []

    async def keep(marks: ledger_protocol.Marks) -> None:
        kept.append(marks)

    keys = [(1, "m1"), (2, "m1")]
    given = run_sync(ledger_protocol.give_back(CLIENT, Ledger(kv, earlier.lineage), keys, keep))
    assert (given, kept) == (0, [{}]), "given back already"


def test_a_give_back_writes_its_marks_to_the_pointer_before_it_removes_the_entries(
    kv: MemoryBucket, given_back: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new checkpoint's driver gave back an earlier query's acked entry and died before its
    next pointer write: the mark, in its memory only, was lost, and a consumer created again
    below it was read on by a later run (seeds 150 and 247 of the simulation's worlds with the
    recreation: an acked message came after a newer one of its key; 5265 likewise, a run that
    failed on its sink). The give-back writes the pointer with its marks before it removes a
    single entry, so a driver that dies as it removes them has kept them."""
    query_that_acked_4_to_8(kv)

    class Died(Exception):
        pass

    async def dies(self: Ledger, gen: int, slot: str) -> None:
        raise Died

    dying = driver(kv)
    run_sync(dying.adopt(SourceOffset.initial(uuid.uuid4().hex)))
    with monkeypatch.context() as removing:
        removing.setattr(Ledger, "delete_entry", dies)
        with pytest.raises(Died):
            run_sync(dying.give_back_replaced(CLIENT))
    pointer = run_sync(read_pointer(kv, "query.S.g"))
    assert pointer is not None and pointer.acked_earlier == {"S": {"c1": [[4, 8]]}}
    next_checkpoint = driver(kv)
    run_sync(next_checkpoint.adopt(SourceOffset.initial(uuid.uuid4().hex)))
    assert next_checkpoint.seen.acked_through("S", "c1") == 8


def test_settled_entries_are_removed_and_leave_nothing(
    kv: MemoryBucket, lineage: str, published_acks: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(clock, "_source", lambda: now[0])
    sealed(kv, lineage, 1, [1, 2, 3])
    sealed(kv, lineage, 2, [], slot="m2")  # took nothing, committed
    sealed(kv, lineage, 3, [], slot="m2")  # took nothing, not committed: a re-run must find it
    sealed(kv, lineage, 3, [4])  # not acked yet
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 3)))
    run_sync(ledger.ack_through(CLIENT, 1))
    horizons = {"m1": Horizon(ack_floor=3, first_seq=1), "m2": Horizon(0, 1)}
    run_sync(ledger.forget_settled(horizons, committed=2))
    assert sorted(ledger.entries) == [(1, "m1"), (3, "m1"), (3, "m2")]
    now[0] += ledger_protocol.SETTLE_SECONDS - 1
    run_sync(
        ledger.forget_settled({**horizons, "m1": Horizon(2, 1)}, committed=2)
    )  # floor fell back
    now[0] += 1
    run_sync(ledger.forget_settled(horizons, committed=2))
    assert (1, "m1") in ledger.entries  # the floor must hold for a while from its last rise
    now[0] += ledger_protocol.SETTLE_SECONDS
    run_sync(ledger.forget_settled(horizons, committed=2))
    assert sorted(ledger.entries) == [(3, "m1"), (3, "m2")]
    assert not [key for key in kv.values if key.startswith((f"{lineage}.1.", f"{lineage}.2."))]
    pointer = run_sync(read_pointer(kv, ledger.pointer_key))
    assert pointer is not None and pointer.settled == 2  # the fence of what was removed


def test_a_batch_whose_entries_all_settle_goes_in_one_removal(
    kv: MemoryBucket, lineage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At many slots, one removal per settled entry was a planning's round trips per slot: a
    batch all of whose entries settle together (as they do once its next tasks acked them) goes
    in one removal, chunks included; a batch with an entry still kept goes entry by entry."""
    removed: list[str] = []
    remove = kv.remove

    async def counted(key: str) -> None:
        removed.append(key)
        await remove(key)

    monkeypatch.setattr(kv, "remove", counted)
    for slot in ("m1", "m2", "m3"):
        sealed(kv, lineage, 1, [], slot=slot)  # took nothing, committed: settled at once
    sealed(kv, lineage, 2, [], slot="m1")
    sealed(kv, lineage, 2, [5], slot="m2")  # not acked yet: kept
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 3)))
    run_sync(ledger.forget_settled({}, committed=2))
    assert removed == [f"{lineage}.1", ledger.ledger.head_key(2, "m1")]  # type: ignore[union-attr]
    assert sorted(ledger.entries) == [(2, "m2")]
    assert [key.split(".")[:3] for key in kv.values if key.startswith(lineage)] == [
        [lineage, "2", "m2"]
    ]  # its head, which holds its record


def test_an_attempt_that_outlived_its_settled_batch_cannot_create_its_entry_again(
    kv: MemoryBucket, lineage: str
) -> None:
    """A task attempt of batch 1 resumes after batch 1 was re-run, committed, acked and its
    entry removed: were it to create the entry again and take messages into it, the driver
    would ack them as committed. The pointer fences gen 1 before the removal."""
    run_sync(write_pointer(kv, "query.S.g", Pointer(lineage, 3, settled=1)))
    zombie = attempt(kv, input_partition(lineage, gen=1))
    with pytest.raises(LedgerConflict, match="outlived"):
        run_sync(zombie.claim())
    assert run_sync(Ledger(kv, lineage).heads()) == []
    assert claimed(kv, input_partition(lineage, gen=2)).head.state is EntryState.OPEN
    other = uuid.uuid4().hex  # the fence is of the pointer's lineage only
    assert claimed(kv, input_partition(other, gen=1)).head.state is EntryState.OPEN


def test_the_fence_leaves_the_entry_a_retry_sealed(kv: MemoryBucket, lineage: str) -> None:
    """An attempt of batch 1 pauses after its create took effect; its retry takes the entry over
    and seals it; a later batch settles, so the fence (the newest settled gen) covers gen 1,
    while gen 1's entry is still kept (its acks lost in a server restart: its redeliveries are
    dropped by it). The attempt resumes and finds the fence: it stops, and leaves the retry's
    entry (before, it removed whatever entry it found)."""
    paused = claimed(kv, input_partition(lineage, gen=1))
    run_sync(paused.release())  # as a retry that stood by finds it: released, taken over
    retry = claimed(kv, input_partition(lineage, gen=1))
    take(retry, [1, 2])
    run_sync(retry.seal())
    run_sync(write_pointer(kv, "query.S.g", Pointer(lineage, 3, settled=2)))
    ledger = Ledger(kv, lineage)
    with pytest.raises(LedgerConflict, match="outlived"):
        run_sync(
            ledger_protocol.check_fence(
                ledger, PointerReads(kv, "query.S.g"), 1, "m1", paused.head.attempt
            )
        )
    head = run_sync(read_head(ledger, 1, "m1"))
    assert head is not None and head[0].state is EntryState.SEALED


def test_an_attempt_of_a_given_back_lineage_cannot_create_its_entry_after_the_give_back(
    kv: MemoryBucket, lineage: str
) -> None:
    """A task attempt of a query replaced by one on a new checkpoint resumes after the new query
    gave the old lineage back: the pointer keeps that lineage as retired, and the entry the
    attempt creates goes again before it takes anything (with no max age on the bucket,
    nothing else would remove it). A retired lineage run again (its checkpoint restarted) is
    no longer retired once its driver adopts it."""
    newer = uuid.uuid4().hex
    run_sync(write_pointer(kv, "query.S.g", Pointer(newer, 1, retired=[lineage])))
    zombie = attempt(kv, input_partition(lineage, gen=2))
    with pytest.raises(LedgerConflict, match="replaced by one on a new checkpoint"):
        run_sync(zombie.claim())
    assert run_sync(Ledger(kv, lineage).heads()) == []
    again = driver(kv)
    run_sync(again.adopt(SourceOffset(lineage, 2)))
    pointer = run_sync(read_pointer(kv, "query.S.g"))
    assert pointer is not None and pointer.retired == [] and pointer.replaced == [newer]
    assert claimed(kv, input_partition(lineage, gen=3)).head.state is EntryState.OPEN


def killed_after_its_create(kv: MemoryBucket, lineage: str, gen: int, slot: str = "m1") -> None:
    """A task attempt that outlived its entry creates it again and is killed before its fence
    check (its executor killed, as a lost one often is): its OPEN head stays, holding nothing."""
    head = EntryHead(attempt=uuid.uuid4().hex[:12])
    assert run_sync(ledger_protocol.create(Ledger(kv, lineage), gen, slot, head, "pin-1"))


def test_a_given_back_lineage_s_entry_created_after_the_give_back_goes_at_the_next_adoption(
    kv: MemoryBucket, lineage: str, given_back: list[bytes]
) -> None:
    """Seed 3629 of the pausing-executor worlds: an attempt of a query replaced by one on a new
    checkpoint created its entry after the give-back and was killed before its fence check.
    No batch of any lineage would remove it (the bucket keeps entries): the next driver to adopt
    a lineage gives back whatever a retired lineage still holds."""
    newer = uuid.uuid4().hex
    run_sync(write_pointer(kv, "query.S.g", Pointer(newer, 2, retired=[lineage])))
    killed_after_its_create(kv, lineage, 4)
    restarted = driver(kv)
    run_sync(restarted.adopt(None))
    run_sync(restarted.give_back_outlived(CLIENT))
    assert run_sync(Ledger(kv, lineage).heads()) == []
    assert given_back == []  # it held nothing


def test_an_open_entry_of_a_settled_gen_goes_at_the_next_adoption(
    kv: MemoryBucket, lineage: str
) -> None:
    """An attempt that outlived its settled batch 1 creates the entry again and is killed
    before its fence check: an OPEN entry of a fenced gen, which no batch seals, acks or
    settles, and which the driver would count as the query's own for good. The lineage's next
    driver removes it; a sealed entry of that gen (kept: its acks were lost) and the open
    entry of a batch still running stay."""
    sealed(kv, lineage, 1, [1, 2], slot="m2")
    run_sync(write_pointer(kv, "query.S.g", Pointer(lineage, 3, settled=1)))
    killed_after_its_create(kv, lineage, 1)
    killed_after_its_create(kv, lineage, 3)
    restarted = driver(kv)
    run_sync(restarted.adopt(None))
    run_sync(restarted.give_back_outlived(CLIENT))
    assert run_sync(Ledger(kv, lineage).heads()) == [(1, "m2"), (3, "m1")]
    assert sorted(restarted.entries) == [(1, "m2"), (3, "m1")]


def test_a_give_back_retires_the_replaced_lineages_first(kv: MemoryBucket, lineage: str) -> None:
    older = uuid.uuid4().hex
    run_sync(write_pointer(kv, "query.S.g", Pointer(older, 4)))
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 0)))
    run_sync(ledger.give_back_replaced(None))  # type: ignore[arg-type]
    pointer = run_sync(read_pointer(kv, "query.S.g"))
    assert pointer is not None and pointer.retired == [older]


def test_an_attempt_that_outlived_its_settled_batch_is_fenced_when_its_create_answer_is_lost(
    kv: MemoryBucket, lineage: str
) -> None:
    """Hole 4 of issue 45: the zombie's create took effect but its answer was lost; its retry
    found the key ("wrong last sequence"), read the open head, took it over as an earlier
    attempt's and went on without the fence: an open entry of a settled batch, in the live
    lineage, that no batch seals, acks or settles. A take-over passes the fence too."""
    run_sync(write_pointer(kv, "query.S.g", Pointer(lineage, 3, settled=1)))
    kv.lost_answer = lambda key: key == f"{lineage}.1.m1"
    zombie = attempt(kv, input_partition(lineage, gen=1))
    with pytest.raises(LedgerConflict, match="outlived"):
        run_sync(zombie.claim())
    assert run_sync(Ledger(kv, lineage).heads()) == []


class _SettledBeforeTheTakeOver(MemoryBucket):
    """A bucket where the driver settles the batch (its pointer fenced, the entry and its chunks
    removed) just before the next head update lands: the take-over's write of an attempt that
    paused between reading the head and writing it."""

    def __init__(self, lineage: str) -> None:
        super().__init__()
        self.lineage = lineage
        self.settle_at_update = False

    async def update(self, key: str, value: bytes, last: int) -> int:
        if self.settle_at_update:
            self.settle_at_update = False
            await write_pointer(self, "query.S.g", Pointer(self.lineage, 3, settled=1))
            await self.remove(key)
        return await super().update(key, value, last)


def test_a_take_over_whose_entry_settled_meanwhile_leaves_nothing(lineage: str) -> None:
    """An attempt takes over an entry its holder released and pauses before its head write;
    the batch is committed by then (a retry sealed it), acked and settled: entry and chunks
    removed. The write conflicts, the claim goes round again and creates the entry, and the
    create's answer is lost: the attempt must pass the fence and leave nothing, not stop at
    the chunks its head names (the taken-over ones, removed)."""
    kv = _SettledBeforeTheTakeOver(lineage)
    run_sync(write_pointer(kv, "query.S.g", Pointer(lineage, 2)))
    holder = claimed(kv, input_partition(lineage, gen=1))
    take(holder, [1, 2])
    run_sync(holder.release())
    kv.settle_at_update = True
    kv.lost_answer = lambda key: key == f"{lineage}.1.m1"
    retry = attempt(kv, input_partition(lineage, gen=1))
    with pytest.raises(LedgerConflict, match="outlived"):
        run_sync(retry.claim())
    assert run_sync(Ledger(kv, lineage).heads()) == []


def test_acks_at_stop_cover_the_committed_batches_only(
    kv: MemoryBucket, lineage: str, published_acks: list[bytes]
) -> None:
    sealed(kv, lineage, 1, [1])
    sealed(kv, lineage, 2, [2], slot="m2")
    sealed(kv, lineage, 3, [3])
    ledger = driver(kv)
    run_sync(ledger.adopt(SourceOffset(lineage, 3)))
    assert run_sync(ledger.ack_through(CLIENT, 2, only="m2")) == 1
    assert run_sync(ledger.ack_through(CLIENT, 2)) == 1
    assert published_acks == [b"$JS.ACK.S.c1.1.2.2.0.0", b"$JS.ACK.S.c1.1.1.1.0.0"]
    assert ledger.acks_due(3) == {"m1": (3,)}


def test_an_entry_an_outlived_attempt_created_again_is_not_taken_over_by_another(
    kv: MemoryBucket, lineage: str
) -> None:
    """Two attempts of batch 1 that Spark lost resume after it settled: the first creates the
    entry again and is killed before its fence check; the second finds that OPEN head, stands
    by until it is quiet and takes it over. It must stop at the fence and remove the entry:
    it goes on pulling into a settled batch's entry, whose messages a later driver would ack
    as committed and whose redeliveries its tasks would drop as emitted."""
    run_sync(write_pointer(kv, "query.S.g", Pointer(lineage, 3, settled=1)))
    killed_after_its_create(kv, lineage, 1)
    second = attempt(kv, input_partition(lineage, gen=1))
    with pytest.raises(LedgerConflict, match="outlived"):
        run_sync(second.claim())
    assert run_sync(Ledger(kv, lineage).heads()) == []
