"""Executor side: what the committed batches before this one left to a slot's task, before the
slot pulls: acking the slot's committed entries, and dropping redeliveries of what they emitted.

Spark plans a batch only once the batch before it is committed, so the entries a partition names
in `committed` are all of committed batches. Each slot's task acks its own (explicit acks, rebuilt
from the entry's numbers), then marks the entry acked; a zombie attempt beside its retry acks the
same messages again, which the server ignores.

The dedupe set (the stream sequences that entries of earlier batches hold until they are settled)
is kept per worker process and brought up to date from the entries a partition names, reading
only entries it has not seen: sealed entries never change.

A task of packed slots does both for all its slots at once: their committed entries acked
with one flush before any pulls (while the slots claim their entries; the entries are marked
acked while the slots pull), the entries they dedupe against read concurrently when the first
of them needs them (`DedupeReads`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence

from nats_spark.client import NatsClient
from nats_spark.requests_at_once import all_results
from nats_spark.spark.group_source import ledger_protocol as protocol
from nats_spark.spark.group_source.ledger import Ledger
from nats_spark.spark.group_source.runtime import PROCESS, EntryKey, SeenEntries
from nats_spark.spark.group_source.slot_partition import SlotPartition

log = logging.getLogger(__name__)


class SlotHistory:
    """The committed batches before a slot's batch, as its task sees them."""

    def __init__(
        self,
        client: NatsClient,
        ledger: Ledger,
        partition: SlotPartition,
        seen: SeenEntries = PROCESS.seen_entries,
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.partition = partition
        self.seen = seen  # the worker process's (`Runtime.seen_entries`)
        self.acked = False  # its committed entries are acked (by `ack_committed`, or together)
        self.shared: DedupeReads | None = None  # in a task of packed slots

    async def ack_committed(self) -> int:
        """Ack this slot's committed entries that are not acked yet (once: a task of packed
        slots acks them for all its slots first, `ack_committed_together`); returns the
        count."""
        if self.acked:
            return 0
        count, slot, stream = 0, self.partition.slot, self.partition.stream
        for gen in self.partition.committed:
            acked = await protocol.ack(self.client, self.ledger, gen, slot, stream)
            if acked is not None:
                self.note_acked(gen, acked.stream_seq)
                count += len(acked)
        self.acked = True
        self.log_acked(count)
        return count

    def note_acked(self, gen: int, stream_seq: list[int]) -> None:
        self.seen.put(self._key(gen, self.partition.slot), tuple(stream_seq))

    def log_acked(self, count: int) -> None:
        if count:
            log.info("slot %s acked %d messages of committed batches", self.partition.slot, count)

    async def dedupe(self) -> set[int]:
        """Stream sequences of what earlier batches emitted and are not settled yet: a
        redelivery of one of them is acked and dropped."""
        if self.shared is not None:
            await self.shared.read()  # its packed task's slots' entries, read for them all
        seqs: set[int] = set()
        for gen, slot in self._named():
            seqs.update(await self._seqs(gen, slot))
        return seqs

    def _named(self) -> Iterator[tuple[int, str]]:
        for slot, first, last in self.partition.dedupe:
            for gen in range(first, last + 1):
                yield gen, slot

    async def _seqs(self, gen: int, slot: str) -> tuple[int, ...]:
        key = self._key(gen, slot)
        seqs = self.seen.get(key)
        if seqs is None:
            seqs = await protocol.emitted(self.ledger, gen, slot)
            if seqs is None:
                return ()  # open: it emitted nothing yet (read again if named)
            self.seen.put(key, seqs)
        return seqs

    def _known(self, gen: int, slot: str) -> bool:
        return self.seen.get(self._key(gen, slot)) is not None

    def _key(self, gen: int, slot: str) -> EntryKey:
        return self.ledger.kv.name, self.ledger.lineage, gen, slot


async def ack_committed_together(
    client: NatsClient, histories: Sequence[SlotHistory]
) -> list[tuple[Ledger, protocol.DueAcks]]:
    """`ack_committed` for the slots of one task at once (they read one stream): their due
    entries read concurrently, their acks sent with one flush. Returns the entries acked, for
    `mark_acked_together`, which the task's pulls need not wait for: an entry acked and not
    marked yet is acked again by the slot's next task, which the server ignores."""
    due = [(history, gen) for history in histories for gen in history.partition.committed]
    found = await all_results(
        protocol.ack_due_of(history.ledger, gen, history.partition.slot) for history, gen in due
    )
    read = [(history, entry) for (history, _), entry in zip(due, found, strict=True) if entry]
    if read:
        stream = histories[0].partition.stream
        await protocol.send_entry_acks(client, (entry.deliveries for _, entry in read), stream)
    for history in histories:
        mine = [entry for owner, entry in read if owner is history]
        for entry in mine:
            history.note_acked(entry.gen, entry.deliveries.stream_seq)
        history.acked = True
        history.log_acked(sum(len(entry.deliveries) for entry in mine))
    return [(history.ledger, entry) for history, entry in read]


async def mark_acked_together(acked: Sequence[tuple[Ledger, protocol.DueAcks]]) -> None:
    """Mark the entries `ack_committed_together` acked, concurrently. One left unmarked (its
    write failed) is acked again by the slot's next task: the task goes on."""
    try:
        await all_results(protocol.mark_acked(ledger, entry) for ledger, entry in acked)
    except Exception as error:
        log.info("marking %d acked ledger entries failed (acked again): %s", len(acked), error)


class DedupeReads:
    """The earlier batches' entries that the slots of one packed task dedupe against, read for
    all of them at once, concurrently, when the first of them needs them (`SlotHistory.dedupe`):
    each would read them one after the other, and the slots running at once would each read
    all of them (a slot planned before another finds sequences below the other's last batch:
    nearly every batch on a stream of several slots)."""

    def __init__(self, histories: Sequence[SlotHistory]) -> None:
        self.histories = histories
        self.reading: asyncio.Future[None] | None = None

    async def read(self) -> None:
        if self.reading is None:
            self.reading = asyncio.ensure_future(self._read())
        await asyncio.shield(self.reading)  # a slot cancelled meanwhile leaves it to the others

    async def _read(self) -> None:
        named = {
            (gen, slot): history
            for history in self.histories
            if history.partition.limit
            for gen, slot in history._named()
        }
        unread = [(gen, slot, h) for (gen, slot), h in named.items() if not h._known(gen, slot)]
        await all_results(history._seqs(gen, slot) for gen, slot, history in unread)
