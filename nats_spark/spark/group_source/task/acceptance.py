"""Executor side: which deliveries of a pull a slot's task takes (the one acceptance rule).

A delivery is taken unless
- this batch holds it already: a redelivery within the batch, emitted once; its new ack subject
  replaces the held one, so later progress acks name this delivery;
- an earlier batch, not settled yet, emitted it: it is acked and dropped;
- a sibling slot (one pulling from the same consumer) recorded it first: the sibling acks it at
  commit.
What it is checked against is read only when a delivery could be in it: the earlier batches'
sequences once one is at or below `dedupe_through` (in-order reads never read them), the
siblings' records once a redelivery comes. `SlotEntry.record` settles the races with siblings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.aio.client import Client as NATS

from nats_spark.jetstream.acks import InProgressKeeper, publish_acks
from nats_spark.jetstream.pull import Deliveries
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
    ) -> None:
        self.entry = entry
        self.keeper = keeper
        self.history = history
        self.nc = nc
        self.dedupe_through = dedupe_through
        self.siblings = siblings
        self.emitted: set[int] | None = None  # `SlotHistory.dedupe`, read when first needed
        self.sibling_seqs: set[int] = set()
        self.redundant = 0  # redeliveries of earlier batches' messages, acked and dropped

    async def accept(self, chunk: Deliveries) -> Accepted:
        """Take what `chunk` brings that is new to the batch; ack what earlier batches emitted."""
        delivered, seqs, _, _ = chunk.numbers
        if self.siblings and max(delivered, default=0) > 1:
            # A redelivery may reach us after a sibling took the message and its ack wait ran
            # out: skipping what the siblings recorded so far is the cheap, usual case.
            self.sibling_seqs |= await self.entry.recorded_by_siblings()
        if self.emitted is None and self._may_be_earlier(seqs):
            self.emitted = await self.history.dedupe()
        accepted, redundant = self._take(chunk, seqs)
        if redundant:
            accepted.acked = len(redundant)
            self.redundant += len(redundant)
            await publish_acks(self.nc, redundant)
        return accepted

    def _may_be_earlier(self, seqs: list[int]) -> bool:
        """Whether a delivery in `seqs` new to this batch may be an earlier batch's."""
        below, taken = self.dedupe_through, self.entry.taken
        return min(seqs, default=below + 1) <= below and any(
            seq <= below and seq not in taken for seq in seqs
        )

    def _take(self, chunk: Deliveries, seqs: list[int]) -> tuple[Accepted, list[bytes]]:
        """The rule (see the module's doc); returns what was taken, and the ack subjects of what
        earlier batches emitted."""
        taken, keeper, replies = self.entry.taken, self.keeper, chunk.replies
        found = set(seqs)
        again, emitted, sibling = found & taken, found & (self.emitted or set()), set[int]()
        if self.sibling_seqs:
            sibling = found & self.sibling_seqs
        if len(found) == len(seqs) and not (again or emitted or sibling):
            taken |= found  # the usual case: the chunk whole
            keeper.hold(seqs, replies)
            return Accepted(None, replies), []
        rows, taken_replies, redundant = list[int](), list[bytes](), list[bytes]()
        for i, (seq, reply) in enumerate(zip(seqs, replies, strict=True)):
            if seq in taken:  # held, or earlier in this chunk
                keeper.redelivered(seq, reply)
            elif seq in emitted:
                redundant.append(reply)
            elif seq not in sibling:
                taken.add(seq)
                keeper.hold((seq,), (reply,))
                rows.append(i)
                taken_replies.append(reply)
        return Accepted(rows, taken_replies), redundant
