"""Executor side: read one input partition (one slot of one batch) into Arrow record batches.

A slot's task first acks what its committed batches emitted (`SlotHistory`) and claims the
slot's ledger entry (`SlotEntry`). A later attempt of the slot replays what the entry holds
(`Replayer`; sealed: all of it and nothing more, open: what was recorded, then it goes on
pulling). A first attempt pulls, through a short pipeline:

    pull (`SlotPulls`) -> accept (`Acceptance`) -> columns (`SlotColumns`) -> record (`Recorder`)
    -> emit

every message recorded in the entry before its row leaves the task, while `InProgressKeeper`
keeps what the task holds from redelivery. The task then seals the entry; with the last record
already when it knows that record is its last (it took all it was to take, no request of it is
out, and it has no siblings to check after the write), one head write fewer.

A task of packed slots (`PackedSlots`) first acks what the committed batches left to all its
slots together (one flush) while it claims all its slots' entries at once (a slot's claim is a few
round trips: one slot after another they were most of a task's time at many slots), marks the
acked entries while its slots pull (at 256 slots and a steady rate, the acks and the marks were
each up to a fifth of a task's time), and reads what they dedupe against once for them all,
then runs each slot's steps as above, on one connection and one opening of the ledger bucket:
up to `SLOTS_AT_ONCE` at a time, a slot starting as another's steps end, those ahead of the one
emitting queueing their record batches within one bound for them all (`QueuedAhead`), so that
rows still leave slot by slot in the packed order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator, Iterator, Sequence

import pyarrow as pa

from nats_spark import clock
from nats_spark.arrays import int_array
from nats_spark.client import NatsClient, shared_client
from nats_spark.errors import consumer_created_again
from nats_spark.jetstream.acks import (
    NAK,
    RESTART_AFTER,
    SHORT_ACK_WAIT,
    InProgressKeeper,
    publish_acks,
    surely_running,
)
from nats_spark.jetstream.pull import Deliveries, PullConsumer
from nats_spark.jetstream.replies import created_later
from nats_spark.loop import run_sync
from nats_spark.requests_at_once import all_results
from nats_spark.spark.group_source import ledger_protocol as protocol
from nats_spark.spark.group_source.ledger import EntryDeliveries, Ledger, TakenOver
from nats_spark.spark.group_source.packed_heads import task_layouts
from nats_spark.spark.group_source.runtime import PROCESS, Runtime
from nats_spark.spark.group_source.slot_partition import PackedSlots, SlotPartition
from nats_spark.spark.group_source.task.acceptance import Acceptance
from nats_spark.spark.group_source.task.columns import SlotColumns
from nats_spark.spark.group_source.task.pull_policy import SlotPullPolicy
from nats_spark.spark.group_source.task.replay import Replayer
from nats_spark.spark.group_source.task.slot_entry import Recorder, SlotEntry
from nats_spark.spark.group_source.task.slot_history import (
    DedupeReads,
    SlotHistory,
    ack_committed_together,
    mark_acked_together,
)
from nats_spark.spark.group_source.task.slot_pulls import SlotPulls
from nats_spark.spark.shared.columns import BATCH_BYTES
from nats_spark.spark.shared.worker_gc import freeze_imports

log = logging.getLogger(__name__)


class SlotReader:
    """One slot's task, on `client`. Its collaborators are made here, once, and handed to each
    step."""

    def __init__(
        self, partition: SlotPartition, client: NatsClient, runtime: Runtime = PROCESS
    ) -> None:
        self.partition = partition
        self.client = client
        self.runtime = runtime
        self.entry = SlotEntry(self.client, partition, runtime.new_id)
        self.keeper = InProgressKeeper(self.client.nc, partition.ack_wait, f"slot {partition.slot}")
        self.keeping: asyncio.Future[None] | None = None  # the keeper's rounds (`start_keeping`)
        self.replayer = Replayer(self.client, partition)
        self.acceptance: Acceptance | None = None  # made by `begin`, for a slot that pulls
        # the chunk in acceptance, and when its request was sent (left when it fails)
        self.accepting: tuple[Deliveries, float] | None = None
        self.pulling = partition.limit > 0
        self.started = clock.monotonic()  # before any delivery this attempt holds
        self.handing_out = False  # its rows wait for Spark to take them
        # Recorded deliveries that came again, kept until the release tells whether a taker
        # keeps them or a give-back took the entry (`give_back_unrecorded`, `abandon`).
        self.came_again_undecided = False
        self.begun = False  # acked and claimed (`begin`)
        self.stepping = False  # its steps run (`slot_batches`): their end lets go of the entry
        self._history: SlotHistory | None = None

    async def begin(self) -> None:
        """Ack what committed batches left (the acks free the capacity the batch was planned
        with), then claim the ledger entry. Once: a task of packed slots acks for all its
        slots while they claim (`packed_batches`)."""
        if self.begun:
            return
        await (await self.history()).ack_committed()
        await self.claim()

    async def claim(self) -> None:
        """Claim the ledger entry: create it, take over an open one, or replay a sealed one. An
        ack-only partition (`limit` 0) claims nothing."""
        if self.begun:
            return
        self.begun = True
        partition = self.partition
        if not self.pulling:
            return
        try:
            await self.entry.claim(self.keep_taken_over, self.restart_taken_over)
        except BaseException:  # what it took over is not its to keep (a fence), or it fails
            await self.stop_keeping()
            raise
        if self.entry.fixed:
            self.pulling = False  # the batch's content is fixed: exactly this, nothing more
            return
        self.keep_on_taken_over()
        self.acceptance = Acceptance(
            self.entry,
            self.keeper,
            await self.history(),
            self.client.nc,
            partition.dedupe_through,
            bool(partition.siblings),
            partition.consumer_sighting,
            self.consumer_created,
        )

    async def keep_taken_over(self, taken_over: EntryDeliveries) -> None:
        """A take-over, as its write lands: the keeper holds what earlier attempts recorded from
        now until the seal, its ack wait restarted at once (the claim's fence and sibling reads
        come after). Nothing kept those waits since that attempt ended: one may have run out
        and gone to a sibling that dropped it as recorded (seed 12503 of the worlds with
        another client), and a retry that then pulls, or stalls, past the wait would let it go
        before the commit (seed 21621). Its rounds start here, not once the claim is done: those
        reads, under slow ledger answers, took 4.1 s after this restart, and the first round a
        third of the 6 s wait later came after it ran out (seed 662 of the slow-ledger worlds
        with early stops and answers up to 1.5 s: another client took 10, 11 and 12, which the
        batch committed)."""
        if not taken_over:
            return
        self.keeper.hold(taken_over.stream_seq, taken_over.subjects(), -math.inf)
        await self.keeper.renew()
        self.start_keeping()

    async def restart_taken_over(self, found: EntryDeliveries) -> None:
        """A take-over, before its write: restart the ack wait of what the entry holds, kept by
        nobody since its attempt's last round (`SlotEntry.claim`). Not held yet: the write may
        fail (`keep_taken_over` holds it once it lands)."""
        await self.keeper.restart(found.subjects())

    def keep_on_taken_over(self) -> None:
        """After the claim: the keeper's rounds go on with what the take-over kept, but for what
        the claim found a sibling recorded too and dropped (the sibling keeps it)."""
        dropped = set(self.keeper.held).difference(self.entry.recorded_earlier.stream_seq)
        self.keeper.release(dropped)
        if self.keeper.held:
            self.start_keeping()

    def start_keeping(self) -> None:
        """The keeper's rounds, until `stop_keeping`; once."""
        if self.keeping is None:
            self.keeping = asyncio.ensure_future(self.keeper.run())

    async def stop_keeping(self) -> None:
        """End the keeper's rounds (stopped, never cancelled: it may be inside a flush). Awaited
        shielded: a slot cancelled meanwhile (its packed task ends early) would cancel the
        keeper's task with it, and its `abandon`, awaiting that task again, failed before the
        release, leaving the entry held (the batch's next read stood by `HOLD_QUIET`)."""
        self.keeper.stop()
        if self.keeping is not None:
            await asyncio.shield(self.keeping)

    async def abandon(self) -> None:
        """The attempt ends without sealing the entry it claimed: it keeps nothing from
        redelivery any more, and releases the entry, so that a retry takes it over at once
        instead of waiting for its head to go quiet. What it recorded is kept by nobody from
        its keeper's last round until the taker restarts their wait (`restart_taken_over`):
        the taker may start only seconds later (a job reading a batch's tasks first ends when
        all its tasks have, the batch's full read starts then) and its claim is three ledger
        round trips or more. So their wait is restarted just before the release, whatever was
        used of it (a release is rare, not worth the seal's saving: `renew_used_wait`), but
        only of the deliveries whose wait surely runs (`InProgressKeeper.restart_running`):
        after a stall, or a new checkpoint's give-back (which NAKed them), a `+WPI` would
        restart what came again to another reader, holding it back behind newer messages of
        its key (seed 162 of the replaced-mid-batch worlds). Seed 52 of the slow-ledger worlds
        with a 6 s wait: renewed at 8.8 s, released at 10.7 s, taken over at 15.0 s, after the
        wait ran out and another client took a message; seed 349 of the same with answers up
        to 1.5 s: renewed 0.7 s before the release, whose taker's first `+WPI` came 6.2 s after
        that renewal (a restart once the release's answer came was too late).

        The recorded deliveries that came again, which `give_back_unrecorded` could not judge
        (`came_again_undecided`), are judged by the release: landed, the entry is still the
        query's and a taker keeps them (their wait restarted now, as the rest's was); refused,
        a new checkpoint's give-back took it, whose NAK may be what brought them again, and
        they are NAKed (`give_back_came_again`)."""
        await self.stop_keeping()
        await self.keeper.restart_running()
        released = await self.entry.release()
        if self.came_again_undecided:  # the release tells who has them (seed 723)
            if released:
                await self.keeper.restart_running(came_again=True)
            else:
                await self.give_back_came_again()

    async def history(self) -> SlotHistory:
        if self._history is None:
            ledger = await self.entry.open_ledger()
            seen = self.runtime.seen_entries
            self._history = SlotHistory(self.client, ledger, self.partition, seen)
        return self._history

    async def pull_record_batches(self) -> AsyncGenerator[pa.RecordBatch, None]:
        """Record batches pulled from NATS, each recorded before it leaves.

        What one pull request delivered becomes one record batch and one ledger write (split
        into ledger chunks). The work overlaps: a request that delivered all it asked for
        has the next one sent before its messages are processed (`SlotPulls`), and a batch's
        ledger write runs while the next batch is gathered (`Recorder`).
        """
        partition, reading, acceptance = self.partition, self.partition.reading, self.acceptance
        assert acceptance is not None  # `begin` made it
        consumer = self.client.pull_consumer(
            partition.stream,
            partition.consumer,
            group=partition.priority_group,
            pin_id=self.entry.head.pin,
        )
        pulls = SlotPulls(
            consumer,
            SlotPullPolicy(
                reading.fetch_batch_size,
                reading.fetch_timeout,
                partition.redelivery_wait,
                partition.ack_wait,
            ),
            reading.thresholds,
            partition.limit - self.entry.head.count,
            bool(partition.siblings),
            partition.ack_wait,
            partition.slot,
        )
        recorder = Recorder(self.entry, self.keeper, consumer)
        self.start_keeping()
        holding = asyncio.ensure_future(self.entry.hold(lambda: not self.handing_out))
        finished = kept_by_taker = lost = False
        try:
            async with contextlib.aclosing(pulls.chunks()) as chunks:
                async for chunk, sent in chunks:  # pull, a request's deliveries whole
                    self.accepting = chunk, sent
                    accepted = await acceptance.accept(chunk, sent)  # accept
                    self.accepting = None
                    pulls.took(len(accepted.replies), accepted.acked)
                    await self.keep_taken_late(chunk, sent)
                    if not accepted.replies:
                        continue
                    columns = SlotColumns.of(partition)  # columns
                    columns.take(chunk, accepted.rows)
                    columns.taken_from(sent)
                    # the last record seals the entry too (`SlotEntry.record`)
                    last = pulls.over()
                    rows = await recorder.record(columns, accepted.replies, last)  # record
                    if rows is not None:
                        yield rows  # emit
            if (rows := await recorder.last()) is not None:
                yield rows
            finished = True
        except TakenOver as taken:
            kept_by_taker = protocol.kept_by_its_taker(taken)
            lost = not kept_by_taker
            raise
        finally:
            await self.entry.end_hold(holding)
            if not finished:  # what it recorded stays kept until the entry is let go of
                await self.give_back_unrecorded(recorder, consumer, kept_by_taker, lost)
            await self.stop_keeping()
            await consumer.close()

    async def keep_taken_late(self, chunk: Deliveries, sent: float) -> None:
        """A chunk taken more than a sixth of the ack wait after its request was sent has its
        wait restarted at once, not at the keeper's next round, up to a third later: what a
        request delivers may reach the task only half the wait after its sending
        (`SlotPullPolicy`), and a nats-server restarted meanwhile counts the wait from the whole
        second before the delivery, so it runs out up to a second early (`encodeConsumerState`).
        One taken sooner waits for the round: a `+WPI` per message is not free (see `seal`)."""
        if clock.monotonic() - sent > self.partition.ack_wait * RESTART_AFTER:
            await self.keeper.renew_taken_late(chunk.numbers.stream_seq)

    async def pulled_and_sealed(self) -> AsyncGenerator[pa.RecordBatch, None]:
        """Pull, record and hand out, then seal. An attempt whose entry another attempt took
        over meanwhile (it is alive beside it: a speculative copy) hands out the rest of the
        sealed entry instead: both end with its rows, whichever Spark keeps."""
        emitted = [int_array(self.entry.recorded_earlier.stream_seq)]  # read on a take-over only
        sealing = False
        try:
            async with contextlib.aclosing(self.pull_record_batches()) as batches:
                async for batch in batches:
                    emitted.append(batch.column("stream_seq"))
                    self.handing_out = True  # no renewals while Spark has not taken them
                    yield batch
                    self.handing_out = False
            sealing = True
            await self.seal()
        except TakenOver as taken:
            if sealing and not protocol.kept_by_its_taker(taken):
                await self.give_back_came_again()
            rest = await self.entry.sealed_rest(pa.concat_arrays(emitted).to_pylist())
            async for batch in self.replayer.record_batches(rest):
                yield batch

    async def give_back_unrecorded(
        self, recorder: Recorder, consumer: PullConsumer, kept_by_taker: bool, lost: bool
    ) -> None:
        """Closed or failed mid-batch: NAK what this attempt pulled and did not record, so that
        it comes back at once instead of after its ack wait. The write in flight is let finish
        (what it records is the entry's: a later attempt replays it, or a new checkpoint gives
        it back); what requests still out deliver within `fetchTimeout` is given back too, as
        is the chunk whose acceptance failed (a dedupe read of an entry a new checkpoint gave
        back, a consumer created again), whose deliveries the keeper does not hold (those it
        acked as an earlier batch's are no longer pending: the server ignores their NAK). So
        is a recorded message that came again since, to a pull it processed or to one still
        out, when the attempt lost the entry to a give-back (`lost`: a head write found it
        given back or removed): the entry names its earlier delivery, and a new checkpoint's
        give-back of the entry NAKs that one, not this (which would wait out its ack wait,
        behind newer messages of its key). Not when the attempt lost the entry to another
        attempt of the query (`kept_by_taker`): that one's keeper keeps the delivery with what
        the entry holds, and a NAK would hand it to any reader of the consumer (seed 851:
        another client got a message the batch then committed). Nor when it knows neither
        (Spark closed it, or it failed otherwise): the keeper holds those until the release
        tells (`abandon`; seed 723 of the slow-ledger worlds with early stops: NAKed here,
        another client took one its retry then committed). What the attempt took over is
        recorded, as what it recorded itself is. The keeper goes on meanwhile (the wait for
        late deliveries is up to `fetchTimeout`, which may be longer than the ack wait) for
        what stays recorded: only the release lets it go.

        Only deliveries whose ack wait surely runs are NAKed (`surely_running`): one that may
        have run out (the attempt stalled) may be another reader's by now, a retry's that
        recorded it, and a NAK of it would give that delivery back (seeds 1347, 689 of the
        worlds with another client whose executors pause)."""
        try:
            recorded = await recorder.finish() | set(self.entry.recorded_earlier.stream_seq)
            held = self.keeper.held
            # Neither known taken nor lost (Spark closed it, or it failed): its release decides.
            self.came_again_undecided = not (kept_by_taker or lost)
            again = self.keeper.again if lost else set()
            given_back = [seq for seq in held if seq not in recorded or seq in again]
            unrecorded = self.keeper.held_deliveries(given_back)
            if self.accepting is not None:  # its acceptance failed: what of it was not held
                replies = set(held.values())
                chunk, sent = self.accepting
                unrecorded += [(r, sent) for r in chunk.replies if r not in replies]
            self.keeper.release(given_back)
            requested = consumer.requested_since()
            late = await consumer.collect_late(self.partition.reading.fetch_timeout)
            _, late_seqs, _, _ = late.numbers if late else ((), (), (), ())
            if kept_by_taker and await self.taker_lost_it(recorded, late_seqs):
                lost = True
                came_again = self.held_again()
                unrecorded += self.keeper.held_deliveries(came_again)
                self.keeper.release(came_again)
            if late:  # new, or again
                for reply, seq in zip(late.replies, late_seqs, strict=True):
                    if lost or seq not in recorded:
                        unrecorded.append((reply, requested))
                    elif self.came_again_undecided:
                        self.keeper.redelivered(seq, reply, requested)
            await self.give_back(unrecorded)
        except Exception as error:  # they come back after their ack wait
            log.debug(
                "slot %s: giving back unrecorded messages failed: %s", self.partition.slot, error
            )

    async def give_back_came_again(self) -> None:
        """The read ended, and the seal found the entry gone with no attempt of the query
        keeping it: a new checkpoint gave it back, NAKing the deliveries it names. A recorded
        message that came again since (to a request still out when that give-back came) is
        NAKed here, as `give_back_unrecorded` does for a read cut short; else it waits out its
        ack wait behind newer messages of its key (seed 162 of the replaced-mid-batch worlds).
        Judged by the head the seal's write found, not read again (`taker_lost_it`): the read's
        requests had all ended, so no redelivery of a later give-back comes to this attempt,
        and that give-back's NAK, by stream sequence, gives back what came again before."""
        try:
            again = self.held_again()
            came_again = self.keeper.held_deliveries(again)
            self.keeper.release(again)
            await self.give_back(came_again)
        except Exception as error:  # they come back after their ack wait
            log.debug("slot %s: giving back failed: %s", self.partition.slot, error)

    def held_again(self) -> list[int]:
        """The recorded messages held that came again to this attempt's requests."""
        return [seq for seq in self.keeper.again if seq in self.keeper.held]

    async def taker_lost_it(self, recorded: set[int], late_seqs: Sequence[int]) -> bool:
        """Whether the entry another attempt of the query took from this one (`TakenOver`: it
        would keep what came again) was given back or removed since, as this attempt's requests
        ended: a new checkpoint's give-back NAKs the deliveries an entry names, and a recorded
        message it gives back may come again to this attempt's requests after the take-over was
        seen; left unNAKed, it waits out its ack wait behind newer messages of its key (seed
        1141 of the worlds of mutant cancelled-record-leaves-its-chunks: the retry had sealed
        the entry, its query had failed, and the give-back read it before the removal). Read
        only when a recorded message came again (nothing else depends on it)."""
        if not self.held_again() and recorded.isdisjoint(late_seqs):
            return False
        return not await self.entry.held_by_another()

    async def give_back(self, deliveries: list[tuple[bytes, float]]) -> None:
        """NAK those of `deliveries` (each with when its ack wait surely started) whose wait
        surely runs (`surely_running`): one that may have run out may be another reader's."""
        now, ack_wait = clock.monotonic(), self.partition.ack_wait
        naks = [reply for reply, since in deliveries if surely_running(since, now, ack_wait)]
        if naks:
            await publish_acks(self.client.nc, naks, kind=NAK)
            log.info("slot %s: gave back %d messages", self.partition.slot, len(naks))

    async def seal(self) -> None:
        """Seal the entry. Its messages then wait for the next batch's task to ack them, and the
        driver's `SealedKeeper` restarts their ack wait before less than a third of it is left;
        a task that has used more than a sixth of it since its last restart (or its start)
        restarts it first, as does any task under a short ack wait (`renew_used_wait`). A short
        task does not: a `+WPI` per message costs the server about a quarter of what delivering
        and acking the message does."""
        await self.renew_used_wait()
        await self.check_not_created_again()
        await self.entry.seal()

    async def renew_used_wait(self) -> None:
        """Before the entry leaves this attempt's hands (sealed or released): restart the ack wait
        of what the keeper holds when more than a sixth of it was used since it last started (or
        the attempt's start), and always under a short ack wait. What it took over counts from
        the keeper's last round only (the first came at the take-over): their waits started
        before this attempt did."""
        taken_over = bool(self.entry.recorded_earlier)
        kept_since = self.keeper.renewed if taken_over else max(self.started, self.keeper.renewed)
        used = clock.monotonic() - kept_since
        if (
            self.partition.ack_wait < SHORT_ACK_WAIT
            or used > self.partition.ack_wait * RESTART_AFTER
        ):
            await self.keeper.renew()

    async def check_not_created_again(self) -> None:
        """With siblings, before the seal: the consumer is still the one the driver saw. A new
        one may have delivered, as first deliveries, what a sibling took in this batch before
        (nothing tells the slot when the old one had delivered nothing at planning): the attempt
        fails, so the batch is not committed with it (a retry's take-over drops what a sibling
        recorded, and checks again). One look at the consumer per slot and batch."""
        partition, sighting = self.partition, self.partition.consumer_sighting
        if not partition.siblings or sighting is None or not sighting.created:
            return
        created = await self.consumer_created()
        if created_later(created, sighting.created):
            raise consumer_created_again(
                partition.stream,
                partition.consumer,
                "while a batch read it",
                f"created {sighting.created}, now {created}",
                sighting.recreation.starting_by(
                    await self.entry.held_by_the_batch(), await (await self.history()).dedupe()
                ),
            )

    async def consumer_created(self) -> str:
        """When the slot's consumer was created (RFC 3339), asked now."""
        partition = self.partition
        info = await self.client.api.consumer_info(partition.stream, partition.consumer)
        return info.get("created") or ""

    @property
    def redundant(self) -> int:
        """Redeliveries of earlier batches' messages, acked and dropped."""
        return self.acceptance.redundant if self.acceptance else 0


