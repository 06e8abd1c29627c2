"""Why a committed message came after a newer one of its key (README guarantee 4, Order).

The README allows three cases; the first two are explained here (the third, an attempt of a
replaced query that creates its entry after the give-back, leaves that entry behind, which the
simulation fails as such). In both a delivery of the message was left to its ack wait, named
by no ledger entry and given back by nobody, so the message stayed with the server while the
slot's next pulls took newer messages of its key. Only the delivery just before the one the
message was emitted from (`held_before`) can explain it: an earlier one came back, and was taken
again, before the break; unless that one itself came after the newer message's emitted
delivery (`late_already`): the message was late already, and the delivery before it must.
- a task attempt took the delivery and died (crashed with its executor, killed with its driver,
  or a zombie: lost by Spark, or running on until a later attempt took its entry over or a
  query on a new checkpoint gave it back; one alive beside the attempt that took its entry
  over, a speculative copy, then hands out the sealed entry; one Spark closed after another
  attempt took its entry over while it stalled) before it recorded it in its ledger entry
  (`Attempts`: what each attempt recorded; the consumers keep which attempt each delivery went
  to); or its process stalled more than half the ack wait after the delivery came, and as it
  then failed or Spark closed it, its give-back skipped the delivery as not surely running
  (`Attempts.skipped_after_a_stall`);
- a query on a new checkpoint gives back what the earlier query's entries hold: it removes the
  entries, then sends `-NAK` for their deliveries, and its driver died between the two
  (`GiveBacks`).
A delivery given back (`-NAK`) by a driver comes back at once, ahead of newer messages: it
explains nothing. One given back by the attempt that held it unrecorded, as it failed mid-batch,
comes back at once too, but its retry may have taken newer ones meanwhile, or newer ones were on
the redelivery queue before it: the first case. So is a later delivery of a message the attempt
recorded, when it gave that one back itself: the message came again to a pull the attempt still
had out after a new checkpoint's give-back NAKed the recorded delivery. One an attempt gave back
as Spark closed it, holding its entry, is a driver's give-back: no other attempt pulled before
that `-NAK` (`REQUEUED` when the newer message was taken after it).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from nats_spark.jetstream.acks import NAK_WITHIN
from nats_spark.spark.group_source.ledger import (
    ChunkMissing,
    EntryDeliveries,
    EntryHead,
    EntryState,
    Ledger,
    LedgerConflict,
    chunk_deliveries,
    inline_deliveries,
    read_deliveries,
    read_head,
)
from nats_spark.spark.group_source.ledger_protocol import Marks
from nats_spark.spark.group_source.runtime import GiveBack
from nats_spark.spark.group_source.task.slot_entry import SlotEntry
from nats_spark.spark.group_source.task.slot_reader import SlotReader
from tests.memory_bucket import MemoryBucket, stored_head
from tests.simulation.jetstream import Consumer, Delivery, Stream, deliveries_of
from tests.simulation.scheduler import Participant, Scheduler

# A delivery given back comes back ahead of newer messages of its key, unless some were on
# nats-server's redelivery queue before it (their ack wait ran out: the queue is first in,
# first out), or a server restart emptied the queue. Found once the simulated server did both
# (seed 767). Not one of the README's cases yet: counted apart (`order_reasons`, printed by
# `make simulate`) until the README states it or the source avoids it.
REQUEUED = "OPEN: given back, yet redelivered after newer messages of its key"
# Scheduler times this close are one instant (their float sums differ in the last bits): a
# stall that ended as a delivery came, to a request sent as the process woke, did not hold it.
SAME_INSTANT = 1e-6


class Hold(NamedTuple):
    """An entry came to hold a message: `attempt` recorded it or took it over, or sealed it (its
    batch's driver keeps it from the seal's answer on)."""

    at: float
    attempt: Participant
    sealed: bool = False


class Held(NamedTuple):
    """A `Hold` of one stream seq: taken back when the write it began with never landed."""

    seq: int
    hold: Hold


def _stored_head(entry: SlotEntry) -> tuple[str, bytes, int] | None:
    """The head of `entry` now, as stored (key, value, revision), read from the bucket's values
    themselves, which neither adds a scheduling point nor counts as a read."""
    assert entry.ledger is not None
    ledger, partition = entry.ledger, entry.partition
    key = ledger.head_key(partition.gen, partition.slot)
    stored = stored_head(ledger.kv.store.values, key)  # type: ignore[attr-defined]  # a SimBucket's
    return None if stored is None else (key, *stored)


def _head_key(entry: SlotEntry) -> str:
    assert entry.ledger is not None
    return entry.ledger.head_key(entry.partition.gen, entry.partition.slot)


def _head(entry: SlotEntry) -> EntryHead | None:
    """The head of `entry` now (read as `_stored_head` does)."""
    stored = _stored_head(entry)
    return None if stored is None else EntryHead.from_bytes(stored[1], stored[0])


def _at(hold: Hold) -> float:
    return hold.at


def _named(entry: SlotEntry) -> set[int]:
    """The stream seqs the head of `entry` names now (read as `_head` does): those it holds
    itself and its chunks'; none when the head or one of its chunks is gone."""
    head = _head(entry)
    if head is None:
        return set()
    values = entry.ledger.kv.store.values  # type: ignore[union-attr]  # `_head` read it
    named = set(inline_deliveries(head).stream_seq)
    for chunk in head.chunks:
        if chunk not in values:
            return set()
        named.update(chunk_deliveries(values[chunk][0], head).stream_seq)
    return named


