"""The simulation's classifier of per-key order breaks (`lateness.py`): only the delivery just
before the one a late message was emitted from, when an attempt which died held it unrecorded,
or a give-back removed its entry before its driver died, and nobody gave it back, explains it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from nats_spark.spark.group_source.ledger import (
    EntryDeliveries,
    EntryHead,
    EntryState,
    Ledger,
    LedgerConflict,
)
from nats_spark.spark.group_source.task.slot_entry import SlotEntry
from tests.memory_bucket import MemoryBucket
from tests.simulation import lateness
from tests.simulation.jetstream import Consumer, Delivery, Stream
from tests.simulation.lateness import REQUEUED, Attempts, GiveBacks, Hold, held_before
from tests.simulation.scheduler import Crashed, Lost, Participant
from tests.spark.group_source.test_ledger_entries import input_partition

pytestmark = pytest.mark.unit

SEQ = 7
CONSUMER = "g-partition-0"  # the consumer that delivered SEQ


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def attempt(loop: asyncio.AbstractEventLoop, driver: Participant | None = None) -> Participant:
    return Participant("b1/partition-0#0", "task", loop.create_future(), driver)


def slot_entry(slot: str) -> SlotEntry:
    """An attempt's entry of `slot`, whose consumer is g-`slot` (never claimed: no client)."""
    partition = input_partition("lineage", slot=slot, consumer=f"g-{slot}")
    return SlotEntry(None, partition)  # type: ignore[arg-type]


def late(attempts: Attempts, held: Delivery) -> str | None:
    """Why SEQ came late, `held` being its delivery before the one emitted."""
    return attempts.why_late(SEQ, held, CONSUMER)


def test_an_unrecorded_delivery_of_a_crashed_attempt_explains(
    loop: asyncio.AbstractEventLoop,
) -> None:
    crashed = attempt(loop)
    crashed.dead = True
    assert late(Attempts(), Delivery(1, 1, 0.0, owner=crashed)) == (
        "an attempt that held it unrecorded crashed"
    )


def test_a_zombie_or_an_attempt_killed_with_its_driver_explains(
    loop: asyncio.AbstractEventLoop,
) -> None:
    zombie, driver = attempt(loop), Participant("driver#1", "driver", loop.create_future())
    zombie.lost = True
    zombie.finished.set_exception(Lost())
    killed = attempt(loop, driver)
    driver.dead = killed.dead = True
    killed.finished.set_exception(Crashed())
    assert "zombie" in (late(Attempts(), Delivery(1, 1, 0.0, owner=zombie)) or "")
    assert "driver" in (late(Attempts(), Delivery(1, 1, 0.0, owner=killed)) or "")
    taken_over = attempt(loop)
    taken_over.finished.set_exception(LedgerConflict("taken over"))
    assert "zombie" in (late(Attempts(), Delivery(1, 1, 0.0, owner=taken_over)) or "")


