"""What each consumer a query reads must stay for exactly once, checked on every consumer info the
driver gets: when the target resolves (before the first message is taken) and at each batch's
planning (an edit or a recreation while the query runs stops it before its next batch)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from nats_spark.errors import (
    CREATED_AGAIN_HARM,
    ConfigurationError,
    NotFound,
    consumer_created_again,
)
from nats_spark.jetstream.api import JetStreamApi
from nats_spark.jetstream.replies import ConsumerInfo, created_later
from nats_spark.spark.group_source.slot_partition import (
    NO_EXACT_START,
    UNBOUNDED,
    Recreation,
    seq_spans,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# Deliver policies of a consumer created again that are refused: the server may pick their start
# again later, from the stream as it is then (a new leader taking over), past messages published
# since; LastPerSubject also skips all but each subject's last message.
MOVING_STARTS = frozenset({"new", "last", "last_per_subject"})


def check_config(stream: str, name: str, config: Mapping[str, Any]) -> None:
    """Refuse a consumer config under which messages could be lost: acks other than explicit
    (the source acks only committed batches), `max_deliver` (a message delivered that many times
    leaves the consumer, and the source has messages redelivered: what a failed or restarted
    batch took comes back, given-back messages are NAKed) and `headers_only` (no data)."""
    if config.get("ack_policy", "explicit") != "explicit":
        raise ConfigurationError(
            f"consumer {name!r} has ack policy {config.get('ack_policy')!r}; the source needs "
            "explicit acks to ack only committed batches: use a consumer with ack_policy "
            "explicit"
        )
    max_deliver = int(config.get("max_deliver") or -1)
    if max_deliver > 0:
        raise ConfigurationError(
            f"consumer {name!r} on stream {stream!r} has max_deliver={max_deliver}: a message "
            "delivered that many times leaves the consumer unread, and the source has messages "
            "redelivered (what a failed or restarted batch took), so messages would be lost; "
            f"set it to -1: nats consumer edit {stream} {name} --max-deliver=-1"
        )
    if config.get("headers_only"):
        raise ConfigurationError(
            f"consumer {name!r} on stream {stream!r} has headers_only: its messages come "
            "without their data, which the source would commit as empty; turn it off: "
            f"nats consumer edit {stream} {name} --no-headers-only"
        )


@dataclass(frozen=True)
class Sighting:
    created: str  # when the server created the consumer (RFC 3339): its identity
    ack_floor: int  # the stream sequence up to which it had everything acked
    delivered: int = 0  # the consumer sequence of its last delivery (0: not known)
    # The highest ledger revision the driver had read before it asked for the info this
    # sighting is of: every ledger write up to it landed before that ask, so the acks a task
    # sent before marking an entry ACKED at or below it reached the server while this consumer
    # still was (`SeenConsumers.marks_known_taken_through`). None: not known (a pointer of a
    # release before it).
    looked_after: int | None = None


@dataclass(frozen=True)
class Skipped:
    """What the query knows of the stream sequences a consumer created again skips
    (`SeenConsumers.skipped`): those it committed through any of its consumers of the stream
    (the ledger's: one a sibling partition delivered is none of this consumer's) or that a
    batch logged and run again now holds (it replays them, and its entries drop what the
    consumer delivers of them again), up to what a query on an earlier checkpoint acked; the
    stream's first sequence (what is below it is gone, read or not), whether what is gone
    unread may be taken as lost (failOnDataLoss=false), and `own_from` (`first_own_unread`): the
    first sequence not committed that the consumer's filter matches; what is not committed between
    the first sequence and it is of other subjects (another partition's, not committed yet or
    its entry settled and removed), which the consumer delivers from no start (0: not asked).
    `replayed`: of `committed`, what the batch run again holds, where a refusal's advice starts
    at the latest (`Recreation.starting_by`)."""

    committed: Collection[int] = ()
    first_seq: int = 0
    lost_ok: bool = False
    own_from: int = 0
    replayed: Collection[int] = ()

    def of_other_subjects(self, seq: int) -> bool:
        """Whether `seq`, not committed, is a message the consumer's filter does not match: one
        the stream still held after the ask (a message gone since counts as the consumer's)."""
        return self.first_seq <= seq < self.own_from


NOTHING_KNOWN = Skipped()  # a consumer not created again skips nothing


# nats-server before 2.12.3 stores a consumer's creation time as its store's (a little later)
# and each replica its own: a restart or a leader change moves it (fixed by nats-server's
# "Recreated stream/consumer state is deleted during recovery"). The query cannot tell that
# from a deletion, so the line says so.
MOVED_CREATION = (
    "nats-server before 2.12.3 also moves it when it restarts or the consumer's leader "
    "changes: if nobody deleted the consumer, upgrade the server"
)


def start_refusal(
    before: Sighting, info: ConsumerInfo, skipped: Skipped, acked_earlier: Collection[int] = ()
) -> str | None:
    """What reading on would do wrong with `info`, a consumer created again since it was seen as
    `before` (None: it can be read on exactly). A consumer never delivers what its ack floor
    covers (acked, or before its start: a new one's floor is the sequence before its start) and
    may deliver anything above. So it emits nothing twice when its floor is at least the one
    seen: what the query committed above that is still in the ledger, which drops redeliveries
    (an entry is removed only once a floor the pointer keeps is past it), but for what an
    earlier checkpoint's query acked above it (`acked_earlier`, `SeenConsumers.acked_earlier`),
    whose entries the give-back to this one removed, unless the ledger holds them again
    (`skipped.committed`: a batch of this checkpoint took them, whose entries drop them). And it
    loses nothing when each sequence between the two floors was committed by the query or
    acked by that earlier one (its checkpoint emitted it)."""
    policy = info.config.get("deliver_policy") or "all"
    if policy in MOVING_STARTS:
        return (
            f"its deliver policy {policy} lets the server move its start past messages the "
            "query never read"
        )
    if info.ack_floor_seq < before.ack_floor:
        return CREATED_AGAIN_HARM
    acked_through = unheld_through(acked_earlier, skipped.committed)
    if info.ack_floor_seq < acked_through:
        return (
            f"a query on an earlier checkpoint acked messages up to stream sequence "
            f"{acked_through}, above the old consumer's ack floor, and the new one would "
            "deliver them again"
        )
    start = max(before.ack_floor, skipped.first_seq - 1 if skipped.lost_ok else 0) + 1
    between = range(start, info.ack_floor_seq + 1)
    # of those, the ones of the consumer's subjects (another partition's it never delivers)
    unread_ones = (
        s
        for s in unread_by_either(between, skipped.committed, acked_earlier)
        if not skipped.of_other_subjects(s)
    )
    unread = next(unread_ones, None)
    if unread is None:
        return None
    if unread < skipped.first_seq:
        return (
            f"stream sequence {unread}, which the query never read, is gone from the stream "
            "(lost: set failOnDataLoss=false to go on)"
        )
    if unread < acked_through:
        return (
            f"{NO_EXACT_START}: stream sequence {unread} was given back by a query on an earlier "
            f"checkpoint and never read again, while that query acked messages up to "
            f"{acked_through}; a consumer that starts at {unread} delivers those again, one "
            f"that starts at {acked_through + 1} skips {unread}: create it at either and "
            "restart the query"
        )
    return f"the new one starts past stream sequence {unread}, which the query never read"


def unheld_through(acked_earlier: Collection[int], held: Collection[int]) -> int:
    """The highest stream sequence a query on an earlier checkpoint acked (`acked_earlier`) that
    the ledger does not hold again (`held`: entries of this query, which drop its redeliveries):
    a consumer that starts at or below it delivers it again, emitted twice (0: none)."""
    return max((s for s in acked_earlier if s not in held), default=0)


class PlacedPastAcked(ConfigurationError):
    """A consumer the query created where it chose (a static group's) starts at or below what a
    query on an earlier checkpoint acked: the caller deletes it, as the line says."""


def placed_past_acked(
    stream: str,
    name: str,
    start: int,
    acked_through: int,
    way_on: Recreation,
    skipped: Skipped,
) -> PlacedPastAcked:
    """The refusal of a consumer the query created at `start`, below `acked_through`; its way
    on no later than the first of what a batch run again holds (`skipped.replayed`)."""
    return PlacedPastAcked(
        f"consumer {name!r} on stream {stream!r} was to start at stream sequence {start}, but "
        f"a query on an earlier checkpoint acked messages up to stream sequence {acked_through} "
        "of it, which it would deliver again; the source deleted it: to read nothing twice, "
        f"{way_on.starting_by(skipped.replayed, skipped.committed)}"
    )


def restart_at(
    start: int, before: str = "", acked_earlier: frozenset[int] = frozenset()
) -> Recreation:
    """How a static group's deleted consumer comes back exactly: created by the query right
    after the last message it acked (`SeenConsumers.next_after_acked`), or at the first one a
    batch logged and run again holds (`Recreation.starting_by`), after `before`."""
    return Recreation(
        f"{before}restart the query with startingPosition=sequence:",
        start,
        ", so it creates the consumer right after the last message it acked, or at the first one "
        "a batch not committed yet holds (the option applies only to consumers it creates)",
        acked_earlier,
    )


def unread_by_either(
    seqs: Iterable[int], committed: Collection[int], acked_earlier: Collection[int]
) -> Iterator[int]:
    """Of `seqs`, in their order, those neither `committed` by this query nor acked by a query on
    an earlier checkpoint (`acked_earlier`): what a consumer created again that starts past them
    would skip unread."""
    return (seq for seq in seqs if seq not in committed and seq not in acked_earlier)


async def first_own_unread(
    api: JetStreamApi, stream: str, filters: Sequence[str], unread: Iterable[int]
) -> int:
    """Of `unread` (ascending: sequences a consumer created again skips that the query did not
    commit), the first the consumer's `filters` match, asked of the stream (its first message
    at or after a sequence on each filter: a request per filter and per message of them met
    that the query committed); `UNBOUNDED` when none does, 0 when the consumer has no filter
    (it delivers every subject). Those before it are other subjects' messages (another
    partition's), which no start of the consumer delivers: refusing for them stops a query a
    new start would not help. The ask passes over a message gone from the stream as over one
    of another subject; the caller reads the stream's first sequence after it."""
    if not filters:
        return 0
    pending = iter(unread)
    seq = next(pending, None)
    while seq is not None:
        matching = min([await _first_matching(api, stream, f, seq) for f in filters])
        if matching in (seq, UNBOUNDED):
            return matching
        seq = next((s for s in pending if s >= matching), None)
    return UNBOUNDED


async def _first_matching(api: JetStreamApi, stream: str, subject: str, seq: int) -> int:
    """The sequence of the stream's first message at or after `seq` on `subject` (a filter;
    `UNBOUNDED`: none)."""
    try:
        return (await api.get_message(stream, seq, next_by_subject=subject)).seq
    except NotFound:
        return UNBOUNDED


class SeenConsumers:
    """The consumers a query reads as it last saw them, by (stream, name). A consumer created
    again since (deleted, then created by someone, or by a Go member healing itself) has the same
    name but delivers from its own start: what the old one delivered and the query committed
    comes again. Where the ledger's dedupe no longer holds those, they would be emitted twice.

    The sightings outlive the driver in the ledger's pointer (`stored`, `remember`), so a
    consumer created again while no query ran is told apart by the next run as well."""

    def __init__(self) -> None:
        self.sightings: dict[tuple[str, str], Sighting] = {}
        # As the query's previous driver last saw them, until this one has looked at them.
        self.remembered: dict[tuple[str, str], Sighting] = {}
        # Taken as created again since the previous driver saw them, until a batch's tasks are
        # told (`handed_started_over`): a batch that driver planned and this one runs again
        # may hold what the old consumer delivered, which the new one delivers a first time.
        self.started_over: set[tuple[str, str]] = set()
        # The consumers the previous driver saw, until a batch's tasks are told: created again
        # by then, they started over since that driver's sighting even when this driver saw
        # the old one first (one slot's look did, a sibling's saw the new one: seed 6791).
        self.inherited: set[tuple[str, str]] = set()
        # By consumer: the stream sequences a query on an earlier checkpoint acked above the
        # consumer's ack floor, whose entries were given back (removed from the ledger); each
        # until a sighting shows the floor past it. Kept in the pointer as well.
        self.acked_earlier: dict[tuple[str, str], frozenset[int]] = {}
        # As `acked_earlier`: what a new checkpoint's first batch will give back of ACKED
        # entries an earlier checkpoint's query left in the lineage (`expect_given_back`), until
        # it has (then in `acked_earlier`). Not kept in the pointer: the next driver reads it
        # from the ledger again.
        self.marks_to_come: dict[tuple[str, str], frozenset[int]] = {}
        # Created by the query where it chose (`place`) below `acked_earlier`, until judged at
        # their first look, which knows what a batch run again holds of the marks.
        self.placed_below: set[tuple[str, str]] = set()
        # The highest ledger revision the driver had read when it last sent for consumer infos
        # (`DriverLedger.revision`, set before each round of looks): what it stamps the
        # sightings it takes with (`Sighting.looked_after`).
        self.looks_after = 0
        # By consumer: the sighting a look replaced with that of a consumer created again,
        # which it took. What the old one delivered is judged by it (`marks_known_taken_through`).
        self.superseded: dict[tuple[str, str], Sighting] = {}

    def remember(self, stored: Mapping[str, Mapping[str, Sequence[Any]]]) -> None:
        """Take the sightings a previous driver of the query `stored` (the pointer's)."""
        self.remembered = sightings_of(stored)
        self.inherited = set(self.remembered)

    def stored(self) -> dict[str, dict[str, list[Any]]]:
        """By stream and name: [created, ack floor] of each consumer, as the pointer keeps them
        (a remembered one not looked at yet as it was remembered: it is still to be checked)."""
        seen = {**self.sightings, **self.remembered}
        return _by_stream({key: _stored(sighting) for key, sighting in seen.items()})

    def given_back(self, acked: Mapping[tuple[str, str], Collection[int]]) -> None:
        """Take what a give-back removes of entries that had acked (`ledger_protocol.Marks`):
        above a consumer's ack floor as last seen, a consumer created again that starts below it
        would deliver it again, which the ledger no longer drops."""
        for key, seqs in acked.items():
            if above := self._above_floor(key, seqs):
                self.acked_earlier[key] = self.acked_earlier.get(key, frozenset()) | above

    def expect_given_back(self, acked: Mapping[tuple[str, str], Collection[int]]) -> None:
        """Take what a give-back still to come will remove of entries that had acked
        (`ledger_protocol.marks_of`) as `marks_to_come`, as `given_back` takes it once done: a
        refusal before it advises a start past them, as one after it does."""
        self.marks_to_come = {}
        for key, seqs in acked.items():
            if above := self._above_floor(key, seqs):
                self.marks_to_come[key] = above

    def _above_floor(self, key: tuple[str, str], seqs: Collection[int]) -> frozenset[int]:
        """Of `seqs`, those above the consumer's ack floor as last seen."""
        before = self.last_seen(*key)
        return frozenset(seq for seq in seqs if seq > (before.ack_floor if before else 0))

    def restore_acked_earlier(self, stored: Mapping[str, Mapping[str, Sequence[Any]]]) -> None:
        """Take what the pointer keeps (`stored_acked_earlier`), with what was taken since."""
        self.given_back(
            {
                key: {seq for first, last in spans for seq in range(int(first), int(last) + 1)}
                for key, spans in _by_consumer(stored).items()
            }
        )

    def stored_acked_earlier(self) -> dict[str, dict[str, list[list[int]]]]:
        """`acked_earlier` by stream and name, as the pointer keeps it: [first, last] spans."""
        return _by_stream(
            {key: seq_spans(seqs) for key, seqs in sorted(self.acked_earlier.items())}
        )

    def marks(self, stream: str, name: str) -> frozenset[int]:
        """`acked_earlier` of the consumer, with its `marks_to_come`."""
        key = (stream, name)
        return self.acked_earlier.get(key, frozenset()) | self.marks_to_come.get(key, frozenset())

    def acked_through(self, stream: str, name: str) -> int:
        """The highest stream sequence of `acked_earlier` of the consumer (0: none)."""
        return max(self.marks(stream, name), default=0)

    def record(self, stream: str, name: str, info: ConsumerInfo, placed: bool = True) -> None:
        """A consumer the query found or (re)created itself: checked, and its identity kept.
        `placed`: the query created it where it chose, or judged it at planning (`look`), not
        one it found or took as it is, so a remembered sighting no longer applies, and the
        marks of `acked_earlier` its floor passed are forgotten."""
        check_config(stream, name, info.config)
        if placed:
            self.remembered.pop((stream, name), None)
        created = info.get("created") or ""
        looked_after = self.looks_after
        before = self.sightings.get((stream, name))
        if before is not None and before.created == created and before.looked_after:
            looked_after = max(looked_after, before.looked_after)
        self.sightings[stream, name] = Sighting(
            created, info.ack_floor_seq, info.delivered_consumer_seq, looked_after
        )
        # One found as it is keeps them: it may have been created again past them, to be judged
        # against a sighting this driver takes from the pointer later (a restarted checkpoint's
        # lineage, adopted after 4.2+'s `initialOffset`), for which they tell that what it
        # starts past was acked (seed 2550 of the worlds whose operator follows a refusal's
        # advice: the start it advised, past them, was refused as past a message never read).
        if not placed:
            return
        earlier = self.acked_earlier.pop((stream, name), frozenset())
        above = frozenset(seq for seq in earlier if seq > info.ack_floor_seq)
        if above:  # what this consumer acked it delivers not again
            self.acked_earlier[stream, name] = above

    def place(self, stream: str, name: str, info: ConsumerInfo) -> None:
        """Record a consumer the query just created where it chose (a static group's, at
        `startingPosition` or where a layout move puts it). It must start past what a query on
        an earlier checkpoint acked of it, as one created again must (`start_refusal`): those
        entries were given back, so nothing drops its deliveries of them; but for what a batch
        logged and run again holds of them, whose entries drop them. That is known as the batch
        runs again, after the consumer is created (Spark asks `initialOffset` first on 4.2+), so
        one below is judged at its first look, `placed_below`: as created again against a
        sighting a previous driver remembers (kept, as for one found: its refusal leaves it to
        the operator, and the next run judges it again), else by `_judge_placed`."""
        below = info.ack_floor_seq < self.acked_through(stream, name)
        if below:
            self.placed_below.add((stream, name))
        else:
            self.placed_below.discard((stream, name))
        self.record(stream, name, info, placed=not below)

    def skipped(self, stream: str, name: str, info: ConsumerInfo) -> range | None:
        """The stream sequences a consumer created again since it was last seen has acked or
        started past, above the ack floor the query saw (None when it was not created again;
        empty when it was `placed_below` what an earlier checkpoint's query acked, to judge
        against what the ledger holds of that). Read on, it delivers none of them: each must be
        one the query committed."""
        before = self.last_seen(stream, name)
        if before is not None and created_later(info.get("created") or "", before.created):
            return range(before.ack_floor + 1, info.ack_floor_seq + 1)
        if (stream, name) in self.placed_below:
            return range(info.ack_floor_seq + 1, info.ack_floor_seq + 1)
        return None

    def look(
        self,
        stream: str,
        name: str,
        info: ConsumerInfo,
        recreation: Recreation | None,
        skipped: Skipped = NOTHING_KNOWN,
    ) -> None:
        """Check a consumer seen at planning and keep it; `recreation`: how to go on when it was
        created again since it was last seen and cannot be read on exactly (None: a new one is
        exact, take it); `skipped`: what the query knows of the sequences it skips."""
        remembered = self.remembered.get((stream, name))
        before = self.last_seen(stream, name)
        created = info.get("created") or ""
        if recreation is not None and before is not None and created_later(created, before.created):
            earlier = self.marks(stream, name)
            harm = start_refusal(before, info, skipped, earlier)
            if harm is not None:
                when = "while the query was stopped" if remembered else "while the query ran"
                evidence = f"created {before.created}, now {created}; {MOVED_CREATION}"
                exact = harm.startswith(NO_EXACT_START)
                way_on = (
                    "" if exact else recreation.starting_by(skipped.replayed, skipped.committed)
                )
                raise consumer_created_again(stream, name, when, evidence, way_on, harm)
            log.info("%s > %s was created again past nothing the query did not read", stream, name)
            self.superseded.setdefault((stream, name), before)
            if (stream, name) in self.inherited:
                self.started_over.add((stream, name))
            if skipped.lost_ok and before.ack_floor + 1 < skipped.first_seq:
                log.warning(
                    "%s > %s was created again past stream sequences up to %d, which the stream "
                    "no longer holds, read or not; going on (failOnDataLoss=false)",
                    stream,
                    name,
                    skipped.first_seq - 1,
                )
        elif (stream, name) in self.placed_below:
            self._judge_placed(stream, name, info, skipped)
        self.placed_below.discard((stream, name))
        self.record(stream, name, info)

    def _judge_placed(self, stream: str, name: str, info: ConsumerInfo, skipped: Skipped) -> None:
        """Refuse a consumer `placed_below` what a query on an earlier checkpoint acked of it
        when the ledger does not hold all of that again (`skipped.committed`); the advised start
        is no later than what a batch run again holds (`skipped.replayed`)."""
        earlier = self.marks(stream, name)
        acked_through = unheld_through(earlier, skipped.committed)
        if info.ack_floor_seq < acked_through:
            way_on = restart_at(self.next_after_acked(stream, name), acked_earlier=earlier)
            start = info.ack_floor_seq + 1
            raise placed_past_acked(stream, name, start, acked_through, way_on, skipped)

    def handed_started_over(self) -> set[tuple[str, str]]:
        """The consumers `started_over`, now told to a batch's tasks (and forgotten: a batch
        this driver plans holds only what it delivered since)."""
        started_over, self.started_over = self.started_over, set()
        self.inherited = set()
        return started_over

    def next_after_acked(self, stream: str, name: str) -> int:
        """The stream sequence right after everything the consumer had acked when last seen and
        what a query on an earlier checkpoint acked above that (`acked_earlier`): a new consumer
        starting there reads nothing the query committed and settled, nor what that query acked
        (given back, its entries are gone), and what the query took after it is in the ledger,
        which drops its redeliveries. (Refused anyway when a sequence below it was neither:
        given back and not read again yet; no start is exact then.)"""
        before = self.last_seen(stream, name)
        floor = before.ack_floor if before else 0
        return max(floor, self.acked_through(stream, name)) + 1

    def marks_known_taken_through(
        self, key: tuple[str, str], earlier: Sighting | None
    ) -> int | None:
        """The ledger revision up to which an entry marked ACKED is known to have had its acks
        taken by the consumer `key` that delivered what it holds, as `earlier` (the sighting the
        query that wrote the entry kept) shows it; None: not known, every mark counts (a
        sighting of an earlier release, or none: an entry of a lineage retired since). A task
        sends an entry's acks, flushed, before it marks it ACKED, so a mark at or below a
        sighting's `looked_after` came before that look: the consumer was still the one seen.
        One created again since, an instant before the acks, ignored them (the server takes an
        ack only of what the consumer it reaches delivered), yet the entry was marked ACKED
        (seed 1586 of the simulation's worlds whose operator follows the advice: 12-13 of a
        committed batch, acked 9 ms after the recreation). This driver's own look at the same
        consumer (created alike) counts too."""
        if earlier is None or earlier.looked_after is None:
            return None
        mine = self.superseded.get(key) or self.sightings.get(key)
        if mine is not None and mine.created == earlier.created and mine.looked_after:
            return max(mine.looked_after, earlier.looked_after)
        return earlier.looked_after

    def last_seen(self, stream: str, name: str) -> Sighting | None:
        """As the previous driver remembered it until this one looked, else as this one saw it."""
        return self.remembered.get((stream, name)) or self.sightings.get((stream, name))


def sightings_of(
    stored: Mapping[str, Mapping[str, Sequence[Any]]],
) -> dict[tuple[str, str], Sighting]:
    """The sightings a pointer keeps (`SeenConsumers.stored`), by consumer."""
    return {
        key: Sighting(str(kept[0]), int(kept[1]), 0, int(kept[2]) if len(kept) > 2 else None)
        for key, kept in _by_consumer(stored).items()
    }


def _stored(sighting: Sighting) -> list[Any]:
    """[created, ack floor] of a sighting, and its `looked_after` when known, as the pointer
    keeps it."""
    kept: list[Any] = [sighting.created, sighting.ack_floor]
    if sighting.looked_after is not None:
        kept.append(sighting.looked_after)
    return kept


def _by_stream(by_consumer: Mapping[tuple[str, str], T]) -> dict[str, dict[str, T]]:
    """A map by (stream, name) as the pointer keeps it: by stream, then by name."""
    nested: dict[str, dict[str, T]] = {}
    for (stream, name), value in by_consumer.items():
        nested.setdefault(stream, {})[name] = value
    return nested


def _by_consumer(by_stream: Mapping[str, Mapping[str, T]]) -> dict[tuple[str, str], T]:
    """A map the pointer keeps by stream, then by name (`_by_stream`), by (stream, name)."""
    return {
        (stream, name): value
        for stream, names in by_stream.items()
        for name, value in names.items()
    }
