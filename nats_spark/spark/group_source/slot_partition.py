"""What the driver hands a task: one slot of one batch (the group source's input partition), or
several slots packed into one (`PackedSlots`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from pyspark.sql.datasource import InputPartition

from nats_spark.connection import ConnectionSettings
from nats_spark.jetstream.pull_loop import Thresholds

UNBOUNDED = 2**64 - 1  # above any stream sequence


@dataclass(frozen=True)
class SlotReading:
    """How every task of a query reads: the same for all its slots and batches, made once from
    the query's options (`SourceOptions.reading`)."""

    connection: ConnectionSettings
    ledger_bucket: str
    fetch_batch_size: int
    fetch_timeout: float
    include_headers: bool
    fail_on_data_loss: bool
    thresholds: Thresholds = Thresholds()


@dataclass(frozen=True)
class Recreation:
    """How to go on when a slot's consumer, which the query refuses to read on, was deleted and
    created again: the advice `before` + a stream sequence + `after`, which names where the
    consumer is to start again: `start` (right after what the query acked,
    `SeenConsumers.next_after_acked`), or the first sequence a batch not committed yet holds in
    its entries below it (`starting_by`). `acked_earlier`: what a query on an earlier checkpoint
    acked of the consumer (`SeenConsumers.acked_earlier`), all below `start`."""

    before: str
    start: int
    after: str = ""
    acked_earlier: frozenset[int] = frozenset()

    def __str__(self) -> str:
        return self.starting_by(())

    def starting_by(self, replayed: Iterable[int], held: Collection[int] = ()) -> str:
        """The advice, its start no later than the first of `replayed`: what a batch logged and
        not committed yet holds in its entries, which its run again replays from the stream. A
        consumer created past them takes them as acked, and what purges acked messages (an
        interest or work-queue stream, an operator) would leave the batch unable to run again
        (`DataLoss` at every run: seed 2550 of the simulation's worlds whose operator follows
        the advice); one created at them delivers them again, which the batch's entries drop
        (a static group's, which the query creates there, is judged knowing that:
        `SeenConsumers.place`). But one created there delivers again what an earlier
        checkpoint's query acked above it that neither the batch nor the ledger (`held`: what
        else it knows the query's entries hold) holds, which nothing drops, and is refused with
        this same advice (seed 8 of those worlds). No start reads exactly once then unless the
        stream keeps the batch's messages: the advice is `start`, past both, and says to keep
        those until the query has committed them."""
        replayed = set(replayed)
        first = min([self.start, *replayed])
        again = sorted(
            seq for seq in self.acked_earlier if seq >= first and seq not in replayed | set(held)
        )
        if not again:
            return f"{self.before}{first}{self.after}"
        kept = sorted(seq for seq in replayed if seq < self.start)
        return (
            f"{self.before}{self.start}{self.after}, and keep stream sequences {spans(kept)} "
            f"(do not purge them) until the query has committed them: {NO_EXACT_START} without "
            f"them, since the batch it runs again replays them, and a consumer that starts at or "
            f"before {again[-1]} delivers again what a query on an earlier checkpoint acked "
            f"({spans(again)})"
        )


# A refusal of a consumer created again that no start reads on exactly for sure: the line names
# what each start costs (`consumer_checks.start_refusal`, `Recreation.starting_by`).
NO_EXACT_START = "no start reads exactly once"


def seq_spans(seqs: Iterable[int]) -> list[list[int]]:
    """Stream sequences as [first, last] spans of consecutive ones, in order."""
    runs: list[list[int]] = []
    for seq in sorted(seqs):
        if runs and runs[-1][1] == seq - 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return runs


def spans(seqs: Iterable[int]) -> str:
    """Stream sequences as a line names them: `3-4, 7`."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in seq_spans(seqs))


@dataclass(frozen=True)
class ConsumerSighting:
    """A slot's consumer as the driver last saw it, for consumers the query refuses to read once
    they were deleted and created again (a static group's, a plain one): everything through
    stream sequence `ack_floor` was acked, so the consumer delivers none of it again, and each
    delivery has a consumer sequence above `delivered`; a new one (DeliverAll) starts over with
    both; it was created at `created` (RFC 3339). `recreation`: how to go on then.
    `started_over`: the consumer was created again since the batch was planned (a batch run
    again after a restart): an earlier attempt's entries of the batch may hold what the old one
    delivered, which the new one delivers again as first deliveries."""

    ack_floor: int
    delivered: int
    recreation: Recreation
    created: str = ""
    started_over: bool = False


@dataclass(frozen=True)
class SlotPartition(InputPartition):
    """Everything a task needs: executors get no other state from the driver."""

    reading: SlotReading
    pointer_key: str  # the target's ledger pointer (`Pointer.settled` fences zombie attempts)
    lineage: str
    gen: int
    slot: str  # `partition-<p>`, a member's name, or `<consumer>#<i>` (its ledger entries' name)
    stream: str  # stream the consumer reads (for elastic groups the work-queue stream)
    consumer: str
    priority_group: str | None
    member: str | None  # value of the `member` column
    partitioned: bool  # subjects carry a partition token to strip
    limit: int  # 0: an ack-only partition (the slot has acks due, nothing planned)
    pin_id: str | None
    committed: tuple[int, ...]  # gens of this slot's entries to ack: their batches are committed
    # (slot, first gen, last gen): entries of earlier batches on this stream not settled yet,
    # whose messages are dropped if redelivered (gens in between may have no entry)
    dedupe: tuple[tuple[str, int, int], ...]
    siblings: tuple[str, ...] = ()  # other slots of this batch pulling from the same consumer
    ack_wait: float = 30.0  # the consumer's: what this task takes must not come back meanwhile
    # the highest stream sequence the `dedupe` entries hold: above it no delivery is theirs
    dedupe_through: int = UNBOUNDED
    # seconds a pull that finds nothing ready may wait for redeliveries: an availableNow run's
    # wait for what the consumer holds beyond the query's ledger (`SlotState.others_due`)
    redelivery_wait: float = 0.0
    # None: a consumer created again reads nothing twice (an elastic group's), or none seen yet
    consumer_sighting: ConsumerSighting | None = None
    # By gen, the task index of each slot whose head is kept in its packed task's key, for
    # the batches whose entries this task reads or writes (`packed_heads`; the same mapping
    # for every slot of a batch, pickled once for a packed task's slots)
    layouts: Mapping[int, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class PackedSlots(InputPartition):
    """Several slots of one batch read by one task, their rows emitted slot by slot in this
    order (`driver/slot_packing`); each slot keeps its own ledger entry and attempt."""

    slots: tuple[SlotPartition, ...]
