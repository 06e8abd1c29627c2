"""One schedule: a world (stream, consumers, ledger bucket, checkpoint, sink) drawn from a seed,
a chaotic phase (publishing, query runs of one Spark version that crash, fail, stop and restart,
tasks killed and lost, lost compare-and-set answers, sink failures, stalls past the ack
wait), then a quiet one (no faults: the query runs until the stream is idle, then stops), and
the invariants (`invariants.py`) checked throughout and at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import logging
import random
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa
from nats.js.errors import KeyWrongLastSequenceError

from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.spark.group_source import ledger_protocol
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator
from nats_spark.spark.group_source.driver.consumer_checks import (
    NOTHING_KNOWN,
    SeenConsumers,
    Skipped,
)
from nats_spark.spark.group_source.driver.targets import Held, Slot
from nats_spark.spark.group_source.ledger import Ledger, TakenOver
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.group_source.packed_heads import task_layouts
from nats_spark.spark.group_source.runtime import Runtime, SeenEntries
from nats_spark.spark.group_source.slot_partition import (
    UNBOUNDED,
    PackedSlots,
    Recreation,
    SlotPartition,
)
from nats_spark.spark.group_source.task.slot_reader import (
    SlotReader,
    packed_batches,
    slot_batches,
)
from tests.memory_bucket import MemoryBucket, sections_written, unpacked
from tests.simulation.invariants import Observed, live_leftovers
from tests.simulation.jetstream import (
    FLUSH_INTERVAL,
    GROUP,
    STREAM,
    WHOLE_STREAM,
    Consumer,
    Delivery,
    Server,
    SimClient,
    Stream,
)
from tests.simulation.lateness import GiveBacks
from tests.simulation.other_client import OtherClient
from tests.simulation.scheduler import Chaos, Crashed, Participant, Scheduler, run
from tests.simulation.spark import (
    AVAILABLE_NOW,
    PROCESSING,
    V40,
    V42,
    Checkpoint,
    EarlyStop,
    Query,
    counted_by_spark,
)

_T = TypeVar("_T")
SLOTS = 2
KEYS = 3  # per slot
REPLACED_MID_BATCH = 0.3  # the chance a batch's run is stopped, in the worlds that replace it


@dataclass(frozen=True)
class Setup:
    """What a seed draws before the schedule starts."""

    version: str
    ack_wait: float
    messages: int
    max_ack_pending: int
    per_batch: int  # maxMessagesPerPartition
    fetch_batch: int
    chaos: Chaos
    lost_answer: float  # chance a compare-and-set write answers as a conflict
    sink_failure: float
    trigger_interval: float  # of processingTime runs: how often an idle query looks again
    shared: bool  # both slots read one overflow consumer (siblings), not a partition each
    packed: bool = False  # a run's override: both slots read by one task (maxTasksPerBatch=1)
    new_checkpoint: float = 0.0  # chance a query run starts on a new checkpoint
    speculation: float = 0.0  # spark.speculation: a task's copy after this many seconds (0: off)
    chaos_waits: float = 8.0  # how long the chaotic phase lasts, in ack waits
    # The server's faults (drawn apart, `draw_hostility`, so the draws above stay the seed's):
    restart_after_acks: float = 0.0  # chance a server restart follows a round of acks
    server_restarts: int = 3  # at most, per schedule (a run's override, never drawn)
    purges: bool = False  # an operator purges what every consumer acked, now and then
    # Settings the source must refuse or survive, never drawn (a run's override):
    max_deliver: int = 0  # the consumers' max_deliver (0: none)
    recreate_consumer: bool = False  # a consumer is deleted and created again (DeliverAll)
    # A family of worlds, never drawn (a run's override): executors that pause, short and long
    # (`stalling_executors`).
    stalling_executors: bool = False
    # A family of worlds, never drawn (a run's override, with `shared`): another client reads
    # the overflow consumer beside the query (`other_client.py`).
    other_client: bool = False
    # A family of worlds, never drawn (a run's override): a query run is often stopped while a
    # batch's tasks run, and then replaced at once by one on a new checkpoint (an operator who
    # restarts the query from scratch while the old one's executors still work).
    replaced_mid_batch: bool = False
    # A family of worlds, never drawn (a run's override): the server's restarts are unclean and
    # bring back about half of the ledger bucket's keys removed before (lost tombstones).
    removals_return: bool = False
    # A family of worlds, never drawn (a run's override): nats-server 2.11-2.12, whose new
    # consumer reports its ack floor as 0 until its first delivery is acked.
    floor_from_zero: bool = False
    # An operator's edit, never drawn (a run's override): when the query refuses a consumer
    # created again, the operator does what the refusal says (creates it again where it says,
    # restarts the query), up to twice; the query must then read on.
    follows_advice: bool = False
    # A family of worlds, never drawn (a run's override): before a batch's full read, a job of
    # the user's reads some of its tasks and Spark stops each after its first rows
    # (foreachBatch's `isEmpty()`, `limit(n)`, `take`: `Query._stopped_early`).
    early_stops: bool = False
    # A run's override, never drawn: per scheduling point of an attempt Spark lost that runs
    # on, the chance its executor is killed (`Chaos.dying_zombies`; 0: never).
    dying_zombies: float = 0.0
    # A run's override, never drawn: the longest the answer to a task attempt's request to the
    # ledger bucket takes on top of the scheduler's delays, in ack waits (a bucket far from the
    # executors, or a busy server; 0: none). Each answer's time is drawn apart (with the server's
    # faults).
    slow_ledger: float = 0.0
    # A family of worlds, never drawn (a run's override, with `replaced_mid_batch`): a task
    # attempt of a run stopped mid-batch whose pull the server refused (423: the stopped
    # driver's close unpinned the consumer) sends its next pull once, and it reaches the server
    # a third of this to all of it late, in seconds (the old executors' link is slow): the
    # replacing run's give-back may come meanwhile, and that pull bring back what it NAKed.
    late_after_refusal: float = 0.0
    # A run's override, never drawn (with `replaced_mid_batch`): a stop mid-batch pauses the
    # processes of the batch's attempts still running, each for up to this share of the ack
    # wait (executors loaded, as when an operator restarts a query from scratch; 0: none).
    paused_by_the_stop: float = 0.0
    # A run's override, never drawn: each task attempt runs in a new executor process (dynamic
    # allocation), which has read no entry yet (`SeenEntries`): its dedupe reads them all.
    fresh_executors: bool = False
    # A run's override, never drawn: the answer to a task attempt's compare-and-set write that
    # `lost_answer` loses comes (as a conflict: the retry's) up to this many ack waits late, each
    # drawn from the server's faults (the request timed out before the client sent it again;
    # 0: at once). Meanwhile others may read and write what it wrote.
    lost_answers_late: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random) -> Setup:
        faulty = rng.random() < 0.85
        return cls(
            version=rng.choice((V40, V42)),
            ack_wait=rng.choice((4.0, 30.0)),
            messages=rng.randint(6, 30),
            max_ack_pending=rng.choice((3, 8, 1000)),
            per_batch=rng.choice((2, 5, 50)),
            fetch_batch=rng.choice((1, 3, 16)),
            chaos=Chaos(
                driver_crash=rng.choice((0.0, 0.003, 0.01, 0.03)) if faulty else 0.0,
                task_crash=rng.choice((0.0, 0.005, 0.02)) if faulty else 0.0,
                task_lost=rng.choice((0.0, 0.005, 0.02)) if faulty else 0.0,
                stall=rng.choice((0.0, 0.002, 0.01)) if faulty else 0.0,
                crashes=rng.randint(1, 4),
            ),
            lost_answer=rng.choice((0.0, 0.02, 0.1)) if faulty else 0.0,
            sink_failure=rng.choice((0.0, 0.05, 0.2)) if faulty else 0.0,
            trigger_interval=rng.choice((1.0, 3.0, 10.0)),
            shared=rng.random() < 0.25,
        )


def draw_hostility(rng: random.Random) -> dict[str, Any]:
    """The server's faults of a seed: restarts that lose the acks of the last 100 ms (targeted:
    one may follow a round of acks, within that window) and purges that move the stream's
    first sequence."""
    return {
        "restart_after_acks": rng.choice((0.0, 0.0, 0.02, 0.1)),
        "purges": rng.random() < 0.3,
    }


def stalling_executors(setup: Setup, rng: random.Random) -> Setup:
    """`setup` in the family of worlds whose executors pause (a GC, a host paused): Spark gives
    up on an attempt whose executor sent no heartbeat for `spark.network.timeout` (two minutes
    by default: ack waits), so such an attempt stalls for ack waits and then runs on beside
    what its retry did meanwhile (committed, acked and settled its batch, or a query on a new
    checkpoint gave its lineage back); their pauses time requests out, so answers to the
    ledger's writes are lost more often; runs start on a new checkpoint often. Drawn apart
    (`rng`), so the schedule's own draws stay the seed's."""
    chaos = replace(
        setup.chaos,
        task_lost=rng.choice((0.01, 0.03)),
        lost_stall=rng.choice((4.0, 8.0)),
        crashes=max(setup.chaos.crashes, 2),
    )
    return replace(
        setup,
        chaos=chaos,
        lost_answer=rng.choice((0.1, 0.2)),
        new_checkpoint=rng.choice((0.0, 0.3, 0.5)),
    )


class SimBucket:
    """A participant's handle on the ledger bucket: every call is a scheduling point. Each
    method hands back `_call`'s coroutine itself (one coroutine less per call, at every step
    of it); the ledger awaits each at once."""

    def __init__(
        self,
        store: MemoryBucket,
        sched: Scheduler,
        latency: Callable[[], float] | None = None,
        lost_late: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        self.sched = sched
        self.latency = latency  # how long each answer takes to come back (None: no time)
        # how late a write's answer the world lost comes, as a conflict (None: at once)
        self.lost_late = lost_late
        self.name = store.name
        # The checker's: told of each request that passed its scheduling point (it went out;
        # its caller's death before that point keeps it from the server), and of each that took
        # effect or was refused (its caller may die before its answer comes).
        self.sent: list[Callable[[str], None]] = []
        self.landed: list[Callable[[str], None]] = []

    async def _call(
        self, what: str, call: Callable[[], Awaitable[_T]], heads: Sequence[str] = ()
    ) -> _T:
        """`heads`: the keys of the heads a write of a packed key writes (`sections_written`),
        told to the checker as writes of their own keys: sent as it goes out, landed once it
        took effect (a refused one is sent again, on the revision read since)."""
        await self.sched.point(what)
        told_as = [what, *(f"kv update {head}" for head in heads)]
        for told in self.sent:
            for said in told_as:
                told(said)
        try:
            try:
                result = await call()
            finally:
                took = [what, *told_as[1:]] if heads and self._took(what) else [what]
                for told in self.landed:
                    for said in took:
                        told(said)
        except KeyWrongLastSequenceError:
            if self.lost_late is not None and (late := self.lost_late()):
                await self.sched.sleep(late)
            raise
        if self.latency is not None:  # the request took effect; its answer is on its way
            await self.sched.sleep(self.latency())
        await self.sched.point(f"{what}: answered")
        return result

    def _took(self, what: str) -> bool:
        """Whether the write `what` names (a packed key's) is the key's newest, just landed."""
        key = what.removeprefix("kv update ")
        return self.store.last_seq == self.store.values.get(key, (b"", 0))[1]

    def get(self, key: str) -> Awaitable[Any]:
        return self._call(f"kv get {key}", lambda: self.store.get(key))

    def create(self, key: str, value: bytes) -> Awaitable[int]:
        return self._call(f"kv create {key}", lambda: self.store.create(key, value))

    def update(self, key: str, value: bytes, last: int) -> Awaitable[int]:
        heads = sections_written(self.store.revisions, key, value, last)
        return self._call(f"kv update {key}", lambda: self.store.update(key, value, last), heads)

    def put(self, key: str, value: bytes) -> Awaitable[int]:
        return self._call(f"kv put {key}", lambda: self.store.put(key, value))

    def remove(self, key: str) -> Awaitable[None]:
        return self._call(f"kv remove {key}", lambda: self.store.remove(key))

    def keys_matching(self, pattern: str) -> Awaitable[list[str]]:
        return self._call(f"kv keys {pattern}", lambda: self.store.keys_matching(pattern))

    # The bucket's configuration: looked at and changed once, by a driver's first adopt, before
    # it writes; no scheduling point, so the schedules are those of a bucket without max age.

    def max_age(self) -> Awaitable[float]:
        return self.store.max_age()

    def clear_max_age(self) -> Awaitable[None]:
        return self.store.clear_max_age()


class Target:
    """The group's slots, fixed: a partition per slot, each with its own consumer, or a plain
    consumer read by every slot; its consumers checked as the source's targets check them
    (`SeenConsumers`: refused under `max_deliver`, and once created again while a query ran)."""

    layout = None
    warning = None

    def __init__(self, slots: list[Slot], consumers: list[Consumer]) -> None:
        self.slots = slots
        self.consumers = {consumer.name: consumer for consumer in consumers}
        self.seen = SeenConsumers()

    async def resolve(self, client: Any, held: Held) -> list[Slot]:
        """Checks each consumer once per driver, as a target's first resolve does with its
        info (read here without a scheduling point, so the schedules stay what they were)."""
        for name, consumer in self.consumers.items():
            if (STREAM, name) not in self.seen.sightings:
                info = ConsumerInfo(consumer.identity())
                self.seen.record(STREAM, name, info, placed=False)
        return self.slots

    def slot_named(self, name: str) -> Slot:
        return next(slot for slot in self.slots if slot.name == name)

    def look(self, slot: Slot, info: ConsumerInfo, skipped: Skipped = NOTHING_KNOWN) -> None:
        self.seen.look(slot.stream, slot.consumer, info, self.recreation(slot), skipped)

    def recreation(self, slot: Slot) -> Recreation:
        """The advice of the source's targets (`next_after_acked`), in the form the world's
        operator follows (`ADVICE`)."""
        start = self.seen.next_after_acked(slot.stream, slot.consumer)
        return Recreation(
            f"recreate {slot.consumer} with --deliver ",
            start,
            ", then restart the query",
            self.seen.marks(slot.stream, slot.consumer),
        )


ADVICE = re.compile(r"recreate (\S+) with --deliver (\d+), then restart the query")
# What an advice says to keep in the stream until the query has committed it.
KEPT = re.compile(r"keep stream sequences ([\d, -]+) \(do not purge them\)")
# A refusal of a consumer created again past a message gone from the stream, which the query
# cannot tell of another subject (`consumer_checks.start_refusal`).
GONE_UNREAD = re.compile(
    r"stream sequence (\d+), which the query never read, is gone from the stream"
)


@dataclass
class World:
    setup: Setup
    sched: Scheduler
    stream: Stream = field(default_factory=Stream)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    bucket: MemoryBucket = field(default_factory=MemoryBucket)
    quiet: bool = False
    side: random.Random = field(default_factory=random.Random)  # draws apart from the schedule's
    faults: random.Random = field(default_factory=random.Random)  # the server's faults, apart
    ids: random.Random = field(default_factory=random.Random)  # lineages', drivers', attempts'
    other: random.Random = field(default_factory=random.Random)  # another client's draws

    def __post_init__(self) -> None:
        setup = self.setup
        waits, capacity = setup.ack_wait, setup.max_ack_pending
        if setup.shared:  # a plain priority-group consumer read by two slots
            self.consumers = [
                Consumer(
                    "c",
                    WHOLE_STREAM,
                    self.stream,
                    waits,
                    capacity,
                    False,
                    setup.max_deliver,
                    setup.floor_from_zero,
                )
            ]
            self.slots = [
                Slot(f"c#{i}", STREAM, "c", GROUP, "overflow", None, False, readers=SLOTS)
                for i in range(SLOTS)
            ]
            target = {"consumer": "c", "numPartitions": str(SLOTS)}
        else:  # a partitioned group's partitions, a consumer each
            self.consumers = [
                Consumer(
                    f"g-partition-{p}",
                    f"S.p{p}.",
                    self.stream,
                    waits,
                    capacity,
                    True,
                    setup.max_deliver,
                    setup.floor_from_zero,
                )
                for p in range(SLOTS)
            ]
            self.slots = [
                Slot(f"partition-{p}", STREAM, c.name, GROUP, "pinned_client", "m1", False)
                for p, c in enumerate(self.consumers)
            ]
            target = {"group": "g", "ackWait": str(setup.ack_wait)}
        self.server = Server(self.sched, self.consumers, self.stream)
        self.server.after_acks = self._maybe_restart
        self.restarts = setup.server_restarts
        self.reading_done = False  # the last run has stopped: other clients stop too
        self.stopped = False  # the last run was stopped while a batch's tasks ran
        self.recreated = False  # whether the operator deleted a consumer and created it again
        # the operator followed a refusal's advice since the last recreation or new checkpoint
        self.advised = False
        self.advice_followed = 0
        # The stream's first sequence when the operator last followed a refusal's advice.
        self.first_seq_advised = 0
        # Stream sequences an advice followed said to keep in the stream (unpurged) until the
        # query has committed them (`Recreation.starting_by`).
        self.kept: set[int] = set()
        self.restarting = False  # the last run was refused and the operator followed its advice
        self.driver: Participant | None = None  # the last query run's
        self.runs: dict[Participant, Query] = {}  # each query run's, by its driver
        self.sent_late: set[Participant] = set()  # attempts whose pull `late_after_refusal` held
        self.answer_lost_to: Participant | None = None  # the writer of the last answer lost
        self.observed = Observed(
            self.stream,
            key_order=not setup.shared,
            give_backs=GiveBacks(self.sched, self.bucket, self.stream, self.consumers),
            who=self.sched.current,
            now=lambda: self.sched.now,
            stalls=self.sched.stalls,
        )
        # What the source takes from its process, this world's own: ids the same on every run
        # of the seed, a worker's memory of entries, a give-back the invariants watch.
        self.runtime = Runtime(
            new_id=lambda: uuid.UUID(int=self.ids.getrandbits(128), version=4).hex,
            seen_entries=SeenEntries(),
            give_back=self.observed.give_backs.watch(ledger_protocol.give_back),
        )
        self.server.on_ack.append(self.observed.acked)
        self.server.on_ack.append(lambda consumer, seq: self.sched.note(f"acks {seq}"))
        self.options = parse_options(
            {
                "servers": "nats://127.0.0.1:1",
                "stream": STREAM,
                **target,
                "maxMessagesPerPartition": str(setup.per_batch),
                "fetchBatchSize": str(setup.fetch_batch),
                **({"maxTasksPerBatch": "1"} if setup.packed else {}),
            }
        )
        self.bucket.lost_answer = self._lost_answer
        # Made with a max age (an operator's, or the previous release's 7 days made short),
        # which the first driver removes: while it stayed, keys would expire mid-run.
        self.bucket.expire_after = setup.ack_wait
        self.trigger_interval = setup.trigger_interval

    @property
    def sink_failure(self) -> float:
        return 0.0 if self.quiet else self.setup.sink_failure

    @property
    def stopped_mid_batch(self) -> float:
        """The chance a query run is stopped while a batch's tasks run (they run on)."""
        if self.setup.replaced_mid_batch and not self.quiet:
            return REPLACED_MID_BATCH
        return self.sink_failure / 2

    @property
    def stops_within(self) -> float:
        """How long after its tasks started a batch may be stopped: in the worlds whose
        stopped query is replaced at once, while its tasks still pull and record."""
        return self.setup.ack_wait / (20 if self.setup.replaced_mid_batch else 2)

    def _lost_answer(self, key: str) -> bool:
        if self.quiet or self.sched.rng.random() >= self.setup.lost_answer:
            return False
        self.sched.note(f"the answer to the write of {key} is lost (it was retried)")
        self.answer_lost_to = self.sched.current()
        return True

    def lost_answer_late(self, attempt: Participant) -> float:
        """How late the conflict answering `attempt`'s write comes when the world lost that
        write's answer (`Setup.lost_answers_late`), else 0."""
        if self.answer_lost_to is not attempt:
            return 0.0
        self.answer_lost_to = None
        return self.faults.uniform(0.0, self.setup.lost_answers_late) * self.setup.ack_wait

    def _maybe_restart(self) -> None:
        """After a round of acks: maybe a server restart within the window its store misses."""
        if self.quiet or not self.restarts or self.faults.random() >= self.setup.restart_after_acks:
            return
        self.restarts -= 1
        delay = self.faults.uniform(0.0, 1.5 * FLUSH_INTERVAL)
        self.sched.loop.call_later(delay, self._restart)

    def _restart(self) -> None:
        self.sched.note("the server restarts: acks of the last 100 ms, the pins lost")
        self.server.restart()
        if self.setup.removals_return:
            back = self.bucket.bring_back(self._brought_back)
            self.observed.brought_back.update(back)
            if back:
                self.sched.note(f"the restart brings back removed ledger keys: {', '.join(back)}")

    def _brought_back(self, revisions: int) -> int | None:
        """Which revision of a removed key an unclean restart brings back: none half the time,
        else the newest, or (a third of those) one it had pushed out."""
        if self.faults.random() < 0.5:
            return None
        return self.faults.randrange(revisions) if self.faults.random() < 1 / 3 else -1

    async def operate(self) -> None:
        """An operator's doings in the chaotic phase: purges of what every consumer acked, and
        a consumer deleted and created again while a query runs, at any point of it (a batch's
        task that reads the new one stops, the driver refuses to plan on once it sees it, and a
        driver that never saw it leaves it to the next run's)."""
        setup, sched = self.setup, self.sched
        recreate_at = self.faults.uniform(0.2, 0.8) * setup.chaos_waits * setup.ack_wait
        while not self.quiet:
            await sched.sleep(self.faults.uniform(0.5, 2.0) * setup.ack_wait)
            if self.quiet:  # the last run's faults ended while this slept
                break
            if setup.purges:
                first = self.server.purge_acked(self._keep_from())
                sched.note(f"purge: the stream's first sequence is {first}")
            if setup.recreate_consumer and sched.now >= recreate_at and self._query_runs():
                consumer = self.consumers[0]
                sched.note(f"consumer {consumer.name} deleted and created again (DeliverAll)")
                consumer.start_over(sched.now)
                self.recreated, self.advised = True, False
                recreate_at = float("inf")

    def _start_other_client(self) -> None:
        """Another client of the shared overflow consumer, until the last run has stopped."""
        assert self.setup.shared, "another client reads the plain consumer: shared worlds only"
        consumer = self.consumers[0]

        def took(seq: int, earlier: list[Delivery], again: Callable[[], bool]) -> None:
            self.observed.taken_by_another(seq, earlier, consumer.ack_wait, again)

        other = OtherClient(self.sched, self.server, consumer, self.other, took)
        self.observed.others.add(other.start(lambda: self.reading_done))

    def _keep_from(self) -> int:
        """The first stream sequence an advice followed said to keep that the live checkpoint
        has not committed yet: a purge stops below it (`UNBOUNDED`: none)."""
        self.kept -= set(self.observed.in_sinks[-1])
        return min(self.kept, default=UNBOUNDED)

    def _query_runs(self) -> bool:
        return self.driver is not None and not self.driver.finished.done()

    def bucket_view(
        self,
        latency: Callable[[], float] | None = None,
        lost_late: Callable[[], float] | None = None,
    ) -> SimBucket:
        return SimBucket(self.bucket, self.sched, latency, lost_late)

    def _task_ledger_latency(self) -> float:
        """How long the answer to a task attempt's ledger request takes (`slow_ledger`)."""
        return self.faults.uniform(0.0, self.setup.slow_ledger) * self.setup.ack_wait

    def new_driver(self) -> BatchCoordinator:
        reader = BatchCoordinator(self.options, self.runtime)
        reader.client = SimClient(self.sched, self.server)  # type: ignore[assignment]
        reader.ledger.attach(self.bucket_view())
        reader.target = Target(self.slots, self.consumers)  # type: ignore[assignment]
        reader.ledger.seen = reader.target.seen  # kept in the pointer, as the source's target's
        return reader

    async def task(
        self, partition: SlotPartition | PackedSlots, stop: EarlyStop | None = None
    ) -> list[int]:
        """One task attempt (of a slot, or of packed slots): Spark's `read`, its rows' stream
        sequences. A packed task's rows must leave slot by slot, in its slots' order. One that
        Spark `stop`s early is closed at the yield after its last rows Spark took, as
        `slot_reader._drive` is when its worker's next write finds the socket closed."""
        client = SimClient(self.sched, self.server)
        attempt = self.sched.current()
        assert attempt is not None  # a task attempt's participant
        client.late_after_refusal = lambda: self.late_after_refusal(attempt)
        slots = partition.slots if isinstance(partition, PackedSlots) else (partition,)
        runtime = self.runtime
        if self.setup.fresh_executors:
            runtime = replace(runtime, seen_entries=SeenEntries())
        readers = [
            SlotReader(slot, client, runtime)  # type: ignore[arg-type]
            for slot in slots
        ]
        latency = self._task_ledger_latency if self.setup.slow_ledger else None
        late = self.setup.lost_answers_late
        lost_late = partial(self.lost_answer_late, attempt) if late else None
        # One ledger for the attempt's slots, as `packed_task` has (a packed batch's heads share
        # its task's key); a copy each, whose methods the checker wraps for its own slot.
        lineage = slots[0].lineage if slots else ""
        ledger = Ledger(self.bucket_view(latency, lost_late), lineage, task_layouts(slots))
        for reader in readers:
            reader.entry.ledger = copy.copy(ledger)
            self.observed.attempts.watch(attempt, reader.entry)
            self.observed.attempts.watch_give_backs(attempt, reader)
        packed = isinstance(partition, PackedSlots)
        steps = packed_batches(readers) if packed else slot_batches(readers[0])
        batches = steps if packed else _named(readers[0].partition.slot, steps)
        rows: list[int] = []
        order = [slot.slot for slot in slots]
        at = handed = 0
        stopped = False  # by Spark, early
        try:
            async for slot, batch in batches:
                if order.index(slot) < at:
                    self.observed.problem(
                        "packed rows out of order", f"rows of {slot} after those of {order[at]}"
                    )
                at = max(at, order.index(slot))
                if stop is not None and handed == stop.after:
                    stopped = True  # Spark took its rows and closed the socket: this write fails
                    break
                rows += batch.column("stream_seq").to_pylist()
                await self.sched.point("rows handed to Spark")
                handed += 1
                if stop is not None and handed == stop.after:
                    stop.taken()  # the job's task is done; the worker goes on to its next write
        # Alive, it ends with the sealed entry instead; a zombie's failure harms nothing (seed
        # 898 of the worlds of started-over-only-against-the-pointer: an attempt whose driver
        # died while it paused failed in its take-over's claim once a retry took the entry).
        except TakenOver as error:
            if counted_by_spark(attempt):
                problem = "an attempt failed as another took its entry over"
                self.observed.problem(problem, str(error))
            raise
        if stopped:
            self.sched.note("Spark stopped reading early: the attempt is closed")
            await steps.aclose()
            await batches.aclose()
        return rows

    def late_after_refusal(self, attempt: Participant) -> float:
        """How late `attempt`'s pull sent after one refused for a stale pin reaches the server
        (`Setup.late_after_refusal`): once, in a run stopped mid-batch."""
        longest = self.setup.late_after_refusal
        run = self.runs.get(attempt.parent) if attempt.parent is not None else None
        if not longest or run is None or not run.stopping or attempt in self.sent_late:
            return 0.0
        self.sent_late.add(attempt)
        return self.sched.rng.uniform(longest / 3, longest)

    async def publish(self, count: int, over: float) -> None:
        rng = self.sched.rng
        for _ in range(count):
            await self.sched.sleep(rng.expovariate(count / over))
            slot, key = rng.randrange(SLOTS), rng.randrange(KEYS)
            seq = self.stream.publish(f"S.p{slot}.k{key}", self.sched.now)
            self.sched.note(f"publish {seq} on S.p{slot}.k{key}")
            self.server.serve()

    async def main(self) -> None:
        setup, sched = self.setup, self.sched
        chaos_time = setup.chaos_waits * setup.ack_wait
        ticking = asyncio.Event()
        server = asyncio.ensure_future(self.server.run(ticking))
        publishing = asyncio.ensure_future(self.publish(setup.messages, chaos_time * 0.7))
        if setup.purges or setup.recreate_consumer:
            asyncio.ensure_future(self.operate())
        if setup.other_client:
            self._start_other_client()
        runs, replaced = 0, False
        while sched.now < chaos_time or not publishing.done():
            runs += 1
            # An operator who followed a refusal's advice restarts the query, on its checkpoint:
            # an advice bounded by what a batch not committed holds is for its run again. A new
            # checkpoint later gives that batch back, and what it held is no longer read again,
            # so the start advised may be refused then (seed 425), which is no wrong advice.
            new = runs > 1 and (replaced or self.side.random() < setup.new_checkpoint)
            if new and not self.restarting:
                self.advised = False
                self.checkpoint = Checkpoint()
                self.observed.new_checkpoint()
                sched.note("a new checkpoint: the next run starts without offsets")
            trigger = sched.rng.choice((PROCESSING, PROCESSING, AVAILABLE_NOW))
            stop_at = sched.now + sched.rng.uniform(0.5, 4) * setup.ack_wait
            if await self.run_query(runs, trigger, stop_at):
                return
            # Stopped mid-batch in these worlds, the query is replaced at once by one on a new
            # checkpoint, whose give-back meets the stopped run's tasks still recording.
            replaced = setup.replaced_mid_batch and self.stopped
            if not replaced:
                await sched.sleep(sched.rng.uniform(0, setup.ack_wait))
        self.quiet = True
        sched.chaos.enabled = False
        sched.note("quiet: no more faults; the query runs until the stream is idle")
        runs += 1
        while True:
            if await self.run_query(runs, PROCESSING, float("inf"), quiet=True):
                return
            if not self.restarting:
                break
            runs += 1  # refused, and the operator followed its advice: the query restarts
        self.reading_done = True
        ticking.set()
        await server
        self.observed.check_quiet(self.consumers)
        self.observed.check_ledger_quiet(unpacked(self.bucket.values))
        self.observed.check_live_lineage(
            unpacked(self.bucket.values), self.checkpoint.committed_gen()
        )

    async def run_query(
        self, number: int, trigger: str, stop_at: float, quiet: bool = False
    ) -> bool:
        """Run the query once; whether the source refused to read on (the schedule ends)."""
        query = Query(self, self.setup.version, trigger, stop_at)
        participant = self.sched.spawn(f"driver#{number}", "driver", self._drive(query, quiet))
        self.driver = participant
        self.runs[participant] = query
        self.observed.query_run(participant)
        self.sched.note(f"query run {number}: Spark {self.setup.version}, {trigger}")
        with contextlib.suppress(Crashed):
            await participant.finished
        self.observed.run_ended(participant)
        self.stopped = query.stopping
        self.restarting = False
        if query.refusal is None:
            return False
        if self.advised and ADVICE.search(query.refusal) and not self._gone_before(query.refusal):
            self.observed.problem("refused again once its advice was followed", query.refusal)
        self.observed.refused(query.refusal, self.consumers, self.recreated)
        self.restarting = self._follow_advice(query.refusal)
        return not self.restarting

    def _follow_advice(self, refusal: str) -> bool:
        """As an operator who reads the refusal (`follows_advice`): create the consumer again
        where it says, to restart the query; whether the schedule goes on."""
        advice = ADVICE.search(refusal)
        if not self.setup.follows_advice or advice is None or self.advice_followed >= 2:
            return False
        if "failOnDataLoss" in refusal:  # messages are gone: no consumer brings them back
            return False
        name, start = advice.group(1), int(advice.group(2))
        self.sched.note(f"the operator creates {name} again with --deliver {start}")
        self.server.consumers[name].start_over(self.sched.now, start)
        kept = KEPT.search(refusal)
        if kept is not None:
            self.sched.note(f"the operator keeps stream sequences {kept.group(1)}")
            self.kept |= {
                seq
                for span in kept.group(1).split(", ")
                for seq in range(int(span.split("-")[0]), int(span.split("-")[-1]) + 1)
            }
        self.advised, self.advice_followed = True, self.advice_followed + 1
        self.first_seq_advised = self.stream.first_seq
        return True

    def _gone_before(self, refusal: str) -> bool:
        """Whether `refusal` names a message gone from the stream already when the operator
        created the consumer where the advice said, and not committed on the live checkpoint:
        every start skips it then (the server starts a consumer at the stream's first sequence
        when asked for an earlier one), and the query, which never read it, cannot tell it of
        another subject, so the refusal for data loss is README guarantee 2, not a wrong advice
        (seed 1606 of the worlds on nats-server 2.11-2.12 whose operator follows the advice:
        another partition's message, committed on an earlier checkpoint, purged before the
        first refusal, which was for the floor 2.11 reports). One the query committed is no
        loss (mutant sibling-partition-messages-taken-as-unread)."""
        gone = GONE_UNREAD.search(refusal)
        if gone is None:
            return False
        seq = int(gone.group(1))
        return seq < self.first_seq_advised and seq not in self.observed.in_sinks[-1]

    async def _drive(self, query: Query, quiet: bool) -> str:
        if quiet:
            asyncio.ensure_future(self._stop_when_idle(query))
        return await query.run()

    async def _stop_when_idle(self, query: Query) -> None:
        """Stop the last run once it has been idle a while with nothing left to ack, and its
        ledger holds nothing of its lineage that it should remove (its driver removes what it
        acked once the consumers' ack floors have held past it `SETTLE_SECONDS`). It gets 30
        ack waits from its last planned batch (a slow drain's last batch, with a long trigger
        interval, needs two triggers past the settle time), and 120 from its start at most."""
        wait = 30 * self.setup.ack_wait
        limit, last = self.sched.now + 4 * wait, self.sched.now + wait
        while self.sched.now < min(limit, last):
            await self.sched.sleep(1.0)
            if not query.idle:  # planning batches still
                last = self.sched.now + wait
            drained = all(not c.pending and not c.num_pending() for c in self.consumers)
            leftovers = live_leftovers(unpacked(self.bucket.values))
            if query.idle >= 2 and drained and not leftovers and not self._zombies_running():
                break
        query.stop_at = self.sched.now

    def _zombies_running(self) -> bool:
        """Whether a task attempt of an earlier run still runs (Spark lost it, or its driver
        died): it goes on to its end, as a paused executor's does once it resumes, and what it
        leaves is only known then (an entry it creates, its fence check removes)."""
        return any(
            p.kind == "task" and p.parent is not self.driver and not p.dead and not p.task.done()
            for p in self.sched.participants
            if p.task is not None
        )


async def _named(
    slot: str, batches: AsyncIterator[pa.RecordBatch]
) -> AsyncIterator[tuple[str, pa.RecordBatch]]:
    async for batch in batches:
        yield slot, batch


@dataclass
class Result:
    seed: int
    setup: Setup
    problems: list[str]
    order_breaks: list[str]
    order_reasons: Counter[str]  # how the attempt that left each break's message ended
    let_out: Counter[str]  # the live checkpoint's committed messages another client got: why
    trace: list[str]
    steps: int


def run_schedules(seeds: Sequence[int], jobs: int, **overrides: Any) -> Iterator[Result]:
    """Run the schedules of `seeds` over `jobs` processes, in seed order; without their traces
    (`run_schedule` of one seed prints it)."""
    # Small chunks (a second or so of schedules each): with big ones, a worker that finished
    # its last chunk idled while another ran most of one (up to 5 s of the unit lane's range).
    chunk = max(1, min(25, len(seeds) // (jobs * 8)))
    # A worker's full collections skip what it inherited from its parent (gc.freeze): they
    # would walk every object of the forked process (a test run's, all its imports) each time.
    with ProcessPoolExecutor(jobs, initializer=gc.freeze) as pool:
        yield from pool.map(_traceless, seeds, [overrides] * len(seeds), chunksize=chunk)


def _traceless(seed: int, overrides: dict[str, Any]) -> Result:
    result = run_schedule(seed, **overrides)
    result.trace = []
    return result


def run_schedule(seed: int, verbose: bool = False, **overrides: Any) -> Result:
    """Run the schedule of `seed`; `overrides` replace what it drew of the setup (the same draws
    follow, so the schedule is the same up to where the change matters), e.g. lost_answer=0
    to see whether lost compare-and-set answers are what breaks it."""
    rng = random.Random(seed)
    # New checkpoints are drawn apart, so a seed's schedule without them stays what it was.
    side = random.Random(f"new checkpoints {seed}")
    faults = random.Random(f"server faults {seed}")  # likewise the server's faults
    drawn = {
        "new_checkpoint": side.choice((0.0, 0.0, 0.0, 0.3)),
        **draw_hostility(faults),
        **overrides,
    }
    setup = replace(Setup.draw(rng), **drawn)
    if setup.stalling_executors:
        family = stalling_executors(setup, random.Random(f"stalling executors {seed}"))
        setup = replace(family, **overrides)
    if setup.removals_return:  # its restarts, which bring keys back, come often
        restarts = max(setup.restart_after_acks, 0.1)
        setup = replace(setup, restart_after_acks=restarts, **overrides)
    if setup.other_client:
        # Its plain consumer is shared; no purges: what the query took and the other client
        # acked, a purge would remove, and the query stops (README guarantee 8's lost state).
        setup = replace(setup, shared=True, purges=False, **overrides)
    chaos = replace(setup.chaos, dying_zombies=setup.dying_zombies)
    sched = Scheduler(rng, chaos, setup.ack_wait, verbose=verbose)
    other = random.Random(f"other client {seed}")
    world = World(setup, sched, side=side, faults=faults, ids=random.Random(seed), other=other)
    logger = logging.getLogger("nats_spark")
    previous_level = logger.level
    logger.setLevel(logging.DEBUG if verbose else logging.CRITICAL)
    try:
        run(sched.loop, world.main())
    except Exception as error:  # the harness or the code under test broke the schedule
        world.observed.problem("schedule failed", f"{type(error).__name__}: {error}")
    finally:
        logger.setLevel(previous_level)
    observed = world.observed
    return Result(
        seed,
        setup,
        observed.problems,
        observed.order_breaks,
        observed.order_reasons,
        observed.let_out,
        sched.trace,
        sched.steps,
    )
