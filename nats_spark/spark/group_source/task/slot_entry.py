"""The ack ledger entry of one slot of one batch, as the task reading the slot keeps it.

A task claims the entry first: it creates it, takes over an open one (an earlier attempt died
mid-way, or gave it up), or finds it sealed (the batch's content is fixed: it replays exactly
that); an open one whose holder is alive (it keeps its head fresh while it pulls) it stands by
for until it is sealed, released or quiet. Deliveries
are written to the entry before their rows leave the task; slots sharing a consumer (siblings)
check each other's entries so that no message is emitted by two of them. The entry is sealed when
the slot has taken all it will. An attempt whose entry another attempt takes over while it is
alive (a speculative copy beside it) waits for the seal and ends with the sealed content too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import pyarrow as pa

from nats_spark import clock
from nats_spark.arrays import int_array
from nats_spark.client import NatsClient
from nats_spark.jetstream.acks import InProgressKeeper, ack_prefix
from nats_spark.jetstream.pull import PullConsumer
from nats_spark.spark.group_source import ledger_protocol as protocol
from nats_spark.spark.group_source.ledger import (
    EntryDeliveries,
    EntryHead,
    Ledger,
    LedgerConflict,
    PointerReads,
    read_deliveries,
    read_head,
    recorded_in,
    write_head,
)
from nats_spark.spark.group_source.packed_heads import task_layouts
from nats_spark.spark.group_source.runtime import PROCESS
from nats_spark.spark.group_source.slot_partition import SlotPartition
from nats_spark.spark.group_source.task.columns import SlotColumns

log = logging.getLogger(__name__)


class SlotEntry:
    def __init__(
        self,
        client: NatsClient,
        partition: SlotPartition,
        new_id: Callable[[], str] = PROCESS.new_id,
    ) -> None:
        self.client = client
        self.partition = partition
        self.new_id = new_id  # of this attempt, and of each take-over
        self.head = EntryHead(attempt=new_id()[:12])
        self.revision = 0
        self.recorded_earlier = EntryDeliveries()  # by earlier attempts: replayed by this one
        self.taken: set[int] = set()  # stream sequences recorded (or replayed) by this slot
        self.fixed = False  # found sealed: exactly `recorded_earlier`, nothing more
        self.overtaken = False  # another attempt took the entry over and sealed it
        # its consumer delivered a first time what a batch holds (`Acceptance`): every delivery
        # is at risk of being a sibling's too, not only redeliveries
        self.delivering_again = False
        self.ledger: Ledger | None = None
        self.pointer: PointerReads | None = None  # `pointer_reads`
        self.writing = asyncio.Lock()  # head writes one at a time: each on the last's revision
        self.written = clock.monotonic()  # when this attempt last wrote its head

    async def open_ledger(self) -> Ledger:
        if self.ledger is None:
            kv = await Ledger.bucket(
                self.client, self.partition.reading.ledger_bucket, create=False
            )
            self.ledger = Ledger(kv, self.partition.lineage, task_layouts([self.partition]))
        return self.ledger

    def pointer_reads(self, ledger: Ledger) -> PointerReads:
        """The target's pointer, for the fence checks of this attempt's claim (a task of packed
        slots shares one among its slots' claims)."""
        if self.pointer is None:
            self.pointer = PointerReads(ledger.kv, self.partition.pointer_key)
        return self.pointer

    async def claim(
        self,
        keep: Callable[[EntryDeliveries], Awaitable[None]] | None = None,
        restart: Callable[[EntryDeliveries], Awaitable[None]] | None = None,
    ) -> None:
        """Create the entry, take over an open one whose holder died or released it, or find it
        sealed (at once, or once the live attempt holding it seals it). The create goes first:
        a first attempt, which most are, finds no entry. A take-over hands what it adopts to
        `restart` (the reader's: their ack wait restarted) once it read it, before its write,
        and to `keep` (the reader's keeper) as soon as that write lands: the entry holds it
        from then on, and nothing kept its waits since the attempt it took it over from ended."""
        ledger = await self.open_ledger()
        gen, slot = self.partition.gen, self.partition.slot
        pointer = self.pointer_reads(ledger)
        while True:
            revision = await protocol.create(ledger, gen, slot, self.head, self.partition.pin_id)
            if revision is not None:
                await protocol.check_fence(ledger, pointer, gen, slot, self.head.attempt)
                self.revision = revision
                return
            found = await read_head(ledger, gen, slot)
            if found is None:
                continue  # removed since the create found it: create it again (fenced)
            if protocol.held_by_another(found[0], self.head.attempt):
                found = await protocol.await_holder(ledger, gen, slot, protocol.HOLD_QUIET)
            previous, revision = found
            self.recorded_earlier = await read_deliveries(ledger, previous)
            self.taken = set(self.recorded_earlier.stream_seq)
            if protocol.content_fixed(previous):
                self.fixed = True
                self.head = previous
                return
            # An earlier attempt died mid-way: adopt what it took, then go on pulling. Or the
            # entry is this attempt's own create, whose answer was lost after it took effect.
            # Their waits are restarted before the write, a ledger round trip that may take
            # most of what is left of them (seed 110 of the slow-ledger worlds with a 4 s wait:
            # the release's last +WPI, a restart's whole second and the write let one run
            # out). Sound if the write fails: a `+WPI` gives nothing back, and what it restarts
            # of another attempt or reader (a later delivery) is only kept longer.
            if restart is not None:
                await restart(self.recorded_earlier)
            self.head = protocol.take_over(previous, self.partition.pin_id, self.new_id()[:12])
            try:
                self.revision = await write_head(ledger, gen, slot, self.head, revision)
            except LedgerConflict:
                # The attempt it takes over wrote meanwhile (a zombie), or the entry was removed
                # (its batch settled): create it afresh, naming none of the chunks taken over
                # (the fence then stops this attempt), or read it again where it is still there.
                self.head = EntryHead(attempt=self.head.attempt)
                self.recorded_earlier, self.taken = EntryDeliveries(), set()
                continue
            # Before the reads below, a round trip or more each: a wait that ran out meanwhile
            # was lost (seed 18241 of the worlds with another client and restarts: a sibling
            # dropped the redelivery as recorded, and the take-over's +WPI came 0.15 s late).
            if keep is not None:
                await keep(self.recorded_earlier)
            # Past the fence as a create is: the entry may be one an attempt that outlived its
            # settled batch created again (its own create, or another's killed before its
            # fence check); pulling into it would record messages as that settled batch's.
            await protocol.check_fence(ledger, pointer, gen, slot, self.head.attempt)
            # The attempt that died may have recorded without looking at its siblings' records.
            siblings = self.partition.siblings
            twice = await self.drop_taken_twice(set(self.taken)) if siblings else set()
            if twice or protocol.outdated(previous):
                self.recorded_earlier = self.recorded_earlier.without(twice)
                self.taken -= twice
                self.revision = await protocol.record_anew(
                    ledger, gen, slot, self.head, self.revision, self.recorded_earlier
                )
                self.written = clock.monotonic()
            return

    async def sealed_rest(self, emitted: list[int]) -> EntryDeliveries:
        """After `TakenOver`: the rest of the entry as the attempt that took it over seals it,
        past `emitted` (the stream sequences of the rows this attempt handed out, in order), so
        that both attempts hand out the same rows. `LedgerConflict` when the sealed entry does
        not start with `emitted` (the take-over dropped some: `drop_taken_twice`), when it is
        removed, or when its head stands still for `quiet_limit`."""
        ledger = await self.open_ledger()
        gen, slot = self.partition.gen, self.partition.slot
        head = await protocol.await_sealed(ledger, gen, slot, self.quiet_limit)
        sealed = await read_deliveries(ledger, head)
        if sealed.stream_seq[: len(emitted)] != emitted:
            raise LedgerConflict(
                f"ledger entry {ledger.head_key(gen, slot)} was taken over by another task "
                "attempt, which sealed it without some of the rows this attempt handed out"
            )
        self.head, self.fixed, self.overtaken = head, True, True
        log.info(
            "slot %s: another task attempt took the ledger entry over and sealed it; this "
            "attempt hands out the rest of it (%d of %d rows)",
            slot,
            len(sealed) - len(emitted),
            len(sealed),
        )
        return sealed.part(len(emitted), len(sealed))

    @property
    def quiet_limit(self) -> float:
        """How long the head of a live holder may stand still: a holder writes it at every
        record, and between two at most waits out a pull (`fetchTimeout`, or an availableNow
        run's wait for redeliveries) and the collection of late deliveries (half an ack wait); the
        rest of two ack waits covers retried pulls and a stall (past its ack wait a holder
        loses what it holds anyway)."""
        partition = self.partition
        return 2 * partition.ack_wait + partition.reading.fetch_timeout + partition.redelivery_wait

    async def recorded_by_siblings(self) -> set[int]:
        """Every stream sequence the sibling slots have recorded in this batch, read now."""
        assert self.ledger is not None
        return await recorded_in(self.ledger, self.partition.gen, self.partition.siblings)

    async def held_by_the_batch(self) -> set[int]:
        """The stream sequences this slot and its siblings have recorded in this batch, read
        now: what a run again of the batch replays of its consumer."""
        if not self.partition.siblings:
            return set(self.taken)
        return self.taken | await self.recorded_by_siblings()

    async def drop_taken_twice(self, at_risk: set[int]) -> set[int]:
        """Of `at_risk`, just recorded by this slot, what a sibling recorded too; both drop it
        from their entries, so it is emitted once or not at all (then it stays pending and comes
        back). Each slot records before it looks, so of two slots taking one message the later
        recorder always sees the other's record."""
        if not at_risk:
            return set()
        twice = at_risk & await self.recorded_by_siblings()
        if twice:
            log.warning(
                "slot %s: %d messages were also taken by a sibling slot after their ack wait ran "
                "out; this slot drops them (the sibling emits them, or drops them too and they "
                "are read again)",
                self.partition.slot,
                len(twice),
            )
        return twice

    async def record(
        self,
        columns: SlotColumns,
        replies: list[bytes],
        pin: str | None,
        renewed: float,
        last: bool = False,
    ) -> tuple[pa.RecordBatch, set[int]]:
        """Write the deliveries to the entry; returns their rows and what was dropped from them.
        With siblings, what may have reached a sibling too (redeliveries, or rows recorded late:
        the ack wait may have run out first: counted from their pull request, or from `renewed`,
        when it last started over) is checked against the siblings' records and dropped if
        found. `last`: the slot takes nothing after these; without siblings (whose records are
        checked after the write) the write seals the entry too (`protocol.record`)."""
        before = self.head.recorded()
        taken = EntryDeliveries(
            ack_prefix(replies[0]),
            list(columns.stream_seq),
            list(columns.consumer_seq),
            list(columns.delivered),
        )
        await self._write(before, taken, pin, sealing=last and not self.partition.siblings)
        rows = columns.record_batch()
        if not self.partition.siblings:
            return rows, set()
        # A renewal covers the rows only if it came after they were taken and while their ack
        # wait, from their request, still ran (a late +WPI rescues nothing: a pause between the
        # server's send and the take, or between two rounds, is followed by a round at once).
        limit = self.partition.ack_wait / 2
        covered = columns.last_taken <= renewed < columns.requested + limit
        since = renewed if covered else columns.requested
        late = self.delivering_again or clock.monotonic() - since > limit
        at_risk = {
            seq
            for seq, delivered in zip(columns.stream_seq, columns.delivered, strict=True)
            if late or delivered > 1
        }
        twice = await self.drop_taken_twice(at_risk)
        if not twice:
            return rows, twice
        kept = int_array(i for i, s in enumerate(columns.stream_seq) if s not in twice)
        await self._write(before, taken.without(twice), pin, replacing=len(taken))
        self.taken -= twice
        return rows.take(kept), twice

    async def _write(
        self,
        kept: tuple[str, list[str]],
        taken: EntryDeliveries,
        pin: str | None,
        replacing: int = 0,
        sealing: bool = False,
    ) -> None:
        """Record `taken` after what `kept` names (in place of `replacing` deliveries recorded
        after it; `sealing`: and seal the entry)."""
        assert self.ledger is not None
        gen, slot = self.partition.gen, self.partition.slot
        async with self.writing:
            self.revision = await protocol.record(
                self.ledger,
                gen,
                slot,
                self.head,
                self.revision,
                kept,
                taken,
                pin,
                replacing,
                sealing,
            )
            self.written = clock.monotonic()

    async def seal(self) -> None:
        assert self.ledger is not None
        gen, slot = self.partition.gen, self.partition.slot
        async with self.writing:
            self.revision = await protocol.seal(self.ledger, gen, slot, self.head, self.revision)

    async def hold(self, busy: Callable[[], bool]) -> None:
        """While the attempt pulls (cancelled by `end_hold`): write the head as it is when it
        has not been written for `HOLD_RENEWAL`, so that another attempt of the task (a
        speculative copy, a retry beside a zombie) stands by instead of taking the entry over.
        Only while `busy`: between the steps of its pulls, each of bounded length, not while
        its rows wait for Spark to take them (a holder that never goes on must go quiet: its
        renewals alone would keep another attempt standing by for good). Ends when the entry
        was taken from it."""
        assert self.ledger is not None
        gen, slot = self.partition.gen, self.partition.slot
        while True:
            await asyncio.sleep(protocol.HOLD_RENEWAL / 2)
            if clock.monotonic() - self.written < protocol.HOLD_RENEWAL or not busy():
                continue
            async with self.writing:
                try:
                    self.revision = await write_head(
                        self.ledger, gen, slot, self.head, self.revision
                    )
                except LedgerConflict:
                    return  # its next record finds that
                self.written = clock.monotonic()

    async def end_hold(self, holding: asyncio.Future[None]) -> None:
        """Stop `holding` (`hold`'s task) between its writes: one cut short could leave this
        attempt a revision behind its head's, and its seal would then fail. A cancellation of
        this attempt meanwhile is swallowed with the holder's: `end_hold` runs first in the
        `finally` of the slot's pulls, whose rest (the give-back of what it did not record, the
        keeper's end, the consumer's close) must run too; raising here skipped them (seed 248
        of the early-stop worlds broke per-key order again)."""
        async with self.writing:
            holding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holding

    async def held_by_another(self) -> bool:
        """After `TakenOver` by another attempt of the query: whether the entry is still there
        and not given back (`kept_by_its_taker`'s rule, on its head as it is now). True when the
        read fails: as the failed write found it."""
        ledger = await self.open_ledger()
        try:
            found = await read_head(ledger, self.partition.gen, self.partition.slot)
        except Exception as error:
            log.debug(
                "slot %s: reading its ledger entry again failed: %s", self.partition.slot, error
            )
            return True
        return found is not None and found[0].attempt != protocol.GIVEN_BACK

    async def release(self) -> bool:
        """The attempt ends without sealing the entry it holds (it failed, or Spark closed it):
        mark it released, so that a retry takes it over at once; whether it did. Not an entry
        it never claimed (revision 0: an ack-only partition, or a claim that failed): a write on
        revision 0 would create it."""
        if (
            self.ledger is None
            or not self.revision
            or self.fixed
            or protocol.content_fixed(self.head)
        ):
            return False
        gen, slot = self.partition.gen, self.partition.slot
        try:
            async with self.writing:
                return await protocol.release(self.ledger, gen, slot, self.head, self.revision)
        except Exception as error:  # a retry then waits for the head to go quiet
            log.debug("slot %s: releasing its ledger entry failed: %s", slot, error)
            return False


class Recorder:
    """Records a slot's record batches in its entry, one write at a time and in order: each
    runs while the next batch is gathered, and a batch's rows are handed out only once its write
    is done. What a write drops (a sibling emits it) is no longer kept from redelivery."""

    def __init__(self, entry: SlotEntry, keeper: InProgressKeeper, consumer: PullConsumer) -> None:
        self.entry = entry
        self.keeper = keeper
        self.consumer = consumer  # its pin goes into the entry
        self.writing: asyncio.Future[pa.RecordBatch] | None = None
        self.recorded: set[int] = set()  # stream sequences its writes recorded

    async def record(
        self, columns: SlotColumns, replies: list[bytes], last: bool = False
    ) -> pa.RecordBatch | None:
        """Start recording `columns` (`last`: the slot takes nothing after them); returns the
        rows of the write before, once it is done."""
        rows = await self._written() if self.writing else None
        pin = self.consumer.pin_id
        self.writing = asyncio.ensure_future(self._write(columns, replies, pin, last))
        return rows

    async def last(self) -> pa.RecordBatch | None:
        """The rows of the last write, once it is done."""
        rows = await self._written() if self.writing else None
        self.writing = None
        return rows

    async def _written(self) -> pa.RecordBatch:
        """The write in flight's rows. Shielded: an attempt cancelled meanwhile (a packed task
        ends early) lets it finish (`finish`), so that the entry's revision and what it recorded
        are known: cut off from them, the attempt gave back recorded messages (another reader of
        the consumer could take one its batch commits) and could not release the entry."""
        assert self.writing is not None
        return await asyncio.shield(self.writing)

    async def finish(self) -> set[int]:
        """Let the write in flight finish (or fail); the stream sequences recorded."""
        writing, self.writing = self.writing, None
        if writing is not None:
            with contextlib.suppress(Exception):
                await writing
        return self.recorded

    async def _write(
        self, columns: SlotColumns, replies: list[bytes], pin: str | None, last: bool
    ) -> pa.RecordBatch:
        batch, dropped = await self.entry.record(columns, replies, pin, self.keeper.renewed, last)
        self.keeper.release(dropped)  # they come back to a slot
        self.recorded.update(columns.stream_seq)
        return batch
