"""What a schedule must keep (the README's guarantees; docs/faults.md says how the simulation
checks them), checked as it runs and once it is quiet. A query run belongs to the checkpoint it
started on, and so do its task attempts (a zombie of an earlier checkpoint's run included):
Spark's outputs are per checkpoint, so each check is too.

- no message in two committed batches of one checkpoint (a query started on a new checkpoint
  may emit again what an earlier one committed and never acked);
- no ack before a batch of the acking run's checkpoint that emitted the message is committed
  (its rows are in that checkpoint's sink): a new checkpoint that drops what an earlier one
  committed and never acked, acking it unemitted, fails, though the earlier sink holds it;
- once quiet: every message of the stream in a committed batch of the checkpoint whose ack took
  it off (or, never acked, of the last one), none left unacked (a message another client acked
  last is that client's, `taken_by_another`); no ledger entry of a lineage the
  pointer does not name (nothing would ever act on it again), no chunk whose entry is gone, and
  of the pointer's own lineage only sealed empty entries (an open one would never be acked; an
  acked one, once the quiet query has looked past the settle time, should have been removed);
- a batch run again yields the same rows in the same order (per slot) as every earlier run
  whose rows could have reached the sink (all its tasks finished);
- per key (subject), committed rows follow stream order (README guarantee 4), except in its two
  cases (`lateness.py`): the attempt that held the late message's delivery (the one before the
  delivery it was emitted from) died before it recorded it, or a give-back's driver died between
  removing that delivery's entry and giving it back. Such a break is counted apart
  (`order_breaks`, by cause in `order_reasons`), any other fails;
- another client of the query's consumer (`other_client.py`) never gets a message the live
  checkpoint committed, nor does the live checkpoint commit one the other client got (and
  acked) before, unless the world let it out (`taken_by_another`, `_committed_after_taken`).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tests.simulation.jetstream import Consumer, Delivery, Stream, consumer_of
from tests.simulation.lateness import Attempts, GiveBacks, held_before, late_already
from tests.simulation.scheduler import Participant

Stall = tuple[Participant, float, float]  # whose process paused, from when, until when
Rows = dict[str, list[int]]  # by slot: stream sequences, in the order emitted
# A refusal of a consumer created again for a message it would skip that the stream holds.
STARTS_PAST = re.compile(
    r"consumer '([^']+)' on stream .*: the new one starts past stream sequence (\d+), which the "
    "query never read"
)
CAME_BACK = "it came back to the query after the other client's take (its ack lost, or too late)"


@dataclass
class Take:
    """Another client's take of a message the live checkpoint had not committed: judged if that
    checkpoint commits it later, by what was so when it took it."""

    at: float
    # What lets it out were the query to commit it from what it held before the take (None:
    # nothing, or the query held no delivery just before the other client's).
    why: str | None
    delivered_again: Callable[[], bool]  # whether the server delivered it after the take's


@dataclass
class Observed:
    stream: Stream
    key_order: bool  # whether per-key order is promised (not for readers sharing a consumer)
    give_backs: GiveBacks  # the world's give-backs, watched
    who: Callable[[], Participant | None] = lambda: None  # the participant running now
    # By checkpoint, in the order they were started (the last is the live one):
    sinks: list[dict[int, Rows]] = field(default_factory=lambda: [{}])  # by batch id
    in_sinks: list[dict[int, int]] = field(default_factory=lambda: [{}])  # stream seq -> batch
    runs: dict[int, Rows] = field(default_factory=dict)  # by batch id: its first full run
    drivers: dict[Participant, int] = field(default_factory=dict)  # a query run's checkpoint
    acked_in: dict[int, int] = field(default_factory=dict)  # stream seq -> checkpoint, last ack
    attempts: Attempts = field(init=False)
    problems: list[str] = field(default_factory=list)  # broken guarantees
    order_breaks: list[str] = field(default_factory=list)  # per-key order, the README's case
    order_reasons: Counter[str] = field(default_factory=Counter)  # by what explains them
    now: Callable[[], float] = lambda: 0.0
    stalls: list[Stall] = field(default_factory=list)  # the scheduler's, as they happen
    runs_lived: dict[Participant, tuple[float, float]] = field(default_factory=dict)  # query runs'
    others: set[Participant] = field(default_factory=set)  # other clients of the consumers
    brought_back: set[str] = field(default_factory=set)  # ledger keys an unclean restart revived
    taken_by_others: set[int] = field(default_factory=set)  # stream seqs another client acked last
    let_out: Counter[str] = field(default_factory=Counter)  # committed, then another client's: why
    # By stream seq: another client's takes of what the live checkpoint had not committed yet.
    takes: dict[int, list[Take]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.attempts = Attempts(lambda: self.now(), self.give_backs.removed)

    @property
    def sink(self) -> dict[int, Rows]:
        """What the live checkpoint's sink holds."""
        return self.sinks[-1]

    def problem(self, kind: str, detail: str) -> None:
        self.problems.append(f"{kind}: {detail}")

    def new_checkpoint(self) -> None:
        """The next query run starts on a new checkpoint: its batch ids and sink are its own."""
        self.sinks.append({})
        self.in_sinks.append({})
        self.runs = {}
        self.takes = {}  # judged per checkpoint, as what it commits

    def query_run(self, driver: Participant) -> None:
        """`driver` runs the query on the live checkpoint."""
        self.drivers[driver] = len(self.sinks) - 1
        self.runs_lived[driver] = (self.now(), float("inf"))

    def run_ended(self, driver: Participant) -> None:
        """`driver`'s query run stopped, failed or was killed: it keeps nothing any more."""
        self.runs_lived[driver] = (self.runs_lived[driver][0], self.now())

    def _checkpoint_of(self, participant: Participant | None) -> int:
        """The checkpoint of the query run `participant` is (or is a task attempt of)."""
        while participant is not None and participant not in self.drivers:
            participant = participant.parent
        return len(self.sinks) - 1 if participant is None else self.drivers[participant]

    def full_run(self, batch: int, rows: Rows) -> None:
        """Every task of a run of `batch` finished with `rows`: they could reach the sink."""
        rows = {slot: seqs for slot, seqs in rows.items() if seqs}
        first = self.runs.setdefault(batch, rows)
        if first != rows:
            self.problem("re-run differs", f"batch {batch} first emitted {first}, now {rows}")

    def sink_write(self, batch: int, rows: Rows) -> None:
        """The sink commits `batch` (once: an exactly-once sink skips a batch id it has)."""
        if batch in self.sink:
            return
        self.sink[batch] = rows
        in_sink = self.in_sinks[-1]
        for seqs in rows.values():
            for seq in seqs:
                if seq in in_sink:
                    self.problem(
                        "emitted twice", f"message {seq} in batches {in_sink[seq]} and {batch}"
                    )
                else:
                    in_sink[seq] = batch
                    self._committed_after_taken(seq, batch)

    def acked(self, consumer: str, seq: int) -> None:
        who = self.who()
        if who in self.others:  # that client's own: no batch of the query's need hold it
            self.taken_by_others.add(seq)
            self.acked_in.pop(seq, None)
            return
        self.taken_by_others.discard(seq)
        checkpoint = self._checkpoint_of(who)
        self.acked_in[seq] = checkpoint
        if seq not in self.in_sinks[checkpoint]:
            self.problem(
                "acked before commit", f"message {seq} of {consumer} (checkpoint {checkpoint})"
            )

    def taken_by_another(
        self,
        seq: int,
        earlier: list[Delivery],
        wait: float,
        delivered_again: Callable[[], bool] = lambda: False,
    ) -> None:
        """Another client got `seq`, after the deliveries `earlier` (oldest first; the query's
        hold is judged by the last it held, `_held_last`; `wait`: its ack wait;
        `delivered_again`: whether the server has delivered it again since the other client's
        delivery, when asked). What it takes is not the query's: a message the query never committed
        may be taken by anyone (it is no loss: the other client acks it, and the quiet check leaves
        it out), and one an earlier checkpoint committed a new one may take again, so may another
        client. One the live checkpoint committed is a duplicate in the world, emitted by the query
        and processed by the other client: the query must hold it until it acks it (ack waits kept
        by its tasks, then by the driver's `SealedKeeper`). Only the world can let it out, and such
        a case is counted apart (`let_out`): the query's ack of it lost in a server restart; the
        attempt that held its delivery killed, or the one whose open entry held it when a sibling
        had dropped its delivery as that entry's (nothing keeps that wait until a retry has taken
        its entry over); or its delivery's wait ran out while no run of the live checkpoint lived,
        without a pause, all of that wait (the query stopped or was killed; a stall, of the driver's
        process or of an attempt that held it, its delivery or its entry, or that was taking over
        its entry once released, as docs/architecture.md says). So can the other client itself:
        it took a delivery it got before the query's, once its ack wait had run out (it stalled
        in between) and the server had delivered the message again (`delivered_again` at the
        take); no reader of the consumer can keep another from processing what it holds (seed
        6024 of the worlds with another client). What the live checkpoint had not committed yet
        is judged if it commits it later
        (`_committed_after_taken`), with the same let-outs, as they were at the take."""
        live = len(self.sinks) - 1
        batch = self.in_sinks[live].get(seq)
        before = self._held_last(seq, earlier)
        if before is not None and before.owner in self.others:
            return  # back to the other client (its own ack lost): its earlier take is judged
        if delivered_again():
            why: str | None = "the other client took its delivery after its ack wait ran out"
        else:
            why = self._let_out_by_the_world(seq, before, wait, live)
        if batch is None:
            self.takes.setdefault(seq, []).append(Take(self.now(), why, delivered_again))
        elif why is None:
            self.problem("committed, then taken by another client", f"message {seq}, batch {batch}")
        else:
            self.let_out[why] += 1

    def _committed_after_taken(self, seq: int, batch: int) -> None:
        """The live checkpoint commits `seq` in `batch`: a duplicate in the world if another
        client took it before, unless the world let it out, as `taken_by_another` judges it
        when the commit came first; or it came back to the query only after the take (the other
        client's ack lost in a restart, or its delivery past its wait as it processed it) and
        no entry of the live checkpoint held it before: then the query committed what the
        server gave it again, not what it held when the other client took it."""
        live = len(self.sinks) - 1
        for take in self.takes.pop(seq, []):
            why = take.why
            if take.delivered_again() and not any(
                holder is not None for holder in self._holding(seq, -math.inf, take.at, live)
            ):
                why = CAME_BACK
            if why is None:
                self.problem(
                    "taken by another client, then committed", f"message {seq}, batch {batch}"
                )
            else:
                self.let_out[f"taken before its commit: {why}"] += 1

    def _held_last(self, seq: int, earlier: list[Delivery]) -> Delivery | None:
        """The delivery of `earlier` by which the query held `seq` last: the last, but one that
        a task attempt took and gave back itself unrecorded, as it failed or closed: it came
        to that attempt only once what held it before had let it go (a zombie's pull, or a
        sibling's, got the redelivery), and its `-NAK` only hurried a message already free to
        the server's next pull. Seeds 498 and 970 of the worlds with another client whose
        executors pause: a zombie of the batch, or of an earlier checkpoint, got a committed
        message after a stall of the driver had let its wait run out, and gave it back."""
        for delivery in reversed(earlier):
            owner = delivery.owner
            if not (
                delivery.given_back
                and owner is not None
                and owner.kind == "task"
                and delivery.given_back_by is owner
                and seq not in self.attempts.recorded.get(owner, ())
            ):
                return delivery
        return None

    def _let_out_by_the_world(
        self, seq: int, before: Delivery | None, wait: float, live: int
    ) -> str | None:
        if seq in self.acked_in:  # the query's ack took it off: only a restart brings it back
            return "the query's ack lost in a server restart"
        if before is None or before.given_back or before.queued is None:
            return None  # the query never held it, or gave back what it committed
        if before.owner is not None and before.owner.dead:
            # Nothing keeps its wait until a retry takes the entry over, once the head stood
            # still 5 s (a stall and a death look alike): past a 4 s ack wait.
            return "the attempt that held it was killed"
        if self._entry_holder_killed(seq, before.queued, live):
            return "the attempt whose entry held it was killed"
        since, until = before.queued - wait, before.queued
        # Its delivery's holder, the live run's attempts whose entries hold it (a retry keeps
        # what it took over from the take-over on: seed 21621 of the worlds with another
        # client, whose retry stalled past the wait of a delivery a sibling had dropped), and
        # the drivers, whose keepers hold what is sealed.
        holders = {before.owner, *self.drivers, *self._holding(seq, since, until, live)}
        if any(start < until and end > since and who in holders for who, start, end in self.stalls):
            return "a stall while its ack wait ran out"
        for taker, first, last in self.attempts.taking_over(seq, since, until):
            if self._checkpoint_of(taker) == live and any(
                who is taker and start < last and end > first for who, start, end in self.stalls
            ):
                return "a stall of the attempt taking its released entry over"
        if not any(
            self.drivers[driver] == live and start <= since and end >= until
            for driver, (start, end) in self.runs_lived.items()
        ):
            return "no run of the query lived all its ack wait"
        return None

    def _entry_holder_killed(self, seq: int, until: float, live: int) -> bool:
        """Whether the attempt of the live checkpoint whose open entry held `seq` when its
        delivery's wait ran out, at `until`, had been killed by then, and no retry had taken the
        entry over yet: as for a delivery of the killed attempt itself. Seed 16463 of the
        worlds with another client: the delivery was a sibling slot's, which dropped it as
        recorded in its sibling's entry."""
        holders = self._holding(seq, until, until, live)
        died = holders[-1].died if holders and holders[-1] is not None else None
        return died is not None and died <= until

    def _holding(self, seq: int, since: float, until: float, live: int) -> list[Participant | None]:
        """Who held `seq` in the live checkpoint's entries from `since` to `until`
        (`Attempts.holding`: its attempts, None for a sealed entry)."""
        return self.attempts.holding(seq, since, until, lambda a: self._checkpoint_of(a) == live)

    def refused(self, why: str, consumers: list[Consumer], recreated: bool) -> None:
        """The source refused to read on (the schedule ends there: the operator must act): only
        under a consumer with `max_deliver`, before anything was taken, or once a consumer was
        created again, and then not for a message the stream holds that its filter does not
        match (another partition's: no start of it would deliver that); what was committed
        before stays checked (emitted twice, acked before commit)."""
        if any(consumer.max_deliver for consumer in consumers):
            taken = [c.name for c in consumers if c.deliveries]
            if taken:
                self.problem("taken before the refusal", f"{', '.join(taken)}: {why}")
        elif not recreated:
            self.problem("refused with no cause", why)
        skipped = STARTS_PAST.search(why)
        if skipped is not None:
            consumer = next(c for c in consumers if c.name == skipped.group(1))
            if not consumer.mine(self.stream.messages[int(skipped.group(2)) - 1]):
                self.problem("refused for another consumer's message", why)

    def check_quiet(self, consumers: list[Consumer]) -> None:
        last = len(self.sinks) - 1
        missing = [
            m.seq
            for m in self.stream.messages
            if m.seq not in self.in_sinks[self.acked_in.get(m.seq, last)]
            and m.seq not in self.taken_by_others
        ]
        if missing:
            self.problem("not in any committed batch", f"messages {missing}")
        for consumer in consumers:
            unacked = sorted(consumer.pending)
            if unacked or consumer.num_pending() or consumer.dropped:
                self.problem(
                    "left unacked",
                    f"{consumer.name}: ack pending {unacked}, "
                    f"{consumer.num_pending()} never delivered, "
                    f"{consumer.dropped} dropped past max_deliver",
                )
        if self.key_order:
            self._check_key_order(consumers)

    def check_ledger_quiet(self, stored: Mapping[str, tuple[bytes, int]]) -> None:
        """`stored`: the ledger bucket's keys and values. An entry of a lineage that neither is
        the pointer's nor is named by it as replaced is never acked, given back or removed; a
        chunk whose entry is gone, never removed (but with its lineage's give-back still to
        come); an entry of the pointer's own lineage, once
        the quiet query has looked past the settle time, either held nothing (sealed empty) or
        was left behind (`live_leftovers`)."""
        named, replaced, retired = set[str](), set[str](), set[str]()
        for key, (value, _) in stored.items():
            if key.startswith("query."):
                pointer = json.loads(value)
                replaced |= set(pointer.get("replaced", []))
                retired |= set(pointer.get("retired", []))
                named |= {pointer["lineage"], *replaced}
        left = sorted(key for key in _heads(stored) if key.split(".")[0] not in named)
        if left:
            self.problem("ledger entries left behind", ", ".join(left))
        live = live_leftovers(stored)
        if live:
            self.problem("ledger entries of the live lineage left behind", ", ".join(live))
        chunks = [key for key in stored if not key.startswith("query.") and key.count(".") > 2]
        # A chunk of a lineage still to be given back (replaced, not yet retired: its give-back
        # retires it first) goes with it at the next batch planned, whose listing takes chunks
        # without a head too; so does one a restart brought back (`Setup.removals_return`) of
        # a replaced lineage.
        due = replaced - retired
        orphans = sorted(
            key
            for key in chunks
            if key.rsplit(".", 2)[0] not in stored
            and key.split(".")[0] not in due
            and not (key in self.brought_back and key.split(".")[0] in replaced)
        )
        if orphans:
            self.problem("ledger chunks left behind (their entry is gone)", ", ".join(orphans))

    def check_live_lineage(self, stored: Mapping[str, tuple[bytes, int]], committed: int) -> None:
        """Once the last run stopped with gen `committed` committed: no entry of the pointer's
        lineage is left OPEN (a committed batch has none, and no attempt of one will seal it: a
        restart counts its messages as the query's own for good, and never acks nor settles
        it), nor SEALED past `committed` (no batch will replay or ack it)."""
        pointers = [json.loads(value) for key, (value, _) in stored.items() if key[:6] == "query."]
        live = pointers[0]["lineage"] if pointers else None
        left = []
        for key, (value, _) in stored.items():
            lineage, _, rest = key.partition(".")
            if lineage != live or rest.count(".") != 1:
                continue
            state = json.loads(value)["state"]
            if state == "open" or (state == "sealed" and int(rest.split(".")[0]) > committed):
                left.append(f"{key} ({state})")
        if left:
            self.problem("ledger entries of the live lineage left behind", ", ".join(sorted(left)))

    def _check_key_order(self, consumers: list[Consumer]) -> None:
        for checkpoint, sink in enumerate(self.sinks):
            self._check_key_order_in(checkpoint, sink, consumers)

    def _check_key_order_in(
        self, checkpoint: int, sink: dict[int, Rows], consumers: list[Consumer]
    ) -> None:
        last: dict[str, int] = {}
        for batch in sorted(sink):
            for seqs in sink[batch].values():
                for seq in seqs:
                    key = self.stream.messages[seq - 1].subject
                    if last.get(key, 0) > seq:
                        self._order_break(seq, key, last[key], batch, checkpoint, consumers)
                    last[key] = max(last.get(key, 0), seq)

    def _order_break(
        self,
        seq: int,
        key: str,
        newer: int,
        batch: int,
        checkpoint: int,
        consumers: list[Consumer],
    ) -> None:
        detail = f"{key}: message {seq} after {newer} (batch {batch})"
        consumer = consumer_of(consumers, self.stream.messages[seq - 1])
        deliveries = consumer.deliveries.get(seq, [])

        def emitted(delivery: Delivery, of: int = seq) -> bool:
            """Whether the rows of `of` in this checkpoint's sink came from `delivery`: the
            first an attempt of the checkpoint wrote to its entry."""
            owner = delivery.owner
            return (
                owner is not None
                and of in self.attempts.writing.get(owner, ())
                and self._checkpoint_of(owner) == checkpoint
            )

        newer_emitted = next(
            (d for d in consumer.deliveries.get(newer, []) if emitted(d, newer)), None
        )
        held = held_before(deliveries, emitted)
        why = None
        while held is not None:
            why = self.attempts.why_late(seq, held, consumer.name, newer_emitted)
            why = why or self.give_backs.why_late(held)
            why = why or self.attempts.skipped_after_a_stall(
                seq, held, deliveries, consumer, self.stalls
            )
            if why is not None or not late_already(held, newer_emitted):
                break
            held = held_before(deliveries, lambda delivery, late=held: delivery is late)
        if why is None:
            self.problem("key order", f"{detail}, neither of the README's first two cases")
            return
        self.order_breaks.append(f"key order: {detail}")
        self.order_reasons[why] += 1


def _heads(stored: Mapping[str, tuple[bytes, int]]) -> list[str]:
    return [key for key in stored if not key.startswith("query.") and key.count(".") == 2]


def live_leftovers(stored: Mapping[str, tuple[bytes, int]]) -> list[str]:
    """The entries of the pointer's lineage that hold something, with their states: an idle
    query has acked all it committed, and removes what it acked once the settle time passed."""
    lineages = [json.loads(v)["lineage"] for k, (v, _) in stored.items() if k.startswith("query.")]
    left = []
    for key in sorted(_heads(stored)):
        if key.split(".")[0] in lineages:
            head = json.loads(stored[key][0])
            if head["state"] != "sealed" or head["count"]:
                left.append(f"{key} ({head['state']}, {head['count']} messages)")
    return left