@dataclass
class Claim:
    """An attempt's claim of the entry of head key `key`, from `started` to `ended`."""

    attempt: Participant
    key: str
    started: float
    ended: float = math.inf


class Attempts:
    def __init__(
        self,
        now: Callable[[], float] = lambda: 0.0,
        given_back: Mapping[str, list[float]] | None = None,
    ) -> None:
        self.now = now
        # By head key: when a new checkpoint's give-back removed the entry (`GiveBacks.removed`).
        self.given_back: Mapping[str, list[float]] = {} if given_back is None else given_back
        self.recorded: dict[Participant, set[int]] = {}  # stream seqs, in its entry
        # Those of them its claim took over from an earlier attempt's record: its entry names
        # that attempt's delivery, so any of its own came again.
        self.adopted: dict[Participant, set[int]] = {}
        # Stream seqs of its deliveries it wrote or began to write to its entry (a write may
        # land and its answer never come), less those only a write a conflict refused named:
        # one of these may be what its batch emitted.
        self.writing: dict[Participant, set[int]] = {}
        # One per slot it reads: a packed task's attempt has several, each of its own consumer.
        self.entries: dict[Participant, list[SlotEntry]] = {}
        # By stream seq, in order: when an attempt's open entry came to hold it (its write
        # recorded it, or its claim took it over), or the attempt sealed the entry.
        self.held_since: dict[int, list[Hold]] = {}
        # The holders (`EntryHead.attempt`) of open entries another attempt's claim took over
        # before they released them: their heads stood still (README guarantee 4, a stall).
        self.taken_from: set[str] = set()
        # By head key: each release that landed, when, with what the entry named (from then
        # until a take-over lands nothing keeps it), and each take-over that landed, when; the
        # claims, in order (`taking_over`).
        self.releases: dict[str, list[tuple[float, set[int]]]] = {}
        self.taken_over_at: dict[str, list[float]] = {}
        self.claims: list[Claim] = []
        # By attempt and consumer (a packed task's slots give back each their own): when it gave
        # back what it held (`SlotReader.give_back`: it failed, was closed, or found its entry
        # gone at its seal).
        self.gave_back: dict[tuple[Participant, str], list[float]] = {}

    def watch(self, attempt: Participant, entry: SlotEntry) -> None:
        """Count what `entry` adopts at its claim, and what its writes record once they are
        answered, as recorded by `attempt`. No scheduling point is added."""
        self.entries.setdefault(attempt, []).append(entry)
        recorded = self.recorded.setdefault(attempt, set())
        began = self.writing.setdefault(attempt, set())
        claim, write, seal = entry.claim, entry._write, entry.seal
        claimed = False

        async def claiming(
            keep: Callable[[EntryDeliveries], Awaitable[None]] | None = None,
            restart: Callable[[EntryDeliveries], Awaitable[None]] | None = None,
        ) -> None:
            nonlocal claimed
            key = _head_key(entry) if entry.ledger is not None else ""
            self.claims.append(made := Claim(attempt, key, self.now()))
            try:
                await claim(keep, restart)
            finally:  # not when the attempt dies in it (a crash leaves it where it was)
                made.ended = self.now()
            claimed = True
            recorded.update(entry.taken)
            self.adopted.setdefault(attempt, set()).update(entry.taken)
            if not entry.fixed:  # again, if its take-over's answer was lost
                self._hold(attempt, entry.taken)

        def sealed_if_landed() -> None:
            if (head := _head(entry)) is not None and head.state != EntryState.OPEN:
                self._hold(attempt, entry.taken, sealed=True)

        async def sealing() -> None:
            # The attempt holds them until its seal is answered, or found landed as it fails:
            # a pause before the write lands is the attempt's, not the driver's (seed 1949 of
            # the worlds with another client whose executors pause, a 4 s wait: the attempt
            # stalled 11.7 s at its seal, and a sibling's delivery of what it sealed ran out).
            try:
                await seal()
            except BaseException:
                sealed_if_landed()
                raise
            self._hold(attempt, entry.taken, sealed=True)

        # What the attempt's record write not yet sent will name: begun once its head write
        # goes out, which alone can make a batch emit them (seed 578 of the worlds of mutant
        # `acked-through-ignored`, ledger format 3: an attempt died as its first record's head
        # write came to its scheduling point, and a batch was taken to have emitted that
        # delivery, hiding the crash that held it back).
        unsent: set[int] = set()
        sent_hooks = getattr(entry.ledger.kv, "sent", None) if entry.ledger is not None else None

        if sent_hooks is not None:  # the world's bucket tells (a unit test's may not)
            updating_key = f"kv update {_head_key(entry)}"

            def sent(what: str) -> None:
                if what == updating_key:
                    began.update(unsent)
                    unsent.clear()

            sent_hooks.append(sent)

        # A claim's head write that took effect, told as it did (the world's bucket tells) or
        # at its answer: the attempt may die before the answer comes.
        landing: list[Callable[[], None]] = []
        landed_hooks = (
            getattr(entry.ledger.kv, "landed", None) if entry.ledger is not None else None
        )
        if landed_hooks is not None:
            landed_key = f"kv update {_head_key(entry)}"

            def landed(what: str) -> None:
                if what == landed_key and landing:
                    landing.pop()()

            landed_hooks.append(landed)

        if entry.ledger is not None:  # the world's entries have theirs (a unit test's may not)
            update_head = entry.ledger.update_head

            async def updating_head(gen: int, slot: str, value: bytes, revision: int) -> int | None:
                # A claim's write lands on the head read now, or on none
                replacing = None if claimed else _stored_head(entry)
                took_over: list[EntryHead] = []  # the head it replaced, once it took effect

                def taking_effect() -> None:
                    stored = _stored_head(entry)
                    if replacing and replacing[2] == revision and stored and stored[1] == value:
                        previous = EntryHead.from_bytes(replacing[1], replacing[0])
                        took_over.append(previous)
                        if previous.released and (releases := self.releases.get(replacing[0])):
                            # the taker's from the release: nothing kept them in between, and
                            # an attempt killed before its answer held them (seed 194 of the
                            # worlds with another client and early stops)
                            self._hold(attempt, entry.taken, at=releases[-1][0])

                landing[:] = [taking_effect]
                try:
                    written = await update_head(gen, slot, value, revision)
                finally:  # it may have landed, its answer lost
                    if landing:  # not told as it took effect
                        landing.pop()()
                    if took_over:
                        key = _head_key(entry)
                        self._took_over(took_over[0], EntryHead.from_bytes(value, key))
                        self.taken_over_at.setdefault(key, []).append(self.now())
                if written is not None and not claimed:  # a take-over landed: held from here on
                    self._hold(attempt, entry.taken)
                return written

            entry.ledger.update_head = updating_head  # type: ignore[method-assign]

        last: list[set[int]] = [set()]  # what the attempt's last write recorded

        async def writing(
            kept: tuple[str, list[str]],
            taken: EntryDeliveries,
            pin: str | None,
            replacing: int = 0,
            sealing: bool = False,  # a last record seals the entry with it, as `sealing` does
        ) -> None:
            written = set(taken.stream_seq)
            (unsent if sent_hooks is not None else began).update(written)
            # Held from the write's start: it may land, its answer lost. One that failed held
            # nothing unless its head names them (seeds 2538 of the packed worlds with another
            # client, 2667 and 2779 of those whose executors pause: a write that never landed
            # was taken for the query holding the message before the other client took it).
            holds = [] if replacing else self._hold(attempt, written)
            try:
                await write(kept, taken, pin, replacing, sealing)
            except BaseException as error:
                unsent.clear()
                if sealing:
                    sealed_if_landed()
                named = _named(entry)
                if holds and not written <= named:
                    for hold in holds:
                        self.held_since[hold.seq].remove(hold.hold)
                if isinstance(error, LedgerConflict):
                    # Refused (the entry taken over or removed): what the head does not name
                    # now, no head will (a take-over adopts only what the head named), so no
                    # batch emitted these deliveries of it (seed 2544 of the worlds whose
                    # consumer is created again: one taken for where the message's rows came
                    # from hid the zombie that held the delivery before the emitted one).
                    began.difference_update(written - recorded - named)
                raise
            if replacing:  # the last write again, without what a sibling recorded too
                dropped = last[0] - written
                recorded.difference_update(dropped)
                # its keeper let them go: the sibling's entry holds them (seed 26 of the worlds
                # with another client whose executors pause: the attempt whose entry held it was
                # killed, and the sibling that dropped its redelivery was taken for its holder)
                self._let_go(attempt, dropped)
            recorded.update(written)
            last[0] = written
            if sealing:
                self._hold(attempt, entry.taken, sealed=True)

        release = entry.release

        async def releasing() -> bool:
            did = await release()
            stored = _stored_head(entry) if entry.ledger is not None else None
            if stored is not None:
                head = EntryHead.from_bytes(stored[1], stored[0])
                if head.released and head.attempt == entry.head.attempt:  # landed
                    released = (self.now(), _named(entry))
                    self.releases.setdefault(stored[0], []).append(released)
            return did

        entry.claim = claiming  # type: ignore[method-assign]
        entry.release = releasing  # type: ignore[method-assign]
        entry._write = writing  # type: ignore[method-assign]
        entry.seal = sealing  # type: ignore[method-assign]

    def watch_give_backs(self, attempt: Participant, reader: SlotReader) -> None:
        """Note when `attempt` gives back through `reader` (of one slot). No scheduling point is
        added."""
        give_back, consumer = reader.give_back, reader.partition.consumer

        async def giving_back(deliveries: list[tuple[bytes, float]]) -> None:
            self.gave_back.setdefault((attempt, consumer), []).append(self.now())
            await give_back(deliveries)

        reader.give_back = giving_back  # type: ignore[method-assign]

    def _took_over(self, previous: EntryHead, head: EntryHead) -> None:
        """A claim's write of `head` replaced `previous`: an open entry taken over before its
        holder released it, unless that write was the claim's `record_anew` of its own
        take-over (the same holder). The holder may be the claiming attempt's own create, its
        answer lost: no attempt holds its entry under that name any more."""
        if (
            previous.state is EntryState.OPEN
            and not previous.released
            and previous.attempt != head.attempt
        ):
            self.taken_from.add(previous.attempt)

    def _hold(
        self, attempt: Participant, seqs: set[int], sealed: bool = False, at: float | None = None
    ) -> list[Held]:
        """`attempt` holds `seqs` from now, or from `at` (a take-over of a released entry, from
        its release: seed 2452 of the packed worlds with early stops and another client, whose
        full read stalled past the wait in its claim, before its take-over landed)."""
        since = self.now() if at is None else at
        holds = [Held(seq, Hold(since, attempt, sealed)) for seq in seqs]
        for held in holds:
            bisect.insort(self.held_since.setdefault(held.seq, []), held.hold, key=_at)
        return holds

    def _let_go(self, attempt: Participant, seqs: set[int]) -> None:
        """`attempt`'s entry no longer holds `seqs`: its holds of them are taken back."""
        for seq in seqs:
            holds = self.held_since.get(seq, [])
            holds[:] = [hold for hold in holds if hold.attempt is not attempt or hold.sealed]

    def taking_over(
        self, seq: int, since: float, until: float
    ) -> list[tuple[Participant, float, float]]:
        """The attempts that were claiming an entry naming `seq` while it stood released from
        `since` to `until`, each with when: nothing keeps the wait of `seq` from the release
        until a take-over lands, so a stall of the claiming attempt then lets it run out
        (seeds 976, 581 and 1278 of the worlds with early stops and another client: the
        batch's full read stalled in its claim of what the attempt a user's job had stopped
        recorded and released; in 1278 it was killed afterwards, as was the next)."""
        found = []
        for claim in self.claims:
            takes = self.taken_over_at.get(claim.key, [])
            for released, named in self.releases.get(claim.key, []):
                if seq not in named:
                    continue
                ends = min((at for at in takes if at > released), default=math.inf)
                start = max(since, released, claim.started)
                end = min(until, ends, claim.ended)
                if start < end:
                    found.append((claim.attempt, start, end))
        return found

    def holding(
        self, seq: int, since: float, until: float, among: Callable[[Participant], bool]
    ) -> list[Participant | None]:
        """Who held `seq` at some time from `since` to `until`, in that order, in the entries of
        the attempts `among` picks (one checkpoint's): each attempt from when it recorded it or
        took it over until another of them did, or one sealed it; None for a sealed entry (its
        driver keeps it). An attempt of an earlier checkpoint that holds it later ends no hold
        of these: it writes entries of its own (of its lineage, or on 4.0/4.1 of gens below
        the new checkpoint's first, which the pointer kept above all the earlier query handed
        out), theirs still name it, and a `+WPI` keeps whatever delivery of it is pending (the
        server matches it by stream sequence)."""
        holds = [hold for hold in self.held_since.get(seq, []) if among(hold.attempt)]
        ends = [*(hold.at for hold in holds[1:]), math.inf]  # each ends as the next begins
        return [
            None if hold.sealed else hold.attempt
            for hold, end in zip(holds, ends, strict=False)
            if hold.at <= until and end >= since
        ]

    def why_late(
        self, seq: int, held: Delivery, consumer: str, newer: Delivery | None = None
    ) -> str | None:
        """How `held`, the delivery of `seq` (by `consumer`) before the one it was emitted from,
        was left to its ack wait by the attempt that held it unrecorded (how that attempt ended),
        or None when it was not. `newer`: the delivery the newer message of its key was
        emitted from (of `consumer`; None: of none of its deliveries)."""
        owner = held.owner
        if held.given_back and (owner is None or held.given_back_by is not owner):
            return REQUEUED  # given back by a driver: at once, ahead of newer messages
        if owner is None or owner.kind != "task":
            return None
        if seq in self.recorded.get(owner, ()) and held.given_back_by is not owner:
            return None  # named by its entry: a retry or a give-back has it
        # Recorded, and given back by the attempt itself: the message came again to a pull the
        # attempt had out after a new checkpoint's give-back NAKed the recorded delivery, and
        # the attempt, its entry gone, held it unrecorded and gave it back as it failed. A
        # `-NAK` joins nats-server's redelivery queue at its tail (`addToRedeliverQueue`),
        # behind newer messages of its key the give-back NAKed (seeds 8719, 9414, 11707).
        ended = self._ended(owner, consumer)
        if ended is not None:
            return f"an attempt that held it unrecorded {ended}"
        # Given back by the attempt itself once a new checkpoint's give-back removed its entry:
        # a zombie that learnt it otherwise than by a `LedgerConflict` (its dedupe read of an
        # earlier entry the give-back removed failed, `ChunkMissing`), whose `-NAK` came after
        # the new query's first batch took newer messages of its key (seeds 333, 557, 677, 947
        # and 955 of the worlds of mutant `failed-acceptance-chunk-kept` on ledger format 3, 445
        # on format 2: the attempt of a stopped query, paused by the stop as its delivery came).
        # Not one that kept the delivery: that one's wait runs out (the mutant).
        if held.given_back_by is owner and self._given_back_under(owner, consumer):
            return "a zombie that held it unrecorded gave it back after its entry's give-back"
        # Given back by the attempt itself as Spark closed it (nothing took its entry: the
        # batch's next attempt stands by until it releases it, after its NAKs): the newer
        # message taken after that NAK came first by the server's order, as after a driver's
        # (seeds 3862 and 1622 of the packed worlds with early stops: the newer one was on
        # the redelivery queue before it; a restart emptied the queue). One taken before the
        # NAK is not explained.
        if held.given_back_by is owner and newer is not None:
            return REQUEUED if newer.order > held.given_back_after else None
        return None

    def skipped_after_a_stall(
        self,
        seq: int,
        held: Delivery,
        deliveries: list[Delivery],
        consumer: Consumer,
        stalls: Iterable[tuple[Participant, float, float]],
    ) -> str | None:
        """Whether `held` (of `deliveries`, those of `seq` by `consumer`), the delivery before the
        one the message was emitted from, was left to its ack wait by the give-back of the task
        attempt it went to, as that attempt failed or was closed, because its process had
        stalled more than `NAK_WITHIN` of the ack wait since it came (README guarantee 4, a
        stall): the give-back NAKs only deliveries whose wait surely runs (`surely_running`,
        dated from their request's sending or a round that surely restarted it), as a NAK of one
        whose wait ran out may give back another reader's delivery (seeds 1347, 689). Seeds
        1496, 1610 of the worlds of mutant `came-again-kept-at-a-lost-seal` (the attempt
        failed: its entry given back by a new checkpoint, a chunk missing), 1738, 1877 of the
        packed worlds with early stops and pausing executors (closed by Spark). The delivery
        was unrecorded, or came again to the attempt after it recorded the message (`again`),
        its entry then given back or removed: one kept by an attempt that took the entry over
        is not given back at all. A message its claim took over came again at any delivery to
        it: the entry names the earlier attempt's (seed 636 of helper-66's worlds of mutant
        `came-again-kept-at-a-lost-seal` with stalls: a zombie retry's give-back skipped 1). A
        stall still on at the give-back counts up to it: a simulated stall holds the process's
        coroutines at their next scheduling point, and one woken by an answer may give back
        inside it (seeds 1244, 1409, 2086 of those worlds with stalls at 10% of the points; 3367,
        3913 at 5%, up to 50 messages a batch)."""
        owner = held.owner
        if owner is None or owner.kind != "task" or held.given_back or held.queued is None:
            return None
        if seq in self.recorded.get(owner, ()):
            earlier = deliveries[: next(i for i, d in enumerate(deliveries) if d is held)]
            named = seq not in self.adopted.get(owner, ()) and not any(
                d.owner is owner for d in earlier
            )
            if named or self._taken_from_it(owner, consumer.name):
                return None  # the delivery its entry names, or one its taker keeps
        least = consumer.ack_wait * NAK_WITHIN
        for gave_back in self.gave_back.get((owner, consumer.name), []):
            if any(
                who is owner
                and held.at + SAME_INSTANT < end
                and min(end, gave_back) - start > least
                for who, start, end in stalls
            ):
                return "an attempt that held it unrecorded stalled, then failed or was closed"
        return None

    def _taken_from_it(self, attempt: Participant, consumer: str) -> bool:
        """Whether another attempt's claim took over the entry `attempt` held of `consumer`'s
        slot, once its own claim had ended."""
        entries = [e for e in self.entries.get(attempt, []) if e.partition.consumer == consumer]
        keys = {_head_key(entry) for entry in entries if entry.ledger is not None}
        return any(
            claim.attempt is attempt
            and claim.key in keys
            and any(at > claim.ended for at in self.taken_over_at.get(claim.key, []))
            for claim in self.claims
        )

    def _given_back_under(self, attempt: Participant, consumer: str) -> bool:
        """Whether a new checkpoint's give-back removed the entry `attempt` held of `consumer`'s
        slot before the attempt gave back what it held there."""
        gave_back = self.gave_back.get((attempt, consumer), [])
        entries = [e for e in self.entries.get(attempt, []) if e.partition.consumer == consumer]
        keys = {_head_key(entry) for entry in entries if entry.ledger is not None}
        return any(
            removed < last
            for key in keys
            for removed in self.given_back.get(key, [])
            for last in gave_back
        )

    def _ended(self, attempt: Participant, consumer: str) -> str | None:
        """How `attempt` died, if in one of the README's ways: crashed (an executor lost),
        killed with its driver (kill -9), or a zombie (lost by Spark, or one that lost its
        entry of `consumer`'s slot to its retry or to a give-back, or to another attempt after
        its head stood still however it ended); else None (its rows reached a batch, or it
        ended otherwise: Spark closed it, holding its entry until it released it)."""
        if attempt.dead:
            killed = attempt.parent is not None and attempt.parent.dead
            return "was killed with its driver" if killed else "crashed"
        if attempt.lost:
            return "was lost by Spark (a zombie beside its retry)"
        finished = attempt.finished
        if finished.done() and isinstance(finished.exception(), LedgerConflict):
            return "lost its entry (a zombie: to its retry, or to a new checkpoint's give-back)"
        # Only the entry of the slot that pulled the delivery: a packed task's other slots may
        # have gone on (seeds 2766 and 8306 of the packed worlds, whose first slot was taken
        # over while the attempt stalled, were judged by their last slot's entry).
        entries = [e for e in self.entries.get(attempt, []) if e.partition.consumer == consumer]
        if any(entry.overtaken for entry in entries):
            return "lost its entry to another attempt while alive, and handed out its seal"
        # One Spark closed ends with neither, having written nothing since: seeds 263 and 953
        # of the packed worlds with early stops, whose attempt, stopped by a user's job after
        # its first rows, stalled past its ack wait holding a delivery unrecorded while the
        # batch's full read took its entry over; awake, it was closed without a NAK (the wait
        # may have run out). Not one closed holding its entry: it gives back before releasing.
        if any(entry.head.attempt in self.taken_from for entry in entries):
            return "lost its entry to another attempt after its head stood still (a stall)"
        return None