def test_an_entry_taken_over_from_a_live_attempt_explains_only_for_its_own_slot(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Seeds 2766 and 8306 of the packed worlds: an attempt of a task reading both slots held a
    delivery of the first slot's consumer unrecorded and stalled past its ack wait; the retry
    took that slot's entry over and sealed it, and the attempt, awake, handed out the seal (or
    gave the delivery back late). Its other slot's entry, never taken over, was the only one
    judged; it explains nothing of its own consumer's deliveries, which the attempt went on
    recording."""
    attempts, packed = Attempts(), attempt(loop)
    packed.finished.set_result([])
    taken_over, going_on = slot_entry("partition-0"), slot_entry("partition-1")
    taken_over.overtaken = True
    for entry in (taken_over, going_on):
        attempts.watch(packed, entry)
    held = Delivery(1, 1, 0.0, owner=packed)
    assert "handed out its seal" in (late(attempts, held) or "")
    assert attempts.why_late(SEQ, held, "g-partition-1") is None
    given_back = Delivery(1, 1, 0.0, owner=packed, given_back=True, given_back_by=packed)
    assert "handed out its seal" in (late(attempts, given_back) or "")


class BucketView:
    """A ledger bucket as the world hands it to an attempt (`SimBucket`): its store beside it,
    which `lateness` reads without a scheduling point."""

    def __init__(self, store: MemoryBucket) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def taken_over(
    loop: asyncio.AbstractEventLoop, released: bool, recording: bool
) -> tuple[Attempts, Participant, Participant]:
    """Attempts (on a clock) of two attempts, the first closed by Spark, the second taking its
    entry of partition-0 over at 5 s: the first claimed it at 1 s, then recorded SEQ when
    `recording` (else the entry is of an older release's format, which the take-over records
    anew under its own head), and released it at 2 s when `released` (else the take-over comes
    once its head stood still)."""
    now = [1.0]
    attempts, bucket = Attempts(lambda: now[0]), BucketView(MemoryBucket())
    closed, taker = attempt(loop), attempt(loop)
    closed.finished.set_result([])
    holding, taking = slot_entry("partition-0"), slot_entry("partition-0")
    for participant, entry in ((closed, holding), (taker, taking)):
        entry.ledger = Ledger(bucket, entry.partition.lineage)  # type: ignore[arg-type]
        attempts.watch(participant, entry)
    if not recording:
        holding.head.format = 1
    loop.run_until_complete(holding.claim())
    if recording:
        deliveries = EntryDeliveries(b"$JS.ACK.S.g-partition-0", [SEQ], [1], [1])
        loop.run_until_complete(holding._write([], deliveries, None))
    now[0] = 2.0
    if released:
        loop.run_until_complete(holding.release())
    now[0] = 5.0
    loop.run_until_complete(taking.claim())
    return attempts, closed, taker


@pytest.mark.usefixtures("short_holds")
@pytest.mark.parametrize("released", [False, True])
def test_an_attempt_spark_closed_explains_only_once_its_entry_was_taken_over_unreleased(
    loop: asyncio.AbstractEventLoop, released: bool
) -> None:
    """Seeds 263 and 953 of the packed worlds with early stops: an attempt a user's job
    stopped after its first rows stalled past its ack wait holding a delivery unrecorded; the
    batch's full read took its entry over once its head stood still (README guarantee 4, a
    stall), and the attempt, awake, was closed by Spark without giving the delivery back (its
    wait may have run out). It ends with neither a `LedgerConflict` nor `overtaken`. One that
    was not taken over explains nothing, nor one whose entry was taken over only once it
    released it (it gave back what it held before); nor does the taker's write of its own
    take-over again (`record_anew`)."""
    attempts, closed, taker = taken_over(loop, released, recording=False)
    explained = late(attempts, Delivery(1, 1, 0.0, owner=closed))
    if released:
        assert explained is None
    else:
        assert "head stood still (a stall)" in (explained or "")
    assert late(attempts, Delivery(1, 1, 0.0, owner=taker)) is None


@pytest.mark.usefixtures("short_holds")
@pytest.mark.parametrize("released", [False, True])
def test_a_take_over_of_a_released_entry_holds_what_it_adopts_from_the_release(
    loop: asyncio.AbstractEventLoop, released: bool
) -> None:
    """Seed 2452 of the packed worlds with early stops and another client: the attempt a
    user's job stopped recorded a message and released its entry as Spark closed it; the
    batch's full read stalled past the wait in its claim, and its take-over landed after the
    wait ran out. Nothing kept the wait since the release: the taker holds the message from
    then (a stall of its lets the message out). An entry taken over unreleased was its
    holder's until the take-over."""
    attempts, closed, taker = taken_over(loop, released, recording=True)
    assert attempts.holding(SEQ, 3.0, 4.0, lambda _: True) == [taker if released else closed]
    assert attempts.holding(SEQ, 1.0, 1.5, lambda _: True) == [closed]