# Slots of a packed task whose steps run at a time (a slot's steps are a chain of round trips:
# with few at a time a task of many slots waits on the server most of its time). A slot's
# record batches (each about `BATCH_BYTES` at most) wait in its queue, QUEUED_BATCHES at most,
# until the task emits them; those of the slots ahead of the emitting one, QUEUED_AHEAD bytes
# at most together, so that a task holds no more rows however many slots run.
SLOTS_AT_ONCE = 16
QUEUED_BATCHES = 2
QUEUED_AHEAD = 8 * BATCH_BYTES


def read_slot(partition: SlotPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one slot of one batch (what `DataSourceStreamReader.read` returns)."""
    freeze_imports()
    return _drive(slot_batches(SlotReader(partition, shared_client(partition.reading.connection))))


def read_packed(packed: PackedSlots) -> Iterator[pa.RecordBatch]:
    """The rows of a task's packed slots of one batch, slot by slot."""
    freeze_imports()
    if not packed.slots:
        return iter(())
    return _drive(packed_task(packed, shared_client(packed.slots[0].reading.connection)))


async def packed_task(
    packed: PackedSlots, client: NatsClient
) -> AsyncGenerator[pa.RecordBatch, None]:
    """A packed task: one connection and one opening of the ledger bucket for all its slots."""
    kv = await Ledger.bucket(client, packed.slots[0].reading.ledger_bucket, create=False)
    readers = [SlotReader(partition, client) for partition in packed.slots]
    # One ledger for all its slots: the heads of a packed batch share its task's key, whose
    # writes and reads its slots then share too (`packed_heads`).
    ledger = Ledger(kv, packed.slots[0].lineage, task_layouts(packed.slots))
    for reader in readers:
        reader.entry.ledger = ledger
    async with contextlib.aclosing(packed_batches(readers)) as batches:
        async for _, batch in batches:
            yield batch


def _drive(batches: AsyncGenerator[pa.RecordBatch, None]) -> Iterator[pa.RecordBatch]:
    try:
        while (batch := run_sync(_next(batches))) is not None:
            yield batch
    finally:
        run_sync(batches.aclose())  # when Spark stops early: end pulls, free the inbox


async def _next(batches: AsyncGenerator[pa.RecordBatch, None]) -> pa.RecordBatch | None:
    return await anext(batches, None)


async def slot_batches(reader: SlotReader) -> AsyncGenerator[pa.RecordBatch, None]:
    """The task's steps: ack and claim, replay what the ledger holds, pull (a first attempt),
    seal. Async, so that the simulation (tests/simulation) runs them on its own loop. An
    attempt that ends without sealing the entry it holds releases it (a retry takes it over at
    once); one killed -9 leaves it to go quiet."""
    partition = reader.partition
    await reader.begin()  # done already in a task of packed slots
    reader.stepping = True
    try:
        async for batch in reader.replayer.record_batches(reader.entry.recorded_earlier):
            yield batch
        if reader.pulling:
            async with contextlib.aclosing(reader.pulled_and_sealed()) as batches:
                async for batch in batches:
                    yield batch
    except BaseException:
        await reader.abandon()
        raise
    reader.replayer.skipped()
    log.debug(
        "slot %s of batch %d: %d rows (%d replayed), %d redeliveries of earlier batches dropped",
        partition.slot,
        partition.gen,
        reader.entry.head.count,
        len(reader.entry.recorded_earlier),
        reader.redundant,
    )


async def packed_batches(
    readers: Sequence[SlotReader],
) -> AsyncGenerator[tuple[str, pa.RecordBatch], None]:
    """The record batches of `readers`' slots (`slot_batches` each) with their slot's name, one
    slot's after the other's in their order, once the committed batches' acks of all of them
    went out together while all of them claimed their entries, concurrently (the acked entries
    are marked so meanwhile, done before the task ends; the earlier entries
    they dedupe against are read once for them all: `DedupeReads`, and so is the pointer
    their fence checks read: `PointerReads`); up to `SLOTS_AT_ONCE` slots
    run at a time, a slot starting as soon as another's steps end, the ones ahead queueing what
    they read (`QueuedAhead`). When the task ends early or one slot fails, the slots still
    running are cancelled (their steps give back what they hold, as a task stopped by Spark
    does), and those whose steps never ran release the entries they claimed."""
    ahead: list[_SlotAhead] = []  # started and not emitted yet, in their order
    started = 0  # readers whose steps were started (`_SlotAhead`), in their order
    marking: asyncio.Future[None] | None = None  # the acked entries' heads, marked meanwhile
    queued = QueuedAhead()
    ending = False  # start no more slots (a slot's end calls `start_more`)
    running = 0  # of the started slots, those whose steps have not ended

    def start_more() -> None:
        nonlocal started, running
        while running < SLOTS_AT_ONCE and started < len(readers) and not ending:
            slot = _SlotAhead(readers[started], queued)
            slot.running.add_done_callback(steps_ended)
            ahead.append(slot)
            started += 1
            running += 1

    def steps_ended(_: object) -> None:
        nonlocal running
        running -= 1
        start_more()

    try:
        if readers:
            histories = [await reader.history() for reader in readers]
            shared = DedupeReads(histories)
            for history in histories:
                history.shared = shared
            pointer = readers[0].entry.pointer_reads(histories[0].ledger)
            for reader in readers:
                reader.entry.pointer = pointer
            acked, claimed = await asyncio.gather(
                ack_committed_together(readers[0].client, histories),
                all_results(reader.claim() for reader in readers),
                return_exceptions=True,  # both end before the task goes on or fails
            )
            if isinstance(acked, BaseException):
                raise acked
            marking = asyncio.ensure_future(mark_acked_together(acked))
            if isinstance(claimed, BaseException):
                raise claimed
        start_more()
        while ahead:
            emitting = ahead[0]
            queued.emitting(emitting)
            async for batch in emitting.batches():
                yield emitting.slot, batch
            ahead.remove(emitting)  # its steps end with its last rows: `steps_ended` starts more
    finally:
        ending = True
        for slot in ahead:
            slot.running.cancel()
        await asyncio.gather(*(slot.running for slot in ahead), return_exceptions=True)
        # Not only the slots never started: a slot's task cancelled before its first step
        # (started in the loop round the task ended in) never ran the steps that release.
        await asyncio.gather(*(reader.abandon() for reader in readers if not reader.stepping))
        if marking is not None:
            await marking


class QueuedAhead:
    """The bytes of the record batches the slots ahead of the emitting one hold queued, together:
    one of them waits to queue a batch that would take them past QUEUED_AHEAD (unless none are
    queued); the emitting slot never waits here (nothing else would empty the queues), and a
    slot waiting here goes on once it is the one emitting."""

    def __init__(self) -> None:
        self.held = 0
        self._emitting: _SlotAhead | None = None
        self._changed = asyncio.Event()

    def emitting(self, slot: _SlotAhead) -> None:
        self._emitting = slot
        self._wake()

    async def take(self, slot: _SlotAhead, size: int) -> int:
        """Room for a batch of `size` bytes of `slot`; what of it counts here (all of it when
        queued while ahead, else 0)."""
        while slot is not self._emitting:
            if not self.held or self.held + size <= QUEUED_AHEAD:
                self.held += size
                return size
            self._changed.clear()
            await self._changed.wait()
        return 0

    def give(self, size: int) -> None:
        """Bytes counted by `take` left their queue."""
        self.held -= size
        self._wake()

    def _wake(self) -> None:
        self._changed.set()


class _SlotAhead:
    """One slot's steps running on their own, their record batches queued for the task (each
    with what of it counts in `QueuedAhead`)."""

    def __init__(self, reader: SlotReader, queued: QueuedAhead) -> None:
        self.slot = reader.partition.slot
        self.queued = queued
        self.queue: asyncio.Queue[tuple[pa.RecordBatch | BaseException | None, int]] = (
            asyncio.Queue(QUEUED_BATCHES)
        )
        self.running = asyncio.ensure_future(self._run(reader))

    async def _run(self, reader: SlotReader) -> None:
        try:
            async with contextlib.aclosing(slot_batches(reader)) as batches:
                async for batch in batches:
                    await self.queue.put((batch, await self.queued.take(self, batch.nbytes)))
        except Exception as error:  # the task fails with it, when this slot's turn comes
            await self.queue.put((error, 0))
        else:
            await self.queue.put((None, 0))

    async def batches(self) -> AsyncGenerator[pa.RecordBatch, None]:
        while True:
            item, counted = await self.queue.get()
            if counted:
                self.queued.give(counted)
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
