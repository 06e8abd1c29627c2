"""Why a committed message came after a newer one of its key (README guarantee 4, Order).

The README allows one case: a task attempt took a delivery of the message and died (crashed
with its executor, killed with its driver, or a zombie: lost by Spark, or running on until a
later attempt took its entry over) before it recorded the delivery in its ledger entry. Nothing
gave it back, so the message stayed with the server until its ack wait ran out, while the slot's
next pulls took newer messages of its key. A delivery given back (`-NAK`) comes back at once,
ahead of newer messages: it explains nothing. `Attempts` keeps what telling the two apart takes
(the consumers keep which attempt each delivery went to): what each attempt recorded.
"""

from __future__ import annotations

from nats_spark.spark.group_source.entry_deliveries import EntryDeliveries
from nats_spark.spark.group_source.ledger_protocol import LedgerConflict
from nats_spark.spark.group_source.task.slot_entry import SlotEntry
from tests.simulation.jetstream import Delivery
from tests.simulation.scheduler import Participant


class Attempts:
    def __init__(self) -> None:
        self.recorded: dict[Participant, set[int]] = {}  # stream seqs, in its entry

    def watch(self, attempt: Participant, entry: SlotEntry) -> None:
        """Count what `entry` adopts at its claim, and what its writes record once they are
        answered, as recorded by `attempt`. No scheduling point is added."""
        recorded = self.recorded.setdefault(attempt, set())
        claim, write = entry.claim, entry._write

        async def claiming() -> None:
            await claim()
            recorded.update(entry.taken)

        async def writing(chunks: list[str], taken: EntryDeliveries, pin: str | None) -> None:
            await write(chunks, taken, pin)
            recorded.update(taken.stream_seq)

        entry.claim = claiming  # type: ignore[method-assign]
        entry._write = writing  # type: ignore[method-assign]

    def why_late(self, seq: int, deliveries: list[Delivery]) -> str | None:
        """How an earlier delivery of `seq` was left to its ack wait by an attempt that held it
        unrecorded (how that attempt ended), or None when no delivery was."""
        for delivery in deliveries[:-1]:  # each one was followed by a redelivery
            owner = delivery.owner
            if owner is None or owner.kind != "task" or delivery.given_back:
                continue
            if seq in self.recorded.get(owner, ()):
                continue
            ended = self._ended(owner)
            if ended is not None:
                return ended
        return None

    def _ended(self, attempt: Participant) -> str | None:
        """How `attempt` died, if in one of the README's ways: crashed (an executor lost),
        killed with its driver (kill -9), or a zombie (lost by Spark, or one that lost its
        entry to a later attempt); else None (its rows reached a batch, or it ended otherwise)."""
        if attempt.dead:
            killed = attempt.parent is not None and attempt.parent.dead
            return "was killed with its driver" if killed else "crashed"
        if attempt.lost:
            return "was lost by Spark (a zombie beside its retry)"
        finished = attempt.finished
        if finished.done() and isinstance(finished.exception(), LedgerConflict):
            return "lost its entry to a later attempt (a zombie)"
        return None
