"""Driver side: the coordinator of batches, which the source's driver calls go to. It plans a
batch (it observes the consumers and the ledger's heads, hands the pure planner (`planner`) a
`SlotState` per slot, persists what it planned in the ledger's pointer and logs what changed),
hands out its input partitions, notes its commit and acks at stop. Its place is that of the
`KafkaOffsetReader` behind Spark's Kafka source, which asks Kafka for the offsets a batch ends
at; this one also decides what each slot takes. The acks of a committed batch go out from the
tasks of the next one (each slot acks its own before it pulls; a slot with nothing new gets an
ack-only partition), and from the driver only at stop: planning and commit cost the same
whatever the batches held.

Lives in Spark's long-running Python process for the query's driver; all state here is a cache
of what the consumers, the ledger and the checkpointed offsets hold, so a restarted driver
rebuilds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from nats_spark import clock
from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, NotFound, stream_missing
from nats_spark.jetstream.replies import ConsumerInfo, StreamInfo
from nats_spark.pcg.consumers import filters_of
from nats_spark.spark.group_source.driver.consumer_checks import (
    NOTHING_KNOWN,
    PlacedPastAcked,
    Skipped,
    first_own_unread,
    unread_by_either,
)
from nats_spark.spark.group_source.driver.consumer_listing import ConsumerListing
from nats_spark.spark.group_source.driver.driver_ledger import DriverLedger, entries_lost
from nats_spark.spark.group_source.driver.offsets import SourceOffset
from nats_spark.spark.group_source.driver.planner import (
    ConsumerSeen,
    SlotState,
    SlotTask,
    advances,
    horizons,
    lag_report,
    plan_batch,
    plan_tasks,
    readers_by_consumer,
    siblings,
    slots_report,
    unacked_by_consumer,
)
from nats_spark.spark.group_source.driver.presence import Presence
from nats_spark.spark.group_source.driver.sealed_keeper import SealedKeeper
from nats_spark.spark.group_source.driver.slot_packing import packed
from nats_spark.spark.group_source.driver.targets import Held, Slot, target_for
from nats_spark.spark.group_source.ledger import Bucket, Ledger, pointer_key
from nats_spark.spark.group_source.options import SourceOptions
from nats_spark.spark.group_source.runtime import PROCESS, Runtime
from nats_spark.spark.group_source.slot_partition import (
    ConsumerSighting,
    PackedSlots,
    SlotPartition,
)
from nats_spark.spark.shared.pacing import TriggerPacing

log = logging.getLogger(__name__)

# A task's earlier entries to drop redeliveries of (slot, first gen, last gen), and the highest
# stream sequence they hold.
Dedupe = tuple[tuple[tuple[str, int, int], ...], int]
NO_DEDUPE: Dedupe = ((), 0)

# Seconds an availableNow run waits, beyond a consumer's ack wait from its start, for what the
# consumer holds beyond this query's ledger (redeliveries arrive a little after the wait runs out).
REDELIVERY_GRACE = 2.0


class BatchCoordinator:
    """Plans batches, hands out their tasks, and acks them once Spark has committed them."""

    def __init__(self, options: SourceOptions, runtime: Runtime = PROCESS) -> None:
        self.options = options
        self.runtime = runtime
        self.reading = options.reading
        self.target = target_for(options)
        self.listing = ConsumerListing()
        self.client: NatsClient | None = None
        self.ledger = DriverLedger(
            options.stream,
            pointer_key(options.stream, options.group or options.consumer or ""),
            self.target.seen,
            runtime,
        )
        self.current: SourceOffset | None = None  # the last offset returned to Spark
        self.states: dict[str, SlotState] = {}  # every slot resolved, also ones since dropped
        self.resolved = False  # whether the target was resolved since this reader started
        self.available_now = False  # an availableNow run: its slots end at their `end_seq`
        # by slot, in an availableNow run: since when (`clock.monotonic`) its consumer shows
        # ack-pending messages beyond this query's ledger, until it shows none
        self.others_since: dict[str, float] = {}
        self.pacing = TriggerPacing(options.min_messages_per_trigger, options.max_trigger_delay)
        self.committed = 0  # newest gen of the adopted lineage known committed (acked at stop)
        self.keeping: tuple[SealedKeeper, asyncio.Future[None]] | None = None
        self.presence: Presence | None = None  # started once connected
        self.emptied: tuple[int, frozenset[str]] = (0, frozenset())  # a batch's slots with no task

    def _committed(self, offset: SourceOffset) -> None:
        """`offset`'s batch is committed (Spark plans a batch after it, or says so)."""
        if offset.lineage == self.ledger.lineage:
            self.committed = max(self.committed, offset.gen)

    async def _connect(self) -> NatsClient:
        if self.client is not None and not self.client.usable:
            log.warning("replacing the driver's NATS connection: its read loop ended")
            await self.client.discard()
            self.client = None
        if self.client is None:
            client = await NatsClient.open(self.options.connection)
            try:
                stream = await client.api.stream_info(self.options.stream)
            except NotFound:
                await client.close()
                raise stream_missing(
                    self.options.stream, self.options.connection.described()
                ) from None
            kv = await Ledger.bucket(
                client, self.options.ledger_bucket, create=True, replicas=stream.replicas
            )
            # Settled entries are removed later: a user not allowed to must hear it now, before
            # any message is taken (removing a key that never exists changes nothing).
            await kv.remove(f"{self.ledger.pointer_key}.removal-check")
            self.ledger.attach(kv)
            self.client = client
            if self.presence is None:
                self.presence = Presence(
                    self._client, self._kv, self.ledger.pointer_key, self.runtime.new_id
                )
                self.ledger.driver = self.presence.driver
                await self.presence.start()
        return self.client

    async def _resolve(self) -> list[Slot]:
        """What to read now (the target makes its consumers match its options); needs the
        ledger's heads loaded, which tell this query's own unacked messages from another
        client's."""
        client = await self._connect()
        if self.ledger.lineage is not None:
            await self.ledger.load_unacked_heads()
        unacked: dict[str, int] = {}
        for name, count in self.ledger.unacked():
            unacked[name] = unacked.get(name, 0) + count
        pins = self.ledger.last_query_pins | frozenset(self.ledger.pins.values())
        resolved = await self.target.resolve(client, Held(pins, unacked))
        given = {slot.name: slot for slot in resolved}
        states = {  # in the order known; a state is copied only where it changes
            name: known.revised(slot=given[name], readable=True)
            if name in given
            else known.revised(readable=False)
            for name, known in self.states.items()
        }
        for slot in resolved:
            if slot.name not in states:
                states[slot.name] = SlotState(slot, end_seq=0 if self.available_now else None)
        self.states = states
        self.resolved = True
        return resolved

    async def _adopt(self, offset: SourceOffset | None) -> None:
        """Take the lineage of `offset` (or of the stored pointer) and load its ledger entries."""
        client = await self._connect()
        if await self.ledger.adopt(offset):
            self.committed = 0  # what was committed is of another lineage
            await self.ledger.give_back_outlived(client)
            if not self.resolved:
                await self._resolve()

    async def initial_offset(self) -> SourceOffset:
        """A new lineage, when the checkpoint has no offsets yet. Spark may ask again: 4.0/4.1
        ask before every batch until one is committed, and only after their first
        `latestOffset()` (which has no start, and so began the lineage). Once this reader has
        handed out an offset, the answer is gen 0 of its lineage: a new one would orphan the
        batch planned in it and mix two lineages' committed gens."""
        await self._connect()
        if self.current is not None and self.current.lineage == self.ledger.lineage:
            # Nothing is committed in the checkpoint: the lineage's entries below its first
            # batch are an earlier checkpoint's, which that batch gives back.
            self.ledger.earlier_checkpoint_left = True
            return SourceOffset(self.current.lineage, 0)
        offset = SourceOffset.initial(self.runtime.new_id())
        log.info("%s: new query lineage %s", self.options.target, offset.lineage)
        self.ledger.forget_lineage()
        await self._adopt(offset)
        await self.ledger.clear_pins()
        self.current = offset
        return offset

    async def prepare_available_now(self) -> None:
        """Fix the end of an availableNow run: what the streams hold now (slots resolved later
        end at once)."""
        await self._adopt(None)
        client = await self._connect()
        self.available_now = True
        for name, state in self.states.items():
            info = await self._stream_info(client, state.slot.stream)
            self.states[name] = replace(state, end_seq=info.last_seq)

    async def latest_offset(self, start: SourceOffset | None, max_rows: int | None) -> SourceOffset:
        told = start is not None or self.current is not None  # the checkpoint's position
        await self._adopt(start)
        pins_before = dict(self.ledger.pins)
        if start is not None:
            self._committed(start)  # Spark 4.2+: `start` is committed
        client = await self._connect()
        resolved = await self._resolve()
        before = self.states
        try:
            await self._observe(client, resolved, judged=told)
        except ConfigurationError:  # refused: a consumer created again, say
            # The next start judges the consumers against the pointer's sightings: it must see
            # them as this driver did, whose refusal advises where to create one again (the
            # pointer's older floor made the next start refuse that consumer in turn, advising
            # an earlier start: seed 129 of the worlds whose operator follows the advice).
            if self.ledger.sightings_moved():
                await self.ledger.save_pointer()
            raise
        planned = plan_batch(
            self.options,
            self.states,
            max_rows,
            None if self.available_now else self.pacing.holds_back,
        )
        self.states = self._logged(before, planned.states)
        base = start or self.current
        if base is None or advances(planned.slots, self.ledger.has_sealed()):
            if planned.slots:
                self.pacing.batch_planned()
            self.ledger.expect(self.ledger.head_gen + 1, planned.slots, planned=True)
            tasks = self.options.max_tasks_per_batch or 0
            self.current = await self.ledger.new_offset(planned.slots, tasks)
        else:
            self.current = base
            if self.ledger.pins != pins_before or self.ledger.sightings_moved():
                await self.ledger.save_pointer()
        self._keep_sealed()
        return self.current

    async def _observe(self, client: NatsClient, resolved: list[Slot], judged: bool) -> None:
        """Look at the consumers of the `resolved` slots and at what the ledger holds of them
        into their states, then let the ledger forget the entries that settled; `judged`: see
        `_seen`."""
        first_seqs: dict[str, int] = {}
        unacked = unacked_by_consumer(
            {name: state.slot for name, state in self.states.items()}, self.ledger.unacked()
        )
        acked_first = self.ledger.committed_unacked(self.committed)
        self.target.seen.looks_after = self.ledger.revision  # before the infos are asked
        infos = await self.listing.infos(client, resolved, lambda s: self._consumer_info(client, s))
        with self._looking():
            for slot, info in zip(resolved, infos, strict=True):
                seen = await self._seen(client, slot, info, judged=judged)
                if await self._release_dead_pin(client, slot, seen):
                    info = await self._consumer_info(client, slot)
                    seen = await self._seen(client, slot, info, judged=judged)
                if self.ledger.entries and slot.stream not in first_seqs:  # else none to settle
                    stream = await self._stream_info(client, slot.stream)
                    first_seqs[slot.stream] = stream.first_seq
                ours = unacked(slot)
                self.states[slot.name] = self.states[slot.name].revised(
                    seen=seen,
                    own_pin=self.ledger.pins.get(slot.name),
                    ours=ours,
                    acked_first=acked_first.get(slot.name, 0),
                    others_due=self._others_due(slot.name, seen, ours),
                )
        await self.ledger.forget_settled(horizons(self.states.values(), first_seqs), self.committed)

    async def _release_dead_pin(self, client: NatsClient, slot: Slot, seen: ConsumerSeen) -> bool:
        """Unpin `slot`'s consumer when the server gives its pin to the target's last query
        (another checkpoint's) and that query's driver is dead (`Presence`: killed, it never
        released its pins), so this query need not wait out the priority timeout. A live one's
        pin is left alone: this query stands by, as a Go member would. An availableNow run, which
        would end without the slot's messages, waits until the record says which it is."""
        pin, owner, presence = seen.pinned, self.ledger.last_query_driver, self.presence
        if (
            pin is None
            or slot.priority_group is None
            or pin == self.ledger.pins.get(slot.name)
            or pin not in self.ledger.last_query_pins
            or presence is None
            or owner is None
            or owner == presence.driver
            or not await presence.is_dead(owner, until_sure=self.available_now)
        ):
            return False
        await client.api.unpin(slot.stream, slot.consumer, slot.priority_group)
        log.info(
            "%s: released the pin of %s > %s, held by a query that is gone",
            slot.name,
            slot.stream,
            slot.consumer,
        )
        return True

    def _others_due(self, name: str, seen: ConsumerSeen, ours: int) -> float:
        """An availableNow run's seconds left to wait for what slot `name`'s consumer holds
        beyond this query's ledger (`ours`): an earlier query's deliveries (given back at the
        first batch, they come at once) or a killed attempt's unrecorded ones (back once their
        ack wait runs out: at most an ack wait after they were first seen). A live client that
        holds them longer is waited for no longer than that."""
        if not self.available_now or seen.ack_pending <= ours:
            self.others_since.pop(name, None)
            return 0.0
        now = clock.monotonic()
        since = self.others_since.setdefault(name, now)
        return max(since + seen.ack_wait + REDELIVERY_GRACE - now, 0.0)

    def _logged(
        self, before: dict[str, SlotState], after: dict[str, SlotState]
    ) -> dict[str, SlotState]:
        """Log what planning made of the slots: a standby once it starts, a consumer's small
        capacity once per query (it stays in progress for as long as it holds)."""
        for name, state in after.items():
            was = before.get(name)
            if not state.readable:
                continue
            if state.status == "standby" and (was is None or was.status != "standby"):
                slot = state.slot
                log.warning(
                    "%s: another client holds the pin of %s > %s; standing by until it is "
                    "released or times out",
                    name,
                    slot.stream,
                    slot.consumer,
                )
            if state.warning is not None and not state.capacity_logged:
                log.warning("%s", state.warning)
                after[name] = replace(state, capacity_logged=True)
        return after

    def _keep_sealed(self, ack_waits: Sequence[float] = ()) -> None:
        """Start the `SealedKeeper` once the consumers' ack waits are known (planning looked at
        them all; a re-run batch's `partitions` at those it pulls from, `ack_waits`), and keep
        it at the shortest (a re-run batch may not pull from them all)."""
        if self.client is None:
            return
        seen = [state.seen.ack_wait for state in self.states.values() if state.seen is not None]
        ack_wait = min((*seen, *ack_waits), default=None) or self.options.ack_wait
        if self.keeping is None:
            keeper = SealedKeeper(self._client, self.ledger, ack_wait)
            self.keeping = keeper, asyncio.ensure_future(keeper.run())
        elif ack_wait < self.keeping[0].wait:
            self.keeping[0].shorten(ack_wait)

    def _client(self) -> NatsClient:
        assert self.client is not None
        return self.client

    def _kv(self) -> Bucket:
        assert self.ledger.kv is not None
        return self.ledger.kv

    async def _stream_info(self, client: NatsClient, stream: str) -> StreamInfo:
        try:
            return await client.api.stream_info(stream)
        except NotFound:
            raise self._stream_gone(stream) from None

    def _stream_gone(self, stream: str) -> ConfigurationError:
        return ConfigurationError(
            f"stream {stream!r} was deleted while the query read {self.options.target}; "
            "recreate it (and the group), then restart the query with a new checkpoint"
        )

    async def _look(self, client: NatsClient, slot: Slot) -> ConsumerSeen:
        """What `slot`'s consumer shows now."""
        return await self._seen(client, slot, await self._consumer_info(client, slot))

    async def _consumer_info(self, client: NatsClient, slot: Slot) -> ConsumerInfo:
        """`slot`'s consumer's info; a vanished one is healed first, where it may be. Planning
        asks for all slots' at once (a round trip each, one after the other, was most of its
        time at many slots)."""
        try:
            return await client.api.consumer_info(slot.stream, slot.consumer)
        except NotFound as error:
            if error.stream_missing:
                raise self._stream_gone(slot.stream) from None
            await self.target.heal(client, slot)
            return await client.api.consumer_info(slot.stream, slot.consumer)

    async def _seen(
        self,
        client: NatsClient,
        slot: Slot,
        info: ConsumerInfo,
        logged: int = 0,
        judged: bool = True,
    ) -> ConsumerSeen:
        """`info` checked by the target (its config, and that the consumer was not created
        again since, or safely so), as planning uses it, or as batch `logged` runs again.
        `judged` False: a look before Spark told the driver its checkpoint (4.0/4.1's first
        `latestOffset()` of an availableNow run, before `setLatestSeenOffset`), which knows
        neither what the query committed nor what a batch run again holds, so it would refuse
        a consumer created where a refusal said, holding what that batch holds as never read
        again, and advise a start past the batch (seed 280 of the worlds whose operator follows
        the advice: a purge then took it, and the batch failed on `DataLoss` at every run). It
        leaves a consumer created again unjudged (its sighting remembered) to the first look
        that knows: the batch's run again (`_look_unseen`), or the next planning."""
        seen = self.target.seen
        if judged or seen.skipped(slot.stream, slot.consumer, info) is None:
            skipped = await self._skipped(client, slot, info, logged)
            try:
                self.target.look(slot, info, skipped)
            except PlacedPastAcked:
                # The query created it (`SeenConsumers.place`): deleted, the next run creates
                # it again where it is told; left, it would be taken as it is, judged no more.
                with contextlib.suppress(NotFound):
                    await client.api.delete_consumer(slot.stream, slot.consumer)
                raise
        return ConsumerSeen(
            pending=info.num_pending,
            ack_pending=info.num_ack_pending,
            ack_floor=info.ack_floor_seq,
            pinned=info.pinned_id(slot.priority_group) if slot.priority_group else None,
            delivered_seq=info.delivered_seq,
            max_ack_pending=info.max_ack_pending,
            ack_wait=info.ack_wait,
        )

    @contextlib.contextmanager
    def _looking(self) -> Iterator[None]:
        """Around a round of looks at consumers (`_seen`): the ledger then notes those taken as
        created again at the gen planned last, once for the round. Also when a look refused one:
        the pointer written after the refusal (`latest_offset`, or `close`) keeps the sightings
        of those taken before it, and must keep that they started over (the next driver takes
        them as seen: `DriverLedger.started_over`)."""
        try:
            yield
        finally:
            self.ledger.note_started_over(self.target.seen.started_over)

    async def _skipped(
        self, client: NatsClient, slot: Slot, info: ConsumerInfo, logged: int
    ) -> Skipped:
        """What this query knows of the stream sequences `slot`'s consumer skips, when it was
        created again since it was last seen, or placed by the query below what a query on an
        earlier checkpoint acked (`SeenConsumers.skipped`), and of those below what
        a query on an earlier checkpoint acked (`acked_earlier`): read from the ledger and the
        stream only then. What the query committed through its other consumers of the
        stream counts as read: a message has one subject, so one a sibling partition delivered
        is not in this consumer's filter (seed 97 of the worlds on nats-server 2.11-2.12 whose
        operator follows a refusal's advice: another partition's message, purged, was refused
        as lost). Nor is what the consumer's filter does not match (`first_own_unread`: seed 46
        of those worlds refused a partition's consumer for another partition's message, not
        committed yet); the stream's first sequence is read after that ask. So does what batch
        `logged`, run again now, holds: it replays it, and its entries drop what the consumer
        delivers of it again (a refusal's advice names the first of it: `Recreation`). Before a
        new checkpoint's first batch gave back what an earlier checkpoint's query left in the
        lineage (4.0/4.1's availableNow judges at `reportLatestOffset`, before it), what that
        query acked counts as the marks the give-back keeps (`SeenConsumers.marks_to_come`), not
        as held: its advice was refused again once the give-back had kept them (seed 767 of the
        worlds whose operator follows the advice: --deliver 5, then --deliver 7)."""
        seen = self.target.seen
        skipped = seen.skipped(slot.stream, slot.consumer, info)
        if skipped is None or self.target.recreation(slot) is None:
            return NOTHING_KNOWN
        seen.expect_given_back(await self.ledger.earlier_acked())
        marked = seen.marks(slot.stream, slot.consumer)
        within = range(skipped.start, max(skipped.stop, max(marked, default=0) + 1))
        if not within:
            return NOTHING_KNOWN
        slots = [
            state.slot.name for state in self.states.values() if state.slot.stream == slot.stream
        ]
        emitted, replayed = await self.ledger.held_seqs(slots, within, self.committed, logged)
        committed = emitted | replayed
        unread = unread_by_either(skipped, committed, marked)
        filters = filters_of(info.config)
        own_from = await first_own_unread(client.api, slot.stream, filters, unread)
        first_seq = (await self._stream_info(client, slot.stream)).first_seq
        lost_ok = not self.reading.fail_on_data_loss
        return Skipped(committed, first_seq, lost_ok, own_from, replayed=frozenset(replayed))

    async def partitions(self, start: SourceOffset, end: SourceOffset) -> list[SlotPartition]:
        """The tasks of batch `end`; `start` is committed (Spark plans a batch only after the
        one before it committed). Spark 4.0/4.1 also call `partitions(latest, latest)` on a
        restart (`setLatestSeenOffset`), before the logged batch `latest` is committed or even
        re-run: that call only adopts the checkpoint's lineage, or the batch would be acked
        early."""
        await self._adopt(end)
        self.ledger.note_layout(start)
        self.ledger.note_layout(end)
        if start == end:
            if self.current is None or self.current.lineage != end.lineage:
                self.current = end  # the checkpoint's lineage: `initial_offset` answers in it
            return []
        if start.gen == 0:  # a checkpoint's first batch, or its re-run after a restart
            await self._give_back_earlier(start, end)
        self._committed(start)
        # A batch whose start is of another lineage (Spark 4.0/4.1 can ask `initialOffset` of a
        # restarted reader before it learns the logged batch) has nothing committed in `end`'s.
        committed = start.gen if start.lineage == end.lineage else 0
        await self.ledger.load_missing_heads()
        if committed:
            await self._check_kept(start)
        due = self.ledger.acks_due(committed)
        moved: dict[str, int | None] = {}
        for name in end.slots:
            if self._moved(name):
                head = self.ledger.head_of(end.gen, name)
                moved[name] = None if head is None else head.count
        known = {name: slot for name in {*end.slots, *due} if (slot := self._known_slot(name))}
        plan = plan_tasks(end.slots, due, moved, known)
        self.emptied = (end.gen, frozenset(plan.emptied))
        for name in plan.emptied:
            log.info("batch %d: slot %s is no longer read and took nothing", end.gen, name)
        for name in plan.driver_acks:  # a slot of a reader count the query no longer has
            await self.ledger.ack_through(await self._connect(), committed, name)
        # In the tasks' order, not a set's (which follows the process's string hashes): the
        # driver reads the entries' heads in the order it expected them.
        handed = dict.fromkeys(task.slot for task in plan.tasks if task.slot in end.slots)
        self.ledger.hand_out(end.gen, handed.keys())
        pulled = [known[task.slot] for task in plan.tasks if task.limit]
        looked = await self._look_unseen(pulled, end.gen)
        if pulled:  # a re-run batch's seals are kept from now on, not from the next planning
            self._keep_sealed([seen.ack_wait for seen in looked.values()])
        pulling = {slot.stream for slot in pulled}
        dedupes = {stream: self._dedupe(stream, end.gen) for stream in pulling}
        readers = readers_by_consumer(self.states, end.slots)
        started_over = self.target.seen.handed_started_over()
        started_over |= self.ledger.started_over_before(end.gen, committed)
        layouts = self.ledger.handed_layouts()
        return [
            self._input_partition(
                known[t.slot], end, t, dedupes, readers, started_over, looked, layouts
            )
            for t in plan.tasks
        ]

    async def _look_unseen(self, slots: list[Slot], gen: int) -> dict[str, ConsumerSeen]:
        """By slot name: the consumers of `slots` that this driver has not looked at yet, looked
        at now (a batch run again after a restart, planned by the driver before, comes without
        a `latestOffset` before it). Their tasks keep what they take for the consumer's ack
        wait, not the option's (seed 782 of the worlds with another client: a 4 s wait kept
        every 10 s), and check deliveries against the consumer as last seen (`_sighting`); one
        created again while the query was stopped is refused, or taken, here first; and the
        driver's `SealedKeeper` keeps what they seal for that wait (a re-run batch's sealed
        entries waited unkept for the next planning: seed 230). What batch `gen` holds counts
        as read (`_skipped`)."""
        remembered = self.target.seen.remembered
        unseen = [
            slot
            for slot in slots
            if (state := self.states.get(slot.name)) is None
            or state.seen is None
            or (slot.stream, slot.consumer) in remembered
        ]
        if not unseen:
            return {}
        client = await self._connect()
        self.target.seen.looks_after = self.ledger.revision  # before the infos are asked
        infos = await self.listing.infos(client, unseen, lambda s: self._consumer_info(client, s))
        with self._looking():
            return {
                slot.name: await self._seen(client, slot, info, gen)
                for slot, info in zip(unseen, infos, strict=True)
            }

    async def input_partitions(
        self, start: SourceOffset, end: SourceOffset
    ) -> list[SlotPartition] | list[PackedSlots]:
        """What Spark gets: a partition per slot (`partitions`), or with `end.tasks` set, the
        slots packed into that many tasks at most (`slot_packing`)."""
        slots = await self.partitions(start, end)
        return packed(end, slots) if end.tasks else slots

    def _moved(self, name: str) -> bool:
        """Whether slot `name` is of a layout the query has since left (not read now)."""
        state = self.states.get(name)
        return self.resolved and (state is None or not state.readable)

    async def _check_kept(self, committed: SourceOffset) -> None:
        """Stop when entries of the `committed` batch that the protocol kept are gone (expired,
        removed by someone else, the bucket recreated) while their messages may still be
        unacked: their redeliveries would be emitted a second time. Every task of the batch
        that could take messages created its entry; not one that had no task (a slot of a
        layout left since: emptied)."""
        emptied = self.emptied[1] if self.emptied[0] == committed.gen else frozenset()
        created = [
            name
            for name, plan in committed.slots.items()
            if plan.limit > 0 and name not in emptied and not self._moved(name)
        ]
        gone = await self.ledger.missing(committed.gen, created)
        if not gone:
            return
        client = await self._connect()
        unsafe = []
        with self._looking():
            for name in gone:  # what no delivery is pending of can come back no more
                slot = self._known_slot(name)
                if slot is None or (await self._look(client, slot)).ack_pending:
                    unsafe.append(name)
        if not unsafe:
            return
        lost = entries_lost(self.options.ledger_bucket, committed.gen, unsafe)
        if self.reading.fail_on_data_loss:
            raise lost
        log.warning("%s; going on at-least-once (failOnDataLoss=false)", lost)

    async def _give_back_earlier(self, start: SourceOffset, first: SourceOffset) -> None:
        """What an earlier checkpoint's query took is not this one's to dedupe or ack: the
        lineages this one replaced (4.2+ ask `initialOffset` first, which replaces the stored
        lineage; the pointer names them until they are given back, should the driver die before
        this batch), and on 4.0/4.1, which plan a checkpoint's first batch in the stored lineage
        before they ask, that lineage's gens before the first batch."""
        client = await self._connect()
        if start.lineage == first.lineage and first.gen > 1:
            await self.ledger.give_back_before(client, first.gen)
        await self.ledger.give_back_replaced(client)
        # What that query acked is kept as marks now (`SeenConsumers.given_back`).
        self.ledger.earlier_checkpoint_left = False
        self.target.seen.marks_to_come = {}

    def _known_slot(self, name: str) -> Slot | None:
        if name in self.states:
            return self.states[name].slot
        try:
            return self.target.slot_named(name)
        except StopIteration:
            return None

    def _input_partition(
        self,
        slot: Slot,
        end: SourceOffset,
        task: SlotTask,
        dedupes: dict[str, Dedupe],  # by stream, of the streams pulled from
        readers: dict[str, tuple[str, ...]],
        started_over: set[tuple[str, str]],  # consumers created again since the batch's planning
        looked: dict[str, ConsumerSeen],  # consumers of slots this driver saw first just now
        layouts: Mapping[int, Mapping[str, int]],  # where the batches' heads are kept
    ) -> SlotPartition:
        """The input partition of `slot` in batch `end`: what it may take (0: it only acks),
        what it acks first, and the earlier entries whose redeliveries it drops."""
        options, name, states = self.options, slot.name, self.states
        dedupe, dedupe_through = dedupes[slot.stream] if task.limit else NO_DEDUPE
        state = states.get(name)
        seen = looked.get(name) or (state.seen if state is not None else None)
        waits = state is not None and seen is not None and seen.ack_pending > state.ours
        return SlotPartition(
            reading=self.reading,
            pointer_key=self.ledger.pointer_key,
            lineage=end.lineage,
            gen=end.gen,
            slot=name,
            stream=slot.stream,
            consumer=slot.consumer,
            priority_group=slot.priority_group,
            member=slot.member,
            partitioned=slot.partitioned,
            limit=task.limit,
            pin_id=self.ledger.pins.get(name),
            committed=task.acks,
            dedupe=dedupe,
            dedupe_through=dedupe_through,
            ack_wait=options.ack_wait if seen is None else seen.ack_wait,
            siblings=siblings(readers, slot),
            redelivery_wait=state.others_due if waits and state is not None else 0.0,
            consumer_sighting=self._sighting(slot, started_over) if task.limit else None,
            layouts=layouts,
        )

    def _dedupe(self, stream: str, gen: int) -> Dedupe:
        """The earlier entries whose redeliveries a task reading `stream` in batch `gen` drops,
        and the highest sequence they hold: the same for every slot of the stream, so worked out
        once a batch (per slot, planning grew with the square of the slots)."""
        states = self.states
        same_stream = {
            other
            for _, other in self.ledger.entries
            if other not in states or states[other].slot.stream == stream
        }
        spans = self.ledger.dedupe_spans(gen, same_stream)
        return spans, self.ledger.highest_seq(spans)

    def _sighting(self, slot: Slot, started_over: set[tuple[str, str]]) -> ConsumerSighting | None:
        """What `slot`'s task checks its deliveries against to tell a consumer deleted and
        created again while the batch is read (the driver tells it only at the next planning,
        after the batch emitted what the new consumer delivered again), and whether it was
        created again since the batch was planned (`started_over`: seeds 632 and 1650 of the
        worlds with the recreation emitted twice what an earlier run's sibling took)."""
        recreation = self.target.recreation(slot)
        if recreation is None:
            return None
        seen = self.target.seen.last_seen(slot.stream, slot.consumer)
        if seen is None:
            return None
        again = (slot.stream, slot.consumer) in started_over
        return ConsumerSighting(seen.ack_floor, seen.delivered, recreation, seen.created, again)

    async def ack_through(self, gen: int) -> int:
        """Ack every sealed entry of batches up to `gen` (all committed by Spark); returns count."""
        await self._adopt(None)
        assert self.client is not None
        return await self.ledger.ack_through(self.client, gen)

    async def commit(self, end: SourceOffset) -> None:
        """Only noted: the next batch's tasks ack `end`'s messages (or the driver at stop)."""
        await self._adopt(end)
        self._committed(end)

    def report(self) -> dict[str, Any]:
        """Per-slot lag and pin state, for Spark's progress (`reportLatestOffset`); a slot of
        the partition layout names the member that owns its partition."""
        report: dict[str, Any] = {"target": self.options.target}
        if self.target.layout is not None:
            report["layout"] = self.target.layout.value
        if self.target.warning is not None:
            report["warning"] = self.target.warning
        report["members"] = slots_report(self.states.values())
        report["lag"] = lag_report(self.states.values())
        return report

    async def close(self) -> None:
        """At stop: ack what committed batches left (no next batch will), then disconnect."""
        await self.listing.close()
        if self.keeping is not None:
            keeper, keeping = self.keeping
            keeper.stop()  # never cancelled: it may be inside a flush
            await keeping
            self.keeping = None
        if self.client is not None:
            if self.committed and self.ledger.lineage is not None:
                try:
                    await self.ack_through(self.committed)
                except Exception as error:  # the next start acks them: stop must still finish
                    log.warning("acks at stop failed (the next start sends them): %s", error)
            await self._release_pins(self.client)
            if self.presence is not None:
                try:
                    await self.presence.stop()
                except Exception as error:  # the next driver on the target removes it
                    log.warning("removing the query's presence record failed: %s", error)
                self.presence = None
            await self.client.close()
            self.client = None

    async def _release_pins(self, client: NatsClient) -> None:
        """At stop: unpin the slots whose pin the server still gives this query, so that who
        reads them next (this query restarted, one on a new checkpoint, another instance of
        the member) need not wait out the priority timeout. A pin the server gives another
        instance is left alone; a restart that still names the released pin is refused it
        once (423) and asks for a new one."""
        try:
            if self.ledger.lineage is not None:
                await self.ledger.load_unacked_heads()  # the pins the last batch's tasks took
            for name, pin in sorted(self.ledger.pins.items()):
                state = self.states.get(name)
                group = None if state is None else state.slot.priority_group
                if state is None or group is None:
                    continue
                slot = state.slot
                info = await client.api.consumer_info(slot.stream, slot.consumer)
                if info.pinned_id(group) == pin:
                    await client.api.unpin(slot.stream, slot.consumer, group)
                    log.info("%s: released the pin of %s > %s", name, slot.stream, slot.consumer)
        except Exception as error:  # the pins then time out (priority_timeout): stop finishes
            log.warning("releasing the pins at stop failed: %s", error)
