"""Executor side: which deliveries of a pull a slot's task takes (the one acceptance rule).

A delivery is taken unless
- this batch holds it already: a redelivery within the batch, emitted once; its new ack subject
  replaces the held one, so later progress acks name this delivery;
- an earlier batch, not settled yet, emitted it: it is acked and dropped;
- a sibling slot (one pulling from the same consumer) recorded it first: the sibling acks it at
  commit.
A delivery at or below the consumer's ack floor as the driver last saw it (`ConsumerSighting`) that
neither this batch nor an earlier one holds is of a consumer deleted and created again: the
batch stops before it takes anything of it (a consumer delivers what it acked only again when
its server lost the ack, and then an earlier batch not settled yet holds it, unless a query on a
new checkpoint gave that batch back: the consumer's creation time, unchanged, tells that case
apart, and the delivery is taken as the new query's). With siblings, a
consumer sequence at or below the one the driver saw, or a first delivery of what a batch holds,
is of a new consumer too (or of a server that lost state): every delivery after it is checked
against the siblings' records, as a first delivery may then be of what a sibling took in this
batch before the recreation. So is every delivery of a consumer the driver saw created again
since the batch was planned (`ConsumerSighting.started_over`: a batch run again after a
restart, whose earlier run's siblings took what the old consumer delivered).
What it is checked against is read only when a delivery could be in it: the earlier batches'
sequences once one is at or below `dedupe_through` (in-order reads never read them), the
siblings' records once a redelivery comes. `SlotEntry.record` settles the races with siblings.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS

from nats_spark.errors import NotFound, consumer_created_again
from nats_spark.jetstream.acks import InProgressKeeper, publish_acks
from nats_spark.jetstream.pull import Deliveries
from nats_spark.jetstream.replies import created_later
from nats_spark.spark.group_source.slot_partition import UNBOUNDED, ConsumerSighting
from nats_spark.spark.group_source.task.slot_entry import SlotEntry
from nats_spark.spark.group_source.task.slot_history import SlotHistory


@dataclass
class Accepted:
    """What a slot takes of one chunk of deliveries: its rows (None: all of them, in order) and
    their ack subjects; `acked`: how many were an earlier batch's (acked and dropped)."""

    rows: list[int] | None = None
    replies: list[bytes] = field(default_factory=list)
    acked: int = 0