class LandingBucket(BucketView):
    """A `BucketView` that, as `SimBucket`, tells `landed` of each head write that took effect;
    one whose attempt is killed before the answer (`dies`) never answers."""

    def __init__(self, store: MemoryBucket, dies: bool) -> None:
        super().__init__(store)
        self.landed: list[Any] = []
        self.dies = dies

    async def update(self, key: str, value: bytes, last: int) -> int:
        revision = int(await self.store.update(key, value, last))
        for told in self.landed:
            told(f"kv update {key}")
        if self.dies:
            await asyncio.Event().wait()  # killed: its answer never comes
        return revision


@pytest.mark.usefixtures("short_holds")
@pytest.mark.parametrize("dies", [False, True])
def test_a_take_over_of_a_released_entry_holds_from_the_release_once_it_took_effect(
    loop: asyncio.AbstractEventLoop, dies: bool
) -> None:
    """Seed 194 of the worlds with another client and early stops: the batch's full read took
    over the entry the attempt a user's job stopped had released, and was killed as its write's
    answer came; the next attempt stood by 5 s for that head, past the 4 s wait, and the other
    client got the message. The taker holds it from the release once its write took effect,
    answered or not (its death then lets it out)."""
    now = [1.0]
    attempts, store = Attempts(lambda: now[0]), MemoryBucket()
    closed, taker = attempt(loop), attempt(loop)
    closed.finished.set_result([])
    holding, taking = slot_entry("partition-0"), slot_entry("partition-0")
    holding.ledger = Ledger(BucketView(store), "lineage")  # type: ignore[arg-type]
    taking.ledger = Ledger(LandingBucket(store, dies), "lineage")  # type: ignore[arg-type]
    attempts.watch(closed, holding)
    attempts.watch(taker, taking)
    loop.run_until_complete(holding.claim())
    deliveries = EntryDeliveries(b"$JS.ACK.S.g-partition-0", [SEQ], [1], [1])
    loop.run_until_complete(holding._write([], deliveries, None))
    now[0] = 2.0
    loop.run_until_complete(holding.release())
    now[0] = 5.0
    claiming = loop.create_task(taking.claim())
    loop.run_until_complete(asyncio.wait([claiming], timeout=0.1))
    assert attempts.holding(SEQ, 3.0, 4.0, lambda _: True) == [taker]
    claiming.cancel()
    loop.run_until_complete(asyncio.wait([claiming]))


def test_what_an_attempt_gave_back_as_spark_closed_it_came_back_by_the_server_s_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Seeds 3862 and 1622 of the packed worlds with early stops: an attempt a user's job
    stopped gave back at once, as Spark closed it, the delivery it held unrecorded; the batch's
    full read, standing by for its entry until its release, took the newer message of its key
    after that `-NAK`: the newer one was on the redelivery queue before it (3862), or a server
    restart emptied the queue (1622). One taken before the `-NAK` is not explained: no attempt
    pulls the slot's consumer until the closed one released its entry."""
    attempts, closed = Attempts(), attempt(loop)
    closed.finished.set_result([])
    held = Delivery(1, 3, 0.0, owner=closed, given_back=True, given_back_by=closed, order=3)
    held.given_back_after = 4  # the consumer had made 4 deliveries by the -NAK
    assert late(attempts, held) is None  # no newer message's delivery known
    newer = Delivery(1, 5, 0.0, order=5)
    assert attempts.why_late(SEQ, held, CONSUMER, newer) == REQUEUED
    newer.order = 4
    assert attempts.why_late(SEQ, held, CONSUMER, newer) is None
    held.given_back, held.given_back_by = False, None  # left to its ack wait instead
    newer.order = 5
    assert attempts.why_late(SEQ, held, CONSUMER, newer) is None


