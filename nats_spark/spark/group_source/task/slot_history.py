"""Executor side: what the committed batches before this one left to a slot's task, before the
slot pulls: acking the slot's committed entries, and dropping redeliveries of what they emitted.

Spark plans a batch only once the batch before it is committed, so the entries a partition names
in `committed` are all of committed batches. Each slot's task acks its own (explicit acks, rebuilt
from the entry's numbers), then marks the entry acked; a zombie attempt beside its retry acks the
same messages again, which the server ignores.

The dedupe set (the stream sequences that entries of earlier batches hold until they are settled)
is kept per worker process and brought up to date from the entries a partition names, reading
only entries it has not seen: sealed entries never change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from nats_spark.client import NatsClient
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

    async def ack_committed(self) -> int:
        """Ack this slot's committed entries that are not acked yet; returns the count."""
        count, slot, stream = 0, self.partition.slot, self.partition.stream
        for gen in self.partition.committed:
            acked = await protocol.ack(self.client, self.ledger, gen, slot, stream)
            if acked is not None:
                self.seen.put(self._key(gen, slot), tuple(acked.stream_seq))
                count += len(acked)
        if count:
            log.info("slot %s acked %d messages of committed batches", self.partition.slot, count)
        return count

    async def dedupe(self) -> set[int]:
        """Stream sequences of what earlier batches emitted and are not settled yet: a
        redelivery of one of them is acked and dropped."""
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

    def _key(self, gen: int, slot: str) -> EntryKey:
        return self.ledger.kv.name, self.ledger.lineage, gen, slot