class Acceptance:
    """Takes deliveries for one slot's batch: into the entry's `taken`, held by the keeper."""

    def __init__(
        self,
        entry: SlotEntry,
        keeper: InProgressKeeper,
        history: SlotHistory,
        nc: NATS,
        dedupe_through: int,
        siblings: bool,
        sighting: ConsumerSighting | None = None,
        created: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self.entry = entry
        self.keeper = keeper
        self.history = history
        self.nc = nc
        self.dedupe_through = dedupe_through
        self.siblings = siblings
        self.sighting = sighting  # the slot's consumer as the driver last saw it
        self.created = created  # when the slot's consumer was created, asked now ("": unknown)
        self.emitted: set[int] | None = None  # `SlotHistory.dedupe`, read when first needed
        self.sibling_seqs: set[int] = set()
        self.redundant = 0  # redeliveries of earlier batches' messages, acked and dropped

    async def accept(self, chunk: Deliveries, sent: float) -> Accepted:
        """Take what `chunk` brings that is new to the batch (its request sent at `sent`, before
        the server delivered any of it); ack what earlier batches emitted."""
        delivered, seqs, consumer_seqs, _ = chunk.numbers
        low = min(seqs, default=UNBOUNDED)
        if self.emitted is None and self._may_be_earlier(seqs, low):
            self.emitted = await self.history.dedupe()
        sighting = self.sighting
        if sighting is not None and low <= sighting.ack_floor:
            await self._refuse_acked_again(seqs, sighting)
        if self.siblings and sighting is not None and not self.entry.delivering_again:
            low_delivery = min(consumer_seqs, default=UNBOUNDED)
            self.entry.delivering_again = (
                sighting.started_over or low_delivery <= sighting.delivered
            )
        if self.siblings and (self.entry.delivering_again or max(delivered, default=0) > 1):
            # A redelivery may reach us after a sibling took the message and its ack wait ran
            # out: skipping what the siblings recorded so far is the cheap, usual case.
            self.sibling_seqs |= await self.entry.recorded_by_siblings()
        accepted, redundant = self._take(chunk, delivered, seqs, sent)
        if redundant:
            accepted.acked = len(redundant)
            self.redundant += len(redundant)
            await publish_acks(self.nc, redundant)
        return accepted

    def _may_be_earlier(self, seqs: list[int], low: int) -> bool:
        """Whether a delivery in `seqs` (the lowest `low`) new to this batch may be an earlier
        batch's."""
        below, taken = self.dedupe_through, self.entry.taken
        return low <= below and any(seq <= below and seq not in taken for seq in seqs)

    async def _refuse_acked_again(self, seqs: list[int], sighting: ConsumerSighting) -> None:
        """Stop the batch when a chunk's `seqs` hold one at or below the ack floor of `sighting`
        that no batch of the query holds (see the module's doc). Nothing of the chunk is taken:
        the task gives it back whole as it stops (`SlotReader.give_back_unrecorded`), and a
        retry of the task, or a sibling, gets it first and stops too."""
        if self.emitted is None:
            self.emitted = await self.history.dedupe()
        taken, emitted, through = self.entry.taken, self.emitted, sighting.ack_floor
        again = [seq for seq in seqs if seq <= through and seq not in taken and seq not in emitted]
        if not again or await self._same_consumer(sighting):
            return
        partition = self.entry.partition
        raise consumer_created_again(
            partition.stream,
            partition.consumer,
            "while a batch read it",
            f"it delivered stream sequence {again[0]} again, at or below its ack floor "
            f"{through} when the batch was planned",
            sighting.recreation.starting_by(await self.entry.held_by_the_batch(), emitted),
        )

    async def _same_consumer(self, sighting: ConsumerSighting) -> bool:
        """Whether the consumer is the one the driver saw, created no later: its server lost
        acks (a restart) of messages whose batch a query on a new checkpoint gave back, which
        this query never emitted. Unknown (no creation time seen, or the consumer gone): not."""
        if self.created is None or not sighting.created:
            return False
        try:
            created = await self.created()
        except NotFound:
            return False
        return bool(created) and not created_later(created, sighting.created)

    def _take(
        self, chunk: Deliveries, delivered: list[int], seqs: list[int], sent: float
    ) -> tuple[Accepted, list[bytes]]:
        """The rule (see the module's doc); returns what was taken, and the ack subjects of what
        earlier batches emitted."""
        taken, keeper, replies = self.entry.taken, self.keeper, chunk.replies
        found = set(seqs)
        again, emitted, sibling = found & taken, found & (self.emitted or set()), set[int]()
        if self.sibling_seqs:
            sibling = found & self.sibling_seqs
        if len(found) == len(seqs) and not (again or emitted or sibling):
            taken |= found  # the usual case: the chunk whole
            keeper.hold(seqs, replies, sent)
            return Accepted(None, replies), []
        if self.siblings and not self.entry.delivering_again:
            # A first delivery of what a batch holds: its consumer was created again (the
            # ledger held what it delivered so far), and a first delivery may now be of what a
            # sibling took in this batch before.
            held = again | emitted
            self.entry.delivering_again = any(
                count == 1 and seq in held for count, seq in zip(delivered, seqs, strict=True)
            )
        rows, taken_replies, redundant = list[int](), list[bytes](), list[bytes]()
        for i, (seq, reply) in enumerate(zip(seqs, replies, strict=True)):
            if seq in taken:  # held, or earlier in this chunk
                keeper.redelivered(seq, reply, sent)
            elif seq in emitted:
                redundant.append(reply)
            elif seq not in sibling:
                taken.add(seq)
                keeper.hold((seq,), (reply,), sent)
                rows.append(i)
                taken_replies.append(reply)
        return Accepted(rows, taken_replies), redundant