def test_a_recorded_given_back_or_finished_delivery_explains_nothing(
    loop: asyncio.AbstractEventLoop,
) -> None:
    attempts, crashed, finished, failed = Attempts(), attempt(loop), attempt(loop), attempt(loop)
    crashed.dead = True
    finished.finished.set_result([SEQ])
    failed.finished.set_exception(TimeoutError())
    assert late(attempts, Delivery(1, 1, 0.0, owner=crashed, given_back=True)) == REQUEUED
    assert late(attempts, Delivery(1, 1, 0.0, owner=finished)) is None
    assert late(attempts, Delivery(1, 1, 0.0, owner=failed)) is None
    attempts.recorded[crashed] = {SEQ}
    assert late(attempts, Delivery(1, 1, 0.0, owner=crashed)) is None


def test_a_recorded_message_the_attempt_gave_back_again_itself_explains(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Seeds 8719, 9414, 11707 of the replaced-mid-batch worlds: a new checkpoint's give-back
    NAKed the delivery an attempt of the stopped query recorded; the message came again to a
    pull the attempt had out, which held it unrecorded (its entry gone) and gave it back as it
    failed: behind newer messages of its key on the redelivery queue. One it kept (not given
    back) still explains nothing: that was the hole of seed 2306."""
    attempts, zombie = Attempts(), attempt(loop)
    zombie.finished.set_exception(LedgerConflict("given back"))
    attempts.recorded[zombie] = {SEQ}
    again = Delivery(2, 5, 0.0, owner=zombie, given_back=True, given_back_by=zombie)
    assert "zombie" in (late(attempts, again) or "")
    assert late(attempts, Delivery(2, 5, 0.0, owner=zombie)) is None


def test_only_the_delivery_before_the_emitted_one_can_explain(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A crashed attempt's unrecorded delivery explains a break only when it is the delivery
    just before the one emitted: an earlier one came back and was taken again before (issue 45:
    any dead attempt's earlier delivery was taken as the explanation)."""
    crashed, finished, emitting = attempt(loop), attempt(loop), attempt(loop)
    crashed.dead = True
    finished.finished.set_result([])
    first = Delivery(1, 1, 0.0, owner=crashed)
    second = Delivery(2, 2, 0.0, owner=finished)
    emitted = Delivery(3, 3, 0.0, owner=emitting)
    deliveries = [first, second, emitted]
    held = held_before(deliveries, lambda d: d is emitted)
    assert held is second
    assert late(Attempts(), held) is None
    assert held_before([first, emitted], lambda d: d is emitted) is first
    assert held_before([emitted], lambda d: d is emitted) is None  # emitted from its first


def test_a_write_that_failed_holds_only_what_the_head_names(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt's entry holds what it writes from the write's start (it may land, its answer
    lost); a write that failed, only if the entry's head names it (seeds 2538 of the packed
    worlds with another client, 2667 and 2779 of those whose executors pause: a write that
    never landed was taken for the query holding the message when the other client took it)."""
    attempts, entry, recording = Attempts(lambda: 1.0), slot_entry("partition-0"), attempt(loop)

    async def taken_over(*_: object) -> None:
        raise LedgerConflict("taken over")

    named: list[set[int]] = [set()]

    def names(*_: object) -> set[int]:
        return named[0]

    entry._write = taken_over  # type: ignore[method-assign,assignment]
    attempts.watch(recording, entry)
    monkeypatch.setattr(lateness, "_named", names)
    for named[0] in (set(), {SEQ}):
        with pytest.raises(LedgerConflict):
            loop.run_until_complete(entry._write([], EntryDeliveries(stream_seq=[SEQ]), None))
    assert attempts.held_since[SEQ] == [Hold(1.0, recording)]


def test_a_write_refused_by_a_conflict_emitted_nothing_the_head_does_not_name(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a write began to record may be what its batch emitted (it may land, its answer
    lost), but not when a conflict refused it and the head does not name it: no head will (seed
    2544 of the worlds whose consumer is created again: a paused attempt's write of 23 was
    refused, its entry taken over, and taking it for where 23's rows came from hid the
    attempt's delivery, which held 23 unrecorded). One the head names landed before another
    attempt took the entry over, adopting it."""
    attempts, entry, recording = Attempts(), slot_entry("partition-0"), attempt(loop)
    failure: list[BaseException | None] = [None]
    named: list[set[int]] = [set()]

    async def write(*_: object) -> None:
        if failure[0] is not None:
            raise failure[0]

    entry._write = write  # type: ignore[method-assign,assignment]
    attempts.watch(recording, entry)
    monkeypatch.setattr(lateness, "_named", lambda *_: named[0])
    loop.run_until_complete(entry._write([], EntryDeliveries(stream_seq=[5]), None))
    taken_over = LedgerConflict("taken over")
    writes: list[tuple[Exception, int, set[int]]] = [
        (taken_over, SEQ, set()),
        (taken_over, SEQ + 1, {5, SEQ + 1}),
        (TimeoutError(), SEQ + 2, set()),  # its answer lost: it may have landed
    ]
    for error, seq, named[0] in writes:
        failure[0] = error
        with pytest.raises(type(error)):
            loop.run_until_complete(entry._write([], EntryDeliveries(stream_seq=[5, seq]), None))
    assert attempts.writing[recording] == {5, SEQ + 1, SEQ + 2}


def test_a_sibling_that_dropped_what_another_entry_recorded_holds_it_no_more(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Seed 26 of the worlds with another client whose executors pause: a zombie of the
    sibling slot took the redelivery of SEQ after its wait ran out, recorded it, found the
    other slot's entry holding it and wrote its record again without it (its keeper let it
    go). That entry's attempt had been killed, and its retry stood by 5 s for its head, past
    the wait: the other client got SEQ, the batch committed it, as for any dead holder. The
    sibling was taken for the holder."""
    now = [1.0]
    attempts, killed, sibling = Attempts(lambda: now[0]), attempt(loop), attempt(loop)
    killed.dead, killed.died = True, 2.0
    attempts._hold(killed, {SEQ})
    entry = slot_entry("partition-1")

    async def write(*_: object) -> None:
        return None

    entry._write = write  # type: ignore[method-assign,assignment]
    attempts.watch(sibling, entry)
    now[0] = 3.0
    loop.run_until_complete(entry._write([], EntryDeliveries(stream_seq=[SEQ]), None))
    assert attempts.holding(SEQ, 5.0, 5.0, lambda _: True) == [sibling]
    loop.run_until_complete(entry._write([], EntryDeliveries(stream_seq=[]), None, 1))
    assert attempts.holding(SEQ, 5.0, 5.0, lambda _: True) == [killed]


def test_a_seal_hands_what_it_holds_to_the_driver_once_it_landed(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt holds what it sealed until the seal is answered (seed 1949 of the worlds with
    another client whose executors pause: it stalled 11.7 s before its seal landed, and the
    driver was taken for the holder from the seal's start), or, when it fails, from then if the
    head is sealed, else not at all."""
    now = [1.0]
    attempts, entry, sealing = Attempts(lambda: now[0]), slot_entry("partition-0"), attempt(loop)
    entry.taken = {SEQ}
    state, fails = [EntryState.OPEN], [True]

    async def seal() -> None:
        now[0] += 10.0  # answered 10 s later
        if fails[0]:
            raise LedgerConflict("taken over")

    entry.seal = seal  # type: ignore[method-assign]
    attempts.watch(sealing, entry)
    monkeypatch.setattr(lateness, "_head", lambda _: EntryHead(state=state[0]))
    for state[0] in (EntryState.OPEN, EntryState.SEALED):
        with pytest.raises(LedgerConflict):
            loop.run_until_complete(entry.seal())
    assert attempts.held_since[SEQ] == [Hold(21.0, sealing, sealed=True)]
    fails[0] = False
    attempts.held_since.clear()
    loop.run_until_complete(entry.seal())
    assert attempts.held_since[SEQ] == [Hold(31.0, sealing, sealed=True)]


def test_a_give_back_whose_driver_died_after_the_removal_explains(
    loop: asyncio.AbstractEventLoop,
) -> None:
    store, driver = MemoryBucket(), Participant("driver#2", "driver", loop.create_future())
    give_backs = GiveBacks(None, store, Stream(), [])  # type: ignore[arg-type]  # no scheduling
    held = Delivery(1, 1, 0.0)
    give_backs.removing[driver] = [("lineage.1.partition-0", [held])]
    assert give_backs.why_late(held) is None  # alive: its -NAKs are still to come
    driver.dead = True
    assert "give-back" in (give_backs.why_late(held) or "")
    store.values["lineage.1.partition-0"] = (b"{}", 1)  # it died before the removal took effect
    assert give_backs.why_late(held) is None
    del store.values["lineage.1.partition-0"]
    held.given_back = True  # a later give-back sent the -NAK
    assert give_backs.why_late(held) is None


class SendingBucket(BucketView):
    """A `BucketView` that, as `SimBucket`, tells `sent` of each head write that goes out; one
    whose attempt dies at its scheduling point (`dies`) never goes out, nor answers."""

    def __init__(self, store: MemoryBucket, dies: bool) -> None:
        super().__init__(store)
        self.sent: list[Any] = []
        self.dies = dies
        self.death = asyncio.Event()  # set: the dead attempt's coroutine is let go (a test's end)

    async def update(self, key: str, value: bytes, last: int) -> int:
        if self.dies:
            await self.death.wait()
            raise Crashed()
        for told in self.sent:
            told(f"kv update {key}")
        return int(await self.store.update(key, value, last))


@pytest.mark.parametrize("dies", [False, True])
def test_a_record_is_begun_once_its_head_write_goes_out(
    loop: asyncio.AbstractEventLoop, dies: bool
) -> None:
    """Seed 578 of the worlds of mutant `acked-through-ignored`, on the schedules of an unlanded
    ledger format 3: an attempt died as its record's head write came to its scheduling point;
    the write never went out, so no batch can have emitted that delivery from it."""
    attempts, recording = Attempts(), attempt(loop)
    entry = slot_entry("partition-0")
    bucket = SendingBucket(MemoryBucket(), dies)
    entry.ledger = Ledger(bucket, entry.partition.lineage)  # type: ignore[arg-type]
    attempts.watch(recording, entry)
    loop.run_until_complete(entry.claim())
    writing = loop.create_task(entry._write([], EntryDeliveries(stream_seq=[SEQ]), None))
    loop.run_until_complete(asyncio.sleep(0.01))
    assert attempts.writing[recording] == (set() if dies else {SEQ})
    bucket.death.set()
    loop.run_until_complete(asyncio.wait([writing]))


class Reader:
    """A slot reader of CONSUMER's slot, whose give-back (`SlotReader.give_back`) NAKs nothing
    here."""

    partition = slot_entry("partition-0").partition

    async def give_back(self, deliveries: list[tuple[bytes, float]]) -> None:
        del deliveries


def test_what_an_attempt_skipped_in_its_give_back_after_a_stall_explains(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Seeds 1738, 1877 of the packed worlds with early stops and pausing executors, 1496,
    1610 of the worlds of mutant `came-again-kept-at-a-lost-seal`: an attempt took a delivery,
    its process stalled more than half the ack wait (4 s here), and as it failed or Spark closed
    it, its give-back skipped the delivery as not surely running; it waited out its ack wait.
    Only a stall between the delivery and that give-back, longer than half the wait, explains;
    of a recorded message, only a delivery that came again to the attempt, its entry not taken
    over by another attempt (whose keeper keeps it)."""
    now = [5.5]
    attempts, closed = Attempts(lambda: now[0]), attempt(loop)
    closed.finished.set_result([])
    reader = Reader()
    attempts.watch_give_backs(closed, reader)  # type: ignore[arg-type]
    loop.run_until_complete(reader.give_back([]))
    consumer = Consumer(CONSUMER, "p0.", Stream(), 4.0, 100)
    held = Delivery(1, 1, 9.5, owner=closed, queued=9.5, at=1.0)
    deliveries = [held, Delivery(2, 2, 13.5, at=9.5)]

    def skipped(stalls: list[tuple[Participant, float, float]], delivery: Delivery = held) -> bool:
        why = attempts.skipped_after_a_stall(SEQ, delivery, deliveries, consumer, stalls)
        return why is not None

    assert skipped([(closed, 1.5, 4.0)])
    assert skipped([(closed, 0.5, 3.0)])  # delivered into the paused process
    assert not skipped([(closed, 1.5, 3.5)])  # half the wait: it still ran surely
    assert not skipped([(closed, 6.0, 9.0)])  # after the give-back
    assert skipped([(closed, 1.5, 7.0)])  # still on at the give-back (seed 1244)
    assert not skipped([(closed, 4.0, 7.0)])  # 1.5 s of it before the give-back
    assert not skipped([(closed, -2.0, 1.0)])  # over as it came
    assert not skipped([(attempt(loop), 1.5, 4.0)])  # another process's
    other_slot = Delivery(1, 1, 9.5, owner=closed, queued=9.5, at=1.0)
    of_partition_1 = Consumer("g-partition-1", "p1.", Stream(), 4.0, 100)
    why = attempts.skipped_after_a_stall(
        SEQ, other_slot, [other_slot], of_partition_1, [(closed, 1.5, 4.0)]
    )
    assert why is None  # its slot of that consumer gave nothing back
    given_back = Delivery(1, 1, 9.5, owner=closed, queued=3.0, given_back=True, at=1.0)
    assert not skipped([(closed, 1.5, 4.0)], given_back)
    attempts.recorded[closed] = {SEQ}
    assert not skipped([(closed, 1.5, 4.0)])  # the delivery its entry names
    deliveries.insert(0, Delivery(1, 1, 0.5, owner=closed, given_back=True, at=0.2))
    assert skipped([(closed, 1.5, 4.0)])  # came again, its recorded one given back
    entry = slot_entry("partition-0")
    entry.ledger = Ledger(BucketView(MemoryBucket()), entry.partition.lineage)  # type: ignore[arg-type]
    attempts.entries[closed] = [entry]
    key = lateness._head_key(entry)
    attempts.claims.append(lateness.Claim(closed, key, 0.0, 0.5))
    attempts.taken_over_at[key] = [0.4, 3.0]  # its own take-over, then another attempt's
    assert not skipped([(closed, 1.5, 4.0)])  # its taker keeps it


@pytest.mark.usefixtures("short_holds")
def test_a_message_a_take_over_adopted_came_again_at_the_taker_s_first_delivery(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Seed 636 of helper-66's worlds of mutant `came-again-kept-at-a-lost-seal` whose
    processes stall at 3% of their points: a retry took over the entry its zombie had recorded
    1 in, and a new checkpoint's give-back removed it and NAKed 1, whose redelivery came to the
    retry; its process stalled past half the wait, and as it failed on the removed entry its
    give-back skipped 1. The entry named the zombie's delivery, not the retry's first one: that
    came again, and the stall explains. Before, only an attempt's second delivery of a message
    it recorded was taken to have come again."""
    attempts, closed, taker = taken_over(loop, released=True, recording=True)
    attempts.now = lambda: 9.0
    reader = Reader()
    attempts.watch_give_backs(taker, reader)  # type: ignore[arg-type]
    loop.run_until_complete(reader.give_back([]))
    consumer = Consumer(CONSUMER, "p0.", Stream(), 4.0, 100)
    named = Delivery(1, 1, 1.5, owner=closed, given_back=True, at=1.0)
    again = Delivery(2, 2, 10.0, owner=taker, queued=10.0, at=6.0)
    deliveries = [named, again, Delivery(3, 3, 14.0, at=10.0)]
    why = attempts.skipped_after_a_stall(SEQ, again, deliveries, consumer, [(taker, 6.0, 8.5)])
    assert why == "an attempt that held it unrecorded stalled, then failed or was closed"
