"""Driver side of the ack ledger: the entries of the query's lineage (their heads only: what
they hold is read by the tasks that ack and dedupe them), its pointer (newest gen, pins), and the
removal of settled entries. What each head lets it conclude, and the moves it makes, are
`ledger_protocol`'s.

All of it is a cache of what the ledger bucket holds, so a restarted driver rebuilds it. Its work
per batch grows with the slots, not the messages; only `ack_through`, at stop, reads entries.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from nats_spark import clock
from nats_spark.client import NatsClient
from nats_spark.errors import NatsSparkError
from nats_spark.spark.group_source import ledger_protocol as protocol
from nats_spark.spark.group_source.driver.consumer_checks import (
    SeenConsumers,
    Sighting,
    sightings_of,
)
from nats_spark.spark.group_source.driver.offsets import SlotPlan, SourceOffset
from nats_spark.spark.group_source.driver.slot_packing import layout
from nats_spark.spark.group_source.ledger import (
    RETIRED_KEPT,
    Bucket,
    EntryHead,
    Ledger,
    Pointer,
    keep_entries,
    read_deliveries,
    read_head,
    read_heads,
    read_pointer,
    write_pointer,
)
from nats_spark.spark.group_source.ledger_protocol import Horizon, Settling
from nats_spark.spark.group_source.runtime import PROCESS, Runtime
from nats_spark.spark.group_source.slot_partition import UNBOUNDED

log = logging.getLogger(__name__)


@dataclass
class DriverEntry:
    """One ledger entry as the driver knows it: its head (when read), not what it holds."""

    gen: int
    slot: str
    head: EntryHead | None = None
    settled_since: float | None = None  # when acks were first seen past all its messages


class DriverLedger:
    """The ledger entries of one query lineage, as the driver plans, replays and acks them."""

    def __init__(
        self,
        stream: str,
        pointer_key: str,
        seen: SeenConsumers | None = None,
        runtime: Runtime = PROCESS,
    ) -> None:
        self.stream = stream
        self.runtime = runtime  # new lineages' ids, and the give-back
        # The target's consumers as seen: kept in the pointer, for the lineage's next driver.
        self.seen = seen or SeenConsumers()
        # The sightings as the pointer last written (or read) keeps them (`sightings_moved`).
        self.stored_sightings: dict[str, dict[str, list[Any]]] | None = None
        # `SeenConsumers.acked_earlier` as the pointer last written (or read) keeps it.
        self.stored_marks: dict[str, dict[str, list[list[int]]]] = {}
        self.pointer_key = pointer_key
        self.kv: Bucket | None = None
        self.ledger: Ledger | None = None  # None until a lineage is adopted
        self.head_gen = 0  # newest gen handed out in this lineage
        self.entries: dict[tuple[int, str], DriverEntry] = {}
        # Entries of the batch this driver planned last, until its tasks are handed out
        # (`hand_out`): no task can have written them yet, so they are not read before.
        self.unwritten: set[tuple[int, str]] = set()
        # Entries of settled gens the adopt found chunks of and no head (`give_back_outlived`).
        self.headless: list[tuple[int, str]] = []
        self.empty_packed: list[str] = []  # of gens fenced off: `Ledger.remove_empty_packed`
        self.pins: dict[str, str] = {}  # by slot: the pin its newest entry (or pointer) holds
        self.settled = 0  # newest gen with an entry removed as settled (`Pointer.settled`)
        self.last_query_pins: frozenset[str] = frozenset()  # pins of this target's last query
        self.last_query_driver: str | None = None  # the driver that wrote them (None: unknown)
        self.driver: str | None = None  # this driver's id (`Presence`), named in the pointer
        # Lineages of earlier checkpoints' queries on this target (`give_back_replaced`).
        self.replaced: tuple[str, ...] = ()
        # By replaced lineage: its consumers as its last driver saw them (`Pointer`).
        self.replaced_consumers: dict[str, dict[str, dict[str, list[Any]]]] = {}
        self.retired: tuple[str, ...] = ()  # lineages given back (`Pointer.retired`)
        # By (stream, consumer) taken as created again: the newest gen planned before, until it
        # commits. Each run of such a batch again tells its tasks (`ConsumerSighting.
        # started_over`), by this driver or a later one (`Pointer.started_over`): seed 2159 of
        # the worlds whose shared consumer is created again re-ran a batch untold, its driver
        # dead after the one that told it had written the new consumer's sighting.
        self.started_over: dict[tuple[str, str], int] = {}
        self.kept = False  # whether the bucket is known to keep entries (no max age)
        # Whether the lineage's entries below the checkpoint's first batch are an earlier
        # checkpoint's, which that batch gives back (`give_back_before`), and it has not yet:
        # Spark 4.0/4.1 asked `initialOffset` (nothing is committed in the checkpoint) of a
        # driver that planned in the stored lineage. Its ACKED entries are then what that query
        # acked, marks to come (`earlier_acked`), not what this one emitted (`held_seqs`).
        self.earlier_checkpoint_left = False
        # The highest ledger revision read in an entry's head: every write up to it landed
        # before that read (`SeenConsumers.looks_after`).
        self.revision = 0
        # By lineage (this one's, and those it replaced): its consumers as its last driver saw
        # them, by which the marks a give-back of its entries keeps are judged
        # (`marks_known_taken`).
        self.lineage_sightings: dict[str, dict[tuple[str, str], Sighting]] = {}

    def attach(self, kv: Bucket) -> None:
        """Use `kv` (a new connection's handle on the bucket)."""
        self.kv = kv
        if self.ledger is not None:
            self.ledger = Ledger(kv, self.ledger.lineage, self.ledger.layouts)

    @property
    def lineage(self) -> str | None:
        return None if self.ledger is None else self.ledger.lineage

    async def adopt(self, offset: SourceOffset | None) -> bool:
        """Take the lineage of `offset` (or of the stored pointer) and load its entries; False
        when it was adopted already."""
        assert self.kv is not None
        if not self.kept:  # before anything is planned or taken
            await keep_entries(self.kv)
            self.kept = True
        if offset is not None and self.lineage == offset.lineage:
            self.head_gen = max(self.head_gen, offset.gen)
            return False
        if offset is None and self.ledger is not None:
            return False
        pointer = await read_pointer(self.kv, self.pointer_key)
        if pointer is not None:  # pins of this target's last query: ours, not another client's
            self.last_query_pins = frozenset(pointer.pins.values())
            self.last_query_driver = pointer.driver
        if offset is None:
            if self.ledger is not None:
                return False
            offset = (
                SourceOffset(pointer.lineage, pointer.gen)
                if pointer
                else SourceOffset.initial(self.runtime.new_id())
            )
        if pointer is not None and pointer.lineage != offset.lineage:
            # A pin its tasks took in a batch its driver never planned past (killed first) is
            # in their entries' heads only.
            self.last_query_pins |= await _newest_pins(Ledger(self.kv, pointer.lineage))
        if pointer is not None:  # a lineage the pointer names, other than ours, is replaced
            named = (pointer.lineage, *pointer.replaced)
            self.replaced = tuple(dict.fromkeys(n for n in named if n != offset.lineage))
            seen = {**pointer.replaced_consumers, pointer.lineage: pointer.consumers}
            self.replaced_consumers = {n: seen[n] for n in self.replaced if seen.get(n)}
            self.retired = tuple(n for n in pointer.retired if n != offset.lineage)
        self.ledger = Ledger(self.kv, offset.lineage)
        self.earlier_checkpoint_left = False
        self.seen.marks_to_come = {}
        self.head_gen = offset.gen
        self.settled = 0
        if pointer and pointer.lineage == offset.lineage:
            self.head_gen = max(self.head_gen, pointer.gen)
            self.pins = dict(pointer.pins)
            self.settled = pointer.settled
        # The lineage's consumers as its last driver saw them: checked as this one first looks.
        # A lineage the pointer names as replaced is taken up again by a restarted checkpoint
        # whose first batch runs again (Spark asked `initialOffset` first, which began another).
        remembered = {}
        if pointer is not None:
            if pointer.lineage == offset.lineage:
                remembered = pointer.consumers
            else:
                remembered = pointer.replaced_consumers.get(offset.lineage, {})
        self.seen.remember(remembered)
        self.lineage_sightings = {n: sightings_of(c) for n, c in self.replaced_consumers.items()}
        self.lineage_sightings[offset.lineage] = sightings_of(remembered)
        self.started_over = {}
        if pointer is not None and pointer.lineage == offset.lineage:
            self.started_over = {(str(s), str(n)): int(g) for s, n, g in pointer.started_over}
        if pointer is not None:
            self.seen.restore_acked_earlier(pointer.acked_earlier)
        self.stored_marks = self.seen.stored_acked_earlier()
        self.stored_sightings = self.seen.stored() if remembered else None
        listing = await self.ledger.listing()
        self.entries = {(gen, slot): DriverEntry(gen, slot) for gen, slot in listing.heads}
        self.headless = [(gen, slot) for gen, slot in listing.headless if gen <= self.settled]
        self.empty_packed = [key for gen, key in listing.empty_packed if gen <= self.settled]
        self.unwritten = set()
        await self.load_heads(self.entries.values())
        await self._remove_returned(listing.chunks)
        if pointer is not None and offset.lineage in pointer.retired:
            await self.save_pointer()  # a checkpoint given back, run again: its tasks may write
        return True

    def forget_lineage(self) -> None:
        """Before a new lineage is adopted: the current one is done with."""
        self.ledger = None

    async def clear_pins(self) -> None:
        """A new lineage holds no pins yet: point the target at it without any."""
        self.pins = {}
        await self.save_pointer()

    async def load_heads(self, entries: Iterable[DriverEntry]) -> None:
        ledger = self.ledger
        assert ledger is not None
        entries = list(entries)
        heads = await read_heads(ledger, [(e.gen, e.slot) for e in entries])
        self.revision = max([self.revision, *(found[1] for found in heads if found)])
        newest = self._newest_gens()  # kept as entries go: per head, a walk over all of them
        for entry, found in zip(entries, heads, strict=True):
            if found is None:
                self.entries.pop((entry.gen, entry.slot), None)
                if newest.get(entry.slot) == entry.gen:
                    newest = self._newest_gens()
                continue
            self.loaded(entry, found[0], newest.get(entry.slot, entry.gen))

    async def _remove_returned(self, listed: frozenset[str]) -> None:
        """Remove again the entries a server killed uncleanly brought back after their removal
        (`ledger_protocol.came_back`; seen under `chaos/run.py`: the heads of 36 settled
        batches came back, their chunks did not, and every task that read them failed). A
        sealed one would be acked as this query's again, under messages a later checkpoint
        reads (the simulation's worlds whose removals return)."""
        assert self.ledger is not None
        gens = sorted({gen for gen, _ in self.entries}, reverse=True)
        kept_from = gens[1] if len(gens) > 1 else 0  # the second newest gen with entries
        returned = [
            key
            for key, entry in self.entries.items()
            if entry.head is not None
            and protocol.came_back(entry.head, key[0], self.settled, kept_from, listed)
        ]
        if returned:
            log.warning(
                "%d ledger entries of settled batches %d-%d came back after their removal (a "
                "server restarted uncleanly); removing them again",
                len(returned),
                min(gen for gen, _ in returned),
                max(gen for gen, _ in returned),
            )
        for gen, slot in returned:
            await self.ledger.delete_entry(gen, slot)
            del self.entries[gen, slot]

    def _newest_gens(self) -> dict[str, int]:
        """By slot, the gen of its newest entry."""
        newest: dict[str, int] = {}
        for gen, slot in self.entries:
            newest[slot] = max(gen, newest.get(slot, gen))
        return newest

    def loaded(self, entry: DriverEntry, head: EntryHead, newest: int | None = None) -> None:
        """`entry`'s head as just read (another reader's too: the `SealedKeeper` hands in the
        heads it finds acked, which no later read can contradict); its pin is the slot's when
        it is the slot's newest entry (`newest`: that entry's gen, when the caller knows it)."""
        entry.head = head
        if head.pin:
            if newest is None:
                newest = self._newest_gens().get(entry.slot, entry.gen)
            if entry.gen == newest:
                self.pins[entry.slot] = head.pin

    async def load_missing_heads(self) -> None:
        """Heads not loaded yet, but for the entries no task can have written (`unwritten`): at
        many slots, reading them (and forgetting them, not found) was a round trip and a walk
        over all entries per slot of every batch."""
        unwritten = self.unwritten
        await self.load_heads(
            e for e in self.entries.values() if e.head is None and (e.gen, e.slot) not in unwritten
        )

    async def load_unacked_heads(self) -> None:
        """Heads not loaded yet or not acked when last read (tasks seal and ack them)."""
        await self.load_heads(e for e in self.entries.values() if not protocol.known_acked(e.head))

    def unacked(self) -> list[tuple[str, int]]:
        """(slot, count) of the entries whose messages are taken and not acked yet (heads
        loaded)."""
        return [
            (entry.slot, protocol.unacked(entry.head))
            for entry in self.entries.values()
            if entry.head is not None and not protocol.known_acked(entry.head)
        ]

    def committed_unacked(self, through: int) -> dict[str, int]:
        """By slot: messages of its sealed entries of batches up to `through` (committed) that
        are not acked yet: its next task acks them before it pulls (heads loaded)."""
        counts: dict[str, int] = {}
        for (gen, slot), entry in self.entries.items():
            if entry.head is not None and protocol.acked_by_next_task(entry.head, gen, through):
                counts[slot] = counts.get(slot, 0) + entry.head.count
        return counts

    def has_sealed(self) -> bool:
        """Whether a finished batch waits for its acks."""
        return any(
            e.head is not None and protocol.awaits_acks(e.head) for e in self.entries.values()
        )

    def expect(self, gen: int, slots: Iterable[str], planned: bool = False) -> None:
        """Entries the slots of batch `gen` will write (so that acks look for them); `planned`:
        of a new batch this driver just planned, whose tasks are not handed out yet."""
        for slot in slots:
            if (gen, slot) not in self.entries:
                self.entries[gen, slot] = DriverEntry(gen, slot)
                if planned:
                    self.unwritten.add((gen, slot))

    def hand_out(self, gen: int, slots: Collection[str]) -> None:
        """Batch `gen`'s tasks, of `slots`, are handed out: they may write their entries from
        now on; an entry planned for a slot given no task (of a layout left) is never written."""
        for key in self.unwritten:
            if key[1] not in slots and (entry := self.entries.get(key)) and entry.head is None:
                del self.entries[key]
        self.unwritten.clear()
        self.expect(gen, slots)

    def head_of(self, gen: int, slot: str) -> EntryHead | None:
        entry = self.entries.get((gen, slot))
        return None if entry is None else entry.head

    async def new_offset(self, slots: dict[str, SlotPlan], tasks: int = 0) -> SourceOffset:
        assert self.ledger is not None
        self.head_gen += 1
        offset = SourceOffset(self.ledger.lineage, self.head_gen, slots, tasks, tasks > 0)
        self.note_layout(offset)
        await self.save_pointer()
        return offset

    def handed_layouts(self) -> dict[int, dict[str, int]]:
        """The layouts tasks are handed: of every batch whose entries they may read."""
        return {} if self.ledger is None else dict(self.ledger.layouts)

    def note_layout(self, offset: SourceOffset) -> None:
        """Where batch `offset`'s heads are kept (`slot_packing.layout`), as long as this driver
        knows entries of batches from it on: the ledger and the tasks it hands out read them
        there."""
        ledger = self.ledger
        if ledger is None or offset.lineage != ledger.lineage:
            return
        found = layout(offset)
        if found is None:  # the offset says, whatever was noted of its gen before
            ledger.layouts.pop(offset.gen, None)
        else:
            ledger.layouts[offset.gen] = found
        oldest = min((gen for gen, _ in self.entries), default=offset.gen)
        for gen in [gen for gen in ledger.layouts if gen < min(oldest, offset.gen)]:
            del ledger.layouts[gen]

    def note_started_over(self, consumers: Collection[tuple[str, str]]) -> None:
        """`consumers` were taken as created again: every batch planned so far may hold what
        their old ones delivered."""
        for consumer in consumers:
            self.started_over[consumer] = max(self.started_over.get(consumer, 0), self.head_gen)

    def started_over_before(self, gen: int, committed: int) -> set[tuple[str, str]]:
        """The consumers taken as created again after batch `gen` was planned (forgotten once a
        batch planned before committed: `committed` is the newest)."""
        self.started_over = {c: last for c, last in self.started_over.items() if last > committed}
        return {consumer for consumer, last in self.started_over.items() if gen <= last}

    def sightings_moved(self) -> bool:
        """Whether the consumers were seen other than the pointer keeps them (an ack floor
        moved, a consumer created again was taken): what a next driver's checks rest on
        (`consumer_checks.start_refusal`), so the pointer is written again before the entries
        their floors settled are removed, and after an idle planning that saw them move."""
        return self.seen.stored() != self.stored_sightings

    async def save_pointer(self) -> None:
        assert self.ledger is not None and self.kv is not None
        pins = dict(sorted(self.pins.items()))
        sightings = self.seen.stored()
        pointer = Pointer(
            self.ledger.lineage,
            self.head_gen,
            pins,
            self.settled,
            list(self.replaced),
            list(self.retired),
            self.driver,
            sightings,
            dict(self.replaced_consumers),  # of `replaced` only: both are set together
            self.seen.stored_acked_earlier(),
            [[stream, name, gen] for (stream, name), gen in sorted(self.started_over.items())],
        )
        await write_pointer(self.kv, self.pointer_key, pointer)
        self.stored_sightings = sightings
        self.stored_marks = pointer.acked_earlier

    def acks_due(self, through: int) -> dict[str, tuple[int, ...]]:
        """By slot: gens up to `through` (committed) of its entries not known to be acked."""
        due: dict[str, list[int]] = {}
        for (gen, slot), e in sorted(self.entries.items()):
            if protocol.ack_due(e.head, gen, through):
                due.setdefault(slot, []).append(gen)
        return {slot: tuple(gens) for slot, gens in due.items()}

    def dedupe_spans(self, before: int, slots: Iterable[str]) -> tuple[tuple[str, int, int], ...]:
        """By slot of `slots`: the first and last gen before `before` of its entries not settled
        yet (a task drops redeliveries of what they emitted; see `SlotHistory.dedupe`)."""
        wanted = set(slots)
        gens: dict[str, list[int]] = {}
        for gen, slot in self.entries:
            if gen < before and slot in wanted:
                gens.setdefault(slot, []).append(gen)
        return tuple((slot, min(g), max(g)) for slot, g in sorted(gens.items()))

    def highest_seq(self, spans: Iterable[tuple[str, int, int]]) -> int:
        """The highest stream sequence the entries of `spans` hold (as far as their heads say;
        an entry whose head is not loaded could hold any)."""
        highest = 0
        for slot, first, last in spans:
            for gen in range(first, last + 1):
                entry = self.entries.get((gen, slot))
                if entry is not None:
                    if entry.head is None:
                        return UNBOUNDED
                    highest = max(highest, entry.head.max_seq)
        return highest

    async def held_seqs(
        self, slots: Collection[str], within: range, committed: int, logged: int = 0
    ) -> tuple[set[int], set[int]]:
        """The stream sequences in `within` that the entries of `slots` hold of batches up to
        `committed` (the query emitted them; `ledger_protocol.holds_committed`), and those they
        hold of a batch up to `logged` that runs again now (`ledger_protocol.replayed`). Reads
        those entries: only when a consumer was created again past what the query saw acked."""
        assert self.ledger is not None
        found: tuple[set[int], set[int]] = (set(), set())
        for (gen, slot), entry in self.entries.items():
            head = entry.head
            if slot not in slots or head is None or head.max_seq < within.start:
                continue
            if self.earlier_checkpoint_left and protocol.known_acked(head):
                continue  # an earlier checkpoint's query's, given back before this one reads
            emitted = protocol.holds_committed(head, gen, committed)
            if emitted or protocol.replayed(head, gen, committed, logged):
                deliveries = await read_deliveries(self.ledger, head)
                held = found[0] if emitted else found[1]
                held.update(seq for seq in deliveries.stream_seq if seq in within)
        return found

    async def forget_settled(self, horizons: dict[str, Horizon], committed: int) -> None:
        """Forget the entries that settled (`ledger_protocol.settles`)."""
        assert self.ledger is not None
        settled: list[tuple[int, str]] = []
        for key, entry in list(self.entries.items()):
            horizon = horizons.get(entry.slot, Horizon(0, 0))
            verdict = protocol.settles(entry.head, entry.gen, committed, horizon)
            if verdict is Settling.NOT_YET:
                entry.settled_since = None
            elif verdict is Settling.NOW:
                settled.append(key)
            elif verdict is Settling.PAST:
                now = clock.monotonic()
                since = entry.settled_since = entry.settled_since or now
                if now - since >= protocol.SETTLE_SECONDS:
                    settled.append(key)
        if settled:
            # With the floors they settled by, if the pointer has them not yet: fenced anew.
            fenced = -1 if self.sightings_moved() else self.settled
            await protocol.remove_settled(
                self.ledger,
                settled,
                self._whole_batches(settled),
                fenced,
                self._raise_fence,
                self.entries.__delitem__,
            )

    def _whole_batches(self, settled: list[tuple[int, str]]) -> set[int]:
        """The gens of `settled` of which it holds every entry this driver knows: a batch's
        slots settle together when their acks went out together, as its next tasks send them."""
        left = Counter(gen for gen, _ in self.entries)
        left.subtract(gen for gen, _ in settled)
        return {gen for gen, _ in settled if not left[gen]}

    async def _raise_fence(self, gen: int) -> None:
        """Fence the batches up to `gen` off in the pointer (`Pointer.settled`)."""
        self.settled = max(self.settled, gen)
        await self.save_pointer()

    async def missing(self, gen: int, slots: Iterable[str]) -> list[str]:
        """Of `slots`, whose tasks of committed batch `gen` created their entries, those whose
        entry is gone though the protocol kept it (`gen` is past the settled fence): expired by
        a max age, removed by someone else, or the bucket recreated. Reads only heads not
        loaded yet (at a restart, or once per entry)."""
        ledger = self.ledger
        assert ledger is not None
        if gen <= self.settled:
            return []
        unread = [
            slot
            for slot in slots
            if (entry := self.entries.get((gen, slot))) is None or entry.head is None
        ]
        heads = await read_heads(ledger, [(gen, slot) for slot in unread])
        gone = []
        for slot, found in zip(unread, heads, strict=True):
            if found is None:
                gone.append(slot)
            else:
                self.loaded(self.entries.setdefault((gen, slot), DriverEntry(gen, slot)), found[0])
        return gone

    async def earlier_acked(self) -> dict[tuple[str, str], frozenset[int]]:
        """While `earlier_checkpoint_left`: what the ACKED entries hold (read), all an earlier
        checkpoint's query's (this one committed nothing), which the first batch's give-back
        keeps as marks (`SeenConsumers.given_back`); else nothing."""
        if not self.earlier_checkpoint_left:
            return {}
        assert self.ledger is not None
        keys = [key for key, entry in sorted(self.entries.items()) if entry.head]
        marks = await protocol.marks_of(self.ledger, keys)
        return self.marks_known_taken(marks, self.ledger.lineage)

    async def give_back_before(self, client: NatsClient, gen: int) -> None:
        """Give back the entries of this lineage's gens before `gen`, a checkpoint's first
        batch: an earlier checkpoint's, never emitted by this query. Fenced first, like settled
        ones, against that query's task attempts still running, and listed after the fence: an
        attempt that creates its entry later finds the fence, one that created it before is
        listed (the entries adopted earlier may miss it: it would hold its messages for good,
        and drop their redeliveries as emitted)."""
        assert self.ledger is not None
        if gen - 1 > self.settled:
            await self._raise_fence(gen - 1)
        earlier = [(g, slot) for g, slot in await self.ledger.heads() if g < gen]
        if earlier:
            await self._give_back(client, self.ledger, earlier)
        for key in [key for key in self.entries if key[0] < gen]:
            del self.entries[key]

    async def give_back_replaced(self, client: NatsClient) -> None:
        """Give back the entries of the lineages this one replaced (earlier checkpoints'
        queries'); the pointer names them until it is next saved, so a driver killed before
        that gives them back again (there is nothing left to give then). Retired first, like
        settled entries are fenced: an attempt of such a lineage that creates its entry after the
        listing finds its lineage retired, and removes it."""
        assert self.kv is not None
        if self.replaced:
            kept = (*self.replaced, *(r for r in self.retired if r not in self.replaced))
            self.retired = kept[:RETIRED_KEPT]
            await self.save_pointer()
        await self._give_back_lineages(client, self.replaced)
        self.replaced, self.replaced_consumers = (), {}

    async def give_back_outlived(self, client: NatsClient) -> None:
        """Once a lineage is adopted: give back the entries task attempts created again after
        they outlived them and were killed before their fence check removed them
        (`ledger_protocol.outlived`): the open ones of this lineage's fenced gens, and any of
        the retired lineages (given back, their attempts' creates are all of that kind). Each
        holds nothing, but for one an attempt took over after a give-back's fence and whose
        driver died before it listed (`ledger_protocol.check_fence`), which is NAKed here; left,
        it would stay for good (the bucket keeps entries), and one of this lineage would be
        read as the query's own for good."""
        assert self.ledger is not None
        outlived = [
            key
            for key, entry in self.entries.items()
            if entry.head is not None and protocol.outlived(entry.head, entry.gen, self.settled)
        ]
        if outlived:
            await self._give_back(client, self.ledger, outlived)
            for key in outlived:
                del self.entries[key]
        await self.ledger.remove_headless(self.headless)
        await self.ledger.remove_empty_packed(self.empty_packed)
        self.headless, self.empty_packed = [], []
        await self._give_back_lineages(client, self.retired)

    async def _give_back_lineages(self, client: NatsClient, lineages: Iterable[str]) -> None:
        assert self.kv is not None
        for lineage in lineages:
            ledger = Ledger(self.kv, lineage)
            listing = await ledger.listing()
            if listing.heads:
                await self._give_back(client, ledger, listing.heads)
            await ledger.remove_headless(listing.headless)
            await ledger.remove_empty_packed(key for _, key in listing.empty_packed)

    async def _give_back(
        self, client: NatsClient, ledger: Ledger, keys: list[tuple[int, str]]
    ) -> None:
        """Give back `keys` of `ledger` (`ledger_protocol.give_back`), keeping what its acked
        entries held (`_keep_marks`) before they are removed."""
        returned = await self.runtime.give_back(
            client, ledger, keys, functools.partial(self._keep_marks, ledger.lineage)
        )
        log.info("a new checkpoint: %d messages an earlier query took are read again", returned)

    def marks_known_taken(
        self, marks: protocol.Marks, lineage: str
    ) -> dict[tuple[str, str], frozenset[int]]:
        """Of `marks` (of entries of `lineage`), those whose acks are known to have reached the
        consumer that delivered them (`SeenConsumers.marks_known_taken_through`, by the
        sightings of the query that wrote them). The others count as committed and never
        acked: a new checkpoint reads them again, as it does what an earlier query committed
        and did not ack; kept as marks, a refusal of the consumer created again advised a start
        past them and the live checkpoint never read them (seed 1586 of the simulation's worlds
        whose operator follows the advice)."""
        earlier = self.lineage_sightings.get(lineage, {})
        known: dict[tuple[str, str], frozenset[int]] = {}
        for key, seqs in marks.items():
            through = self.seen.marks_known_taken_through(key, earlier.get(key))
            taken = frozenset(
                s for s, revision in seqs.items() if through is None or revision <= through
            )
            if taken:
                known[key] = taken
        return known

    async def _keep_marks(self, lineage: str, acked: protocol.Marks) -> None:
        """Keep what a give-back's acked entries held (`SeenConsumers.given_back`) in the
        pointer, before it removes them: only the pointer carries it to the target's next
        drivers. Kept in memory until the next pointer write, it was lost by a run that failed
        (seed 5265 of the worlds whose consumer is created again: the next checkpoint's query
        read on a consumer created again below it, which delivered 2 again after 4), and, once
        written at stop, by a driver that died (seeds 150 and 247: an acked message came after
        a newer one of its key). Written only when the pointer lacks a mark. Only the marks
        known to have been taken by the consumer count (`marks_known_taken`)."""
        self.seen.given_back(self.marks_known_taken(acked, lineage))
        if self.seen.stored_acked_earlier() != self.stored_marks:
            await self.save_pointer()

    async def ack_through(self, client: NatsClient, gen: int, only: str | None = None) -> int:
        """Ack every sealed entry (of slot `only`, if given) of batches up to `gen` (all
        committed by Spark); returns the count. Per message, so only for what no task of a next
        batch will ack: at stop, and for slots the query no longer has."""
        assert self.ledger is not None
        count = 0
        for (entry_gen, slot), entry in sorted(self.entries.items()):
            if entry_gen > gen or protocol.known_acked(entry.head):
                continue
            if only is not None and slot != only:
                continue
            acked = await protocol.ack(client, self.ledger, entry_gen, slot, self.stream)
            count += len(acked or ())
        await self.load_unacked_heads()
        if count:
            log.info("acked %d messages of batches up to gen %d", count, gen)
        return count


class EntriesLost(NatsSparkError):
    """Ledger entries of a committed batch, which dedupe its redeliveries, are gone."""


def entries_lost(bucket: str, gen: int, slots: list[str]) -> EntriesLost:
    return EntriesLost(
        f"ack ledger bucket {bucket!r} lost the entries of committed batch {gen} of "
        f"{', '.join(sorted(slots))} (expired by a max age, deleted, or the bucket recreated) "
        "while messages are still unacked: those of that batch would be emitted a second "
        "time; set failOnDataLoss=false to go on at-least-once"
    )


async def _newest_pins(ledger: Ledger) -> frozenset[str]:
    """The pins the newest entry of each slot of `ledger`'s lineage holds (its tasks took them:
    that lineage's query's own)."""
    newest: dict[str, int] = {}
    for gen, slot in await ledger.heads():
        newest[slot] = max(gen, newest.get(slot, 0))
    pins: set[str] = set()
    for slot, gen in newest.items():
        found = await read_head(ledger, gen, slot)
        if found is not None and found[0].pin:
            pins.add(found[0].pin)
    return frozenset(pins)
