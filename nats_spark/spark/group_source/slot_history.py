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
from collections import OrderedDict
from collections.abc import Iterator

from nats_spark.client import NatsClient
from nats_spark.errors import PERMISSIONS_DOC, ConfigurationError
from nats_spark.jetstream.acks import send_acks
from nats_spark.spark.group_source.entry_deliveries import EntryDeliveries
from nats_spark.spark.group_source.ledger import EntryState, Ledger, LedgerConflict
from nats_spark.spark.group_source.slot_partition import SlotPartition

log = logging.getLogger(__name__)

_KEPT_ENTRIES = 4096  # entries' sequences a worker keeps between tasks


class _SeenEntries:
    """The stream sequences of settled-or-sealed entries this process has read, by entry."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple[str, str, int, str], tuple[int, ...]] = OrderedDict()

    def get(self, key: tuple[str, str, int, str]) -> tuple[int, ...] | None:
        return self.entries.get(key)

    def put(self, key: tuple[str, str, int, str], seqs: tuple[int, ...]) -> None:
        self.entries[key] = seqs
        while len(self.entries) > _KEPT_ENTRIES:
            self.entries.popitem(last=False)


_seen = _SeenEntries()


def refused_acks(client: NatsClient, before: int, stream: str) -> None:
    """Fail when the server refused acks published since `client.denied` had `before` entries:
    marking their entries acked would hide messages that stay pending for good."""
    refused = [e for e in client.denied[before:] if "$js.ack" in e.lower()]
    if refused:
        raise ConfigurationError(
            f"the server refused the acks of committed batches ({refused[0]}); allow the "
            f"user to publish to $JS.ACK.{stream}.> ({PERMISSIONS_DOC})"
        )


async def ack_entry(client: NatsClient, ledger: Ledger, gen: int, slot: str, stream: str) -> int:
    """Ack the sealed entry (gen, slot) of a committed batch and mark it acked; returns how many
    messages it acked (0: missing, open, or acked already)."""
    found = await ledger.read_head(gen, slot)
    if found is None:
        return 0
    head, revision = found
    if head.state is EntryState.OPEN:
        log.warning(
            "ledger entry %s of a committed batch is not sealed; not acked",
            ledger.head_key(gen, slot),
        )
        return 0
    if head.state is EntryState.ACKED:
        return 0
    deliveries = await ledger.read_deliveries(head)
    before = len(client.denied)
    count = await send_acks(client.nc, deliveries.ack_commands(), len(deliveries))
    refused_acks(client, before, stream)
    head.state = EntryState.ACKED
    try:
        await ledger.update_head(gen, slot, head, revision)
    except LedgerConflict:
        # Another attempt (or the driver at stop) marked it first: it can only have acked it.
        log.debug("ledger entry %s was marked acked by another attempt", ledger.head_key(gen, slot))
    _seen.put((ledger.kv.name, ledger.lineage, gen, slot), tuple(deliveries.stream_seq))
    return count


class SlotHistory:
    """The committed batches before a slot's batch, as its task sees them."""

    def __init__(self, client: NatsClient, ledger: Ledger, partition: SlotPartition) -> None:
        self.client = client
        self.ledger = ledger
        self.partition = partition

    async def ack_committed(self) -> int:
        """Ack this slot's committed entries that are not acked yet; returns the count."""
        count = 0
        for gen in self.partition.committed:
            count += await ack_entry(
                self.client, self.ledger, gen, self.partition.slot, self.partition.stream
            )
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
        key = (self.ledger.kv.name, self.ledger.lineage, gen, slot)
        seqs = _seen.get(key)
        if seqs is None:
            found = await self.ledger.read_head(gen, slot)
            if found is not None and found[0].state is EntryState.OPEN:
                return ()  # not of a committed batch: it emitted nothing (read again if named)
            content = (
                EntryDeliveries() if found is None else await self.ledger.read_deliveries(found[0])
            )
            seqs = tuple(content.stream_seq)
            _seen.put(key, seqs)
        return seqs
