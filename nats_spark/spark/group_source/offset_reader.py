"""Driver side: offsets and the planning of input partitions; the ledger's entries are the
`DriverLedger`'s. The acks of a committed batch go out from the tasks of the next one (each slot
acks its own before it pulls; a slot with nothing new gets an ack-only partition), and from the
driver only at stop: planning and commit cost the same whatever the batches held.

Lives in Spark's long-running Python process for the query's driver; all state here is a cache
of what the consumers, the ledger and the checkpointed offsets hold, so a restarted driver
rebuilds it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError, NotFound, stream_missing
from nats_spark.jetstream.replies import StreamInfo
from nats_spark.spark.group_source.driver_ledger import DriverLedger, Horizon
from nats_spark.spark.group_source.ledger import Ledger, pointer_key
from nats_spark.spark.group_source.offsets import MemberPlan, SourceOffset
from nats_spark.spark.group_source.planner import (
    ConsumerLag,
    SlotState,
    apply_limit,
    lag_report,
    plan_slot,
    small_capacity,
)
from nats_spark.spark.group_source.sealed_keeper import SealedKeeper
from nats_spark.spark.group_source.slot_partition import SlotPartition
from nats_spark.spark.group_source.targets import Held, Slot, target_for
from nats_spark.spark.shared.options import SourceOptions
from nats_spark.spark.shared.pacing import TriggerPacing

log = logging.getLogger(__name__)


class OffsetReader:
    """Plans batches and acks them once Spark has committed them."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.target = target_for(options)
        self.client: NatsClient | None = None
        self.ledger = DriverLedger(
            options.stream, pointer_key(options.stream, options.group or options.consumer or "")
        )
        self.current: SourceOffset | None = None  # the last offset returned to Spark
        self.slots: dict[str, Slot] = {}  # every slot seen, also ones since dropped
        self.readable: set[str] | None = None  # the slots the last resolve gave to read
        self.states: dict[str, SlotState] = {}
        self.warned: set[str] = set()  # slots whose consumer's small capacity was logged
        self.available_now_seq: dict[str, int] | None = None
        self.pacing = TriggerPacing(options.min_messages_per_trigger, options.max_trigger_delay)
        self.planned: dict[str, int] = {}  # by slot: what the batch planned last may take
        self.committed = 0  # newest gen of the lineage known committed (acked at stop)
        self.keeping: tuple[asyncio.Event, asyncio.Future[None]] | None = None

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
        return self.client

    async def _resolve(self) -> list[Slot]:
        """What to read now (the target settles its consumers); needs the ledger's heads
        loaded, which tell this query's own unacked messages from another client's."""
        client = await self._connect()
        if self.ledger.lineage is not None:
            await self.ledger.load_unacked_heads()
        unacked: dict[str, int] = {}
        for entry in self.ledger.unacked():
            assert entry.head is not None
            unacked[entry.slot] = unacked.get(entry.slot, 0) + entry.head.count
        pins = self.ledger.last_query_pins | frozenset(self.ledger.pins.values())
        resolved = await self.target.resolve(client, Held(pins, unacked))
        self.readable = {slot.name for slot in resolved}
        for slot in resolved:
            self.slots[slot.name] = slot
        return resolved

    async def _adopt(self, offset: SourceOffset | None) -> None:
        """Take the lineage of `offset` (or of the stored pointer) and load its ledger entries."""
        await self._connect()
        if await self.ledger.adopt(offset) and self.readable is None:
            await self._resolve()

    async def initial_offset(self) -> SourceOffset:
        """A new lineage, when the checkpoint has no offsets yet. Spark may ask more than once
        before the first batch: the same lineage answers until a batch is planned in it."""
        await self._connect()
        started = self.current
        if started is not None and started.gen == 0 and self.ledger.head_gen == 0:
            return started
        offset = SourceOffset.initial()
        log.info("%s: new query lineage %s", self.options.target, offset.lineage)
        self.ledger.forget_lineage()
        self.committed = 0
        await self._adopt(offset)
        await self.ledger.clear_pins()
        self.current = offset
        return offset

    async def prepare_available_now(self) -> None:
        """Fix the end of an availableNow run: what the streams hold now."""
        await self._adopt(None)
        client = await self._connect()
        self.available_now_seq = {}
        for slot in self.slots.values():
            info = await self._stream_info(client, slot.stream)
            self.available_now_seq[slot.name] = info.last_seq

    async def latest_offset(self, start: SourceOffset | None, max_rows: int | None) -> SourceOffset:
        await self._adopt(start)
        pins_before = dict(self.ledger.pins)
        if start is not None:
            self._committed(start)  # Spark 4.2+: `start` is committed
        client = await self._connect()
        resolved = await self._resolve()
        first_seqs: dict[str, int] = {}
        plans: dict[str, MemberPlan] = {}
        for slot in resolved:
            was = self.states[slot.name].status if slot.name in self.states else None
            state = await self._observe(client, slot)
            if slot.stream not in first_seqs:
                info = await self._stream_info(client, slot.stream)
                first_seqs[slot.stream] = info.first_seq
            plan = self._plan_slot(slot, state, was)
            if plan is not None:
                plans[slot.name] = plan
        await self.ledger.settle(self._horizons(first_seqs), self.committed)
        available = sum(p.limit for p in plans.values())
        if self.available_now_seq is None and self.pacing.holds_back(available):
            plans = {}
        budgets = [v for v in (max_rows, self.options.max_messages_per_trigger) if v]
        plans = apply_limit(plans, min(budgets, default=None))
        base = start or self.current
        self.planned = {name: plan.limit for name, plan in plans.items()}
        if plans or self.ledger.has_sealed() or base is None:
            if plans:
                self.pacing.batch_planned()
            self.ledger.expect(self.ledger.head_gen + 1, plans)
            self.current = await self.ledger.new_offset(plans)
        else:
            self.current = base
            if self.ledger.pins != pins_before:
                await self.ledger.save_pointer()
        self._keep_sealed()
        return self.current

    def _keep_sealed(self) -> None:
        """Start the `SealedKeeper` once the consumers' ack waits are known."""
        if self.keeping is None and self.client is not None:
            ack_wait = min((s.ack_wait for s in self.states.values()), default=None)
            keeper = SealedKeeper(self._client, self.ledger, ack_wait or self.options.ack_wait)
            done = asyncio.Event()
            self.keeping = done, asyncio.ensure_future(keeper.run(done))

    def _client(self) -> NatsClient:
        assert self.client is not None
        return self.client

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

    async def _observe(self, client: NatsClient, slot: Slot) -> SlotState:
        try:
            info = await client.api.consumer_info(slot.stream, slot.consumer)
        except NotFound as error:
            if error.stream_missing:
                raise self._stream_gone(slot.stream) from None
            await self.target.heal(client, slot)
            info = await client.api.consumer_info(slot.stream, slot.consumer)
        pinned = info.pinned_id(slot.priority_group) if slot.priority_group else None
        state = SlotState(
            pending=info.num_pending,
            ack_pending=info.num_ack_pending,
            ack_floor=info.ack_floor_seq,
            pinned=pinned,
            delivered_seq=info.delivered_seq,
            max_ack_pending=info.max_ack_pending,
            ack_wait=info.ack_wait,
        )
        self.states[slot.name] = state
        return state

    def _ours_unacked(self, slot: Slot) -> int:
        """Messages of this slot's consumer that our ledger holds and that are not acked yet."""
        return sum(
            e.head.count
            for e in self.ledger.unacked()
            if e.head is not None and self.slots.get(e.slot, slot).consumer == slot.consumer
        )

    def _plan_slot(self, slot: Slot, state: SlotState, was: str | None) -> MemberPlan | None:
        """`plan_slot`, with what the log should say: a standby once it starts, a consumer's
        small capacity once per query (it stays in progress for as long as it holds)."""
        plan = plan_slot(
            self.options,
            slot,
            state,
            self._ours_unacked(slot),
            self.ledger.pins.get(slot.name),
            None if self.available_now_seq is None else self.available_now_seq.get(slot.name, 0),
        )
        if state.status == "standby" and was != "standby":
            log.warning(
                "%s: another client holds the pin of %s > %s; standing by until it is released "
                "or times out",
                slot.name,
                slot.stream,
                slot.consumer,
            )
        state.warning = small_capacity(self.options, slot, state)
        if state.warning is not None and slot.name not in self.warned:
            self.warned.add(slot.name)
            log.warning("%s", state.warning)
        return plan

    def _horizons(self, first_seqs: dict[str, int]) -> dict[str, Horizon]:
        """By slot: its consumer's ack floor (durable consumers only) and its stream's start."""
        horizons = {}
        for name, slot in self.slots.items():
            state = self.states.get(name)
            floor = state.ack_floor if state and slot.durable else 0
            horizons[name] = Horizon(floor, first_seqs.get(slot.stream, 0))
        return horizons

    async def partitions(self, start: SourceOffset, end: SourceOffset) -> list[SlotPartition]:
        await self._adopt(end)
        self._committed(start)
        await self.ledger.load_missing_heads()
        due = self.ledger.acks_due(start.gen)
        partitions = []
        for name, plan in sorted(end.members.items()):
            slot = self.slots.get(name) or self.target.slot_named(name)
            limit = plan.limit
            if self.readable is not None and name not in self.readable:
                # Planned in a layout the query has since moved from (before a restart): only
                # what its ledger entry recorded may come back; without one nothing was emitted.
                recorded = self.ledger.recorded(end.gen, name)
                if recorded is None:
                    log.info("batch %d: slot %s is no longer read and took nothing", end.gen, name)
                    if name not in due:
                        continue
                limit = 0 if recorded is None else recorded.count
            self.ledger.expect(end.gen, [name])
            partitions.append(self._partition(slot, end, limit, due.get(name, ())))
        for name in sorted(set(due) - set(end.members)):
            known = self._known_slot(name)
            if known is None:  # a slot of a reader count the query no longer has
                await self.ledger.ack_through(await self._connect(), start.gen, name)
                continue
            partitions.append(self._partition(known, end, 0, due[name]))
        return partitions

    def _known_slot(self, name: str) -> Slot | None:
        if name in self.slots:
            return self.slots[name]
        try:
            return self.target.slot_named(name)
        except StopIteration:
            return None

    def _partition(
        self, slot: Slot, end: SourceOffset, limit: int, acks: tuple[int, ...]
    ) -> SlotPartition:
        """The input partition of `slot` in batch `end`: what it may take (0: it only acks),
        what it acks first, and the earlier entries whose redeliveries it drops."""
        options, name = self.options, slot.name
        same_stream = [
            other
            for _, other in self.ledger.entries
            if other not in self.slots or self.slots[other].stream == slot.stream
        ]
        dedupe = self.ledger.dedupe_spans(end.gen, same_stream) if limit else ()
        return SlotPartition(
            connection=options.connection,
            ledger_bucket=options.ledger_bucket,
            lineage=end.lineage,
            gen=end.gen,
            slot=name,
            stream=slot.stream,
            consumer=slot.consumer,
            priority_group=slot.priority_group,
            member=slot.member,
            partitioned=slot.partitioned,
            limit=limit,
            pin_id=self.ledger.pins.get(name),
            committed=acks,
            dedupe=dedupe,
            dedupe_through=self.ledger.highest_seq(dedupe),
            fetch_batch_size=options.fetch_batch_size,
            fetch_timeout=options.fetch_timeout,
            include_headers=options.include_headers,
            fail_on_data_loss=options.fail_on_data_loss,
            min_pending=options.min_pending,
            min_ack_pending=options.min_ack_pending,
            priority=options.priority,
            ack_wait=self.states[name].ack_wait if name in self.states else options.ack_wait,
            siblings=tuple(
                other
                for other in sorted(end.members)
                if other != name
                and other in self.slots
                and self.slots[other].consumer == slot.consumer
            ),
        )

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
        report["members"] = {
            name: {
                "pending": s.pending,
                "ackPending": s.ack_pending,
                "status": s.status,
                **({"member": member} if (member := self._owner(name)) != name else {}),
                **({"warning": s.warning} if s.warning else {}),
            }
            for name, s in sorted(self.states.items())
        }
        report["lag"] = self._lag()
        return report

    def _lag(self) -> dict[str, Any]:
        """`lag_report` over the slots read last (each consumer once)."""
        consumers: dict[tuple[str, str], list[str]] = {}
        for name in sorted(self.states if self.readable is None else self.readable):
            slot = self.slots.get(name)
            if slot is not None and name in self.states:
                consumers.setdefault((slot.stream, slot.consumer), []).append(name)
        lags = []
        for names in consumers.values():
            slot = self.slots[names[0]]
            lags.append(
                ConsumerLag(
                    owner=slot.member or slot.consumer,
                    state=self.states[names[0]],
                    ours=self._ours_unacked(slot),
                    planned=sum(self.planned.get(name, 0) for name in names),
                )
            )
        return lag_report(lags)

    def _owner(self, name: str) -> str | None:
        slot = self.slots.get(name)
        return slot.member if slot is not None and slot.member is not None else name

    async def close(self) -> None:
        """At stop: ack what committed batches left (no next batch will), then disconnect."""
        if self.keeping is not None:
            done, keeping = self.keeping
            done.set()  # never cancelled: it may be inside a flush
            await keeping
            self.keeping = None
        if self.client is not None:
            if self.committed and self.ledger.lineage is not None:
                try:
                    await self.ack_through(self.committed)
                except Exception as error:  # the next start acks them: stop must still finish
                    log.warning("acks at stop failed (the next start sends them): %s", error)
            await self.client.close()
            self.client = None