class GiveBacks:
    """The deliveries whose entries a give-back removed, by the driver that removed them (until
    its `-NAK`s are out)."""

    def __init__(
        self, sched: Scheduler, store: MemoryBucket, stream: Stream, consumers: list[Consumer]
    ) -> None:
        self.sched = sched
        self.store = store  # the bucket itself: reading it here adds no scheduling point
        self.stream = stream
        self.consumers = consumers
        # By driver, until its -NAKs are out: the entries it removes (head keys), with what
        # they held.
        self.removing: dict[Participant, list[tuple[str, list[Delivery]]]] = {}
        self.removed: dict[str, list[float]] = {}  # by head key: when a give-back removed it

    def watch(self, give_back: GiveBack) -> GiveBack:
        """`give_back` (the driver's, `Runtime.give_back`), noting what each removal leaves named
        by nothing."""

        async def watched(
            client: Any,
            ledger: Ledger,
            keys: list[tuple[int, str]],
            keep_marks: Callable[[Marks], Awaitable[None]],
        ) -> int:
            driver = self.sched.current()
            assert driver is not None  # a driver's give-back
            removing = self.removing.setdefault(driver, [])
            remove = ledger.delete_entry

            async def delete_entry(gen: int, slot: str) -> None:
                key = ledger.head_key(gen, slot)
                removing.append((key, await self._held(ledger, gen, slot)))
                await remove(gen, slot)
                self.removed.setdefault(key, []).append(self.sched.now)

            ledger.delete_entry = delete_entry  # type: ignore[method-assign]
            try:
                returned = await give_back(client, ledger, keys, keep_marks)
            finally:
                ledger.delete_entry = remove  # type: ignore[method-assign]
            del self.removing[driver]  # its -NAKs are out
            return returned

        return watched

    async def _held(self, removing: Ledger, gen: int, slot: str) -> list[Delivery]:
        """The current deliveries of what entry (gen, slot) holds."""
        ledger = Ledger(self.store, removing.lineage, removing.layouts)  # type: ignore[arg-type]
        found = await read_head(ledger, gen, slot)
        if found is None:
            return []
        try:
            recorded = await read_deliveries(ledger, found[0])
        except ChunkMissing:  # brought back without its chunks (`Setup.removals_return`)
            return []
        held = []
        for seq in recorded.stream_seq:
            if deliveries := deliveries_of(self.consumers, self.stream.messages[seq - 1]):
                held.append(deliveries[-1])
        return held

    def why_late(self, held: Delivery) -> str | None:
        """Whether `held`, the delivery before the one the message was emitted from, was
        removed from the ledger by a give-back whose driver died before it gave it back."""
        if held.given_back:
            return None
        for driver, removing in self.removing.items():
            for head_key, deliveries in removing:
                # the driver may have died first
                removed = stored_head(self.store.values, head_key) is None
                if driver.dead and removed and any(d is held for d in deliveries):
                    return "a give-back removed its entry, and its driver died before the -NAK"
        return None


def held_before(deliveries: list[Delivery], emitted: Callable[[Delivery], bool]) -> Delivery | None:
    """The delivery before the first one `emitted` names (the message's rows came from it): the
    one whose holder left the message to its ack wait, if any did; None when the message was
    emitted from its first delivery (nothing held it back) or from none of these."""
    for before, delivery in zip(deliveries, deliveries[1:], strict=False):
        if emitted(delivery):
            return before
    return None


def late_already(held: Delivery, newer: Delivery | None) -> bool:
    """Whether `held`, the delivery before the one the message was emitted from, came after
    `newer`, the delivery of the newer message of its key whose rows came before it (of the
    same consumer; None: of none of its deliveries): the message was late before whoever held
    it took it, which explains nothing then; the delivery before `held` must (seed 969 of the
    packed worlds with early stops: an attempt Spark closed gave back at once the delivery it
    held unrecorded, which had come after newer ones of its key, its earlier delivery's ack
    wait having run out behind theirs on the redelivery queue)."""
    return newer is not None and held.order > newer.order
