"""A simulated Spark driver running the source: its checkpoint (offset log, commit log), the
call orders of Spark 4.0/4.1 and of 4.2+, batches of tasks with retries, and the sink.

What Spark calls, in order (MicroBatchExecution, PythonMicroBatchStream*, read from Spark's
source):
- at (re)start, with an offset log: 4.0/4.1 call `setLatestSeenOffset(<latest logged>)`, which
  PythonMicroBatchStream turns into the reader's `partitions(latest, latest)`; 4.2+ do not. An
  uncommitted logged batch is then run again with `partitions(<the logged batch before it, or
  initialOffset()>, <logged>)`, without a new offset log entry and without `commit`.
- each trigger: 4.2+ call `latestOffset(start, limit)` with the last committed offset (or
  `initialOffset()`); 4.0/4.1 `latestOffset()` with no start. An offset equal to the committed
  one means no batch. Otherwise the offset is logged, `commit(<previous>)` follows (only then),
  and the batch runs with `partitions(<previous, or initialOffset()>, <new>)`.
- availableNow: 4.2+ call `prepareForTriggerAvailableNow` and run batches until the offset stops
  changing. On 4.0/4.1 Spark wraps the source (AvailableNowDataStreamWrapper): at query start,
  before `setLatestSeenOffset`, it fetches `latestOffset()` once, and every trigger answers
  that (one batch); each trigger still calls the source's `latestOffset()` for progress
  (`reportLatestOffset`), and `initialOffset()` while nothing is committed.
- a job of the user's may read some of a batch's tasks before the sink does (foreachBatch's
  `df.isEmpty()`, `limit`, `take`), each stopped once it handed out its first rows
  (`EarlyStop`); killed while it hands out nothing, its worker is killed -9 (PythonRunner's
  MonitorThread, after `spark.python.task.killTimeout`), which the worlds' crashes are.
- the sink writes a batch, then the commit log records it. A task attempt that fails or is lost
  is retried (four attempts); under spark.speculation a copy runs beside a slow attempt. A
  failed batch fails the query, and Spark stops the source. A query may also be stopped while
  a batch runs: the source is stopped, tasks run on a while.
"""

from __future__ import annotations

import asyncio
import json
from asyncio import FIRST_COMPLETED
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nats.errors import Error as NatsError

from nats_spark.errors import ConfigurationError, NatsSparkError
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator
from nats_spark.spark.group_source.driver.offsets import SourceOffset
from nats_spark.spark.group_source.slot_partition import PackedSlots, SlotPartition
from tests.simulation.scheduler import Crashed, Lost, Participant

if TYPE_CHECKING:
    from tests.simulation.world import World

V40 = "4.0/4.1"
V42 = "4.2+"
PROCESSING = "processingTime"
AVAILABLE_NOW = "availableNow"
TASK_ATTEMPTS = 4
# In the worlds with early stops (`Setup.early_stops`): the chance a batch is read early first,
# and that each of its tasks is (Spark's `executeTake` may scan only some partitions).
EARLY_READ = 0.5
EARLY_TASK = 0.5
# As Spark serializes offsets (sorted keys); one encoder, not one built per `json.dumps`.
_OFFSET_ENCODER = json.JSONEncoder(sort_keys=True)


class QueryFailed(Exception):
    pass


# What the source may fail with in these worlds: its own errors (refusals, conflicts, lost
# state) and the client's (timeouts, a connection lost). Any other error is a fault of its
# code, not of the world: Spark does not retry a driver's error, so the user's query stops.
EXPLAINED = (NatsSparkError, NatsError, TimeoutError, ConnectionError)


@dataclass
class Checkpoint:
    offsets: dict[int, str] = field(default_factory=dict)  # batch id -> offset JSON
    commits: set[int] = field(default_factory=set)

    def committed_gen(self) -> int:
        """The gen of the newest committed batch (0: none)."""
        return _offset(self.offsets[max(self.commits)]).gen if self.commits else 0


def _json(offset: SourceOffset) -> str:
    return _OFFSET_ENCODER.encode(offset.to_json())


def _offset(logged: str) -> SourceOffset:
    return SourceOffset.from_json(logged)


def _through_json(offset: SourceOffset) -> SourceOffset:
    """What the reader gets back from Spark: the offset as Spark stored it."""
    return _offset(_json(offset))


@dataclass
class EarlyStop:
    """Spark stops a task attempt once it took `after` record batches (a limit met), as Spark
    4.0, 4.1 and 4.3 do (seen, and read in their source): the task ends and its completion
    listener closes the worker's socket (`BasePythonRunner.compute`); the worker, still running,
    finds it closed at its next write, and `worker.py`'s `process` closes the reader's generator
    in the process. `taken` is set when the task ends (its job may go on), before the close."""

    after: int
    ended: asyncio.Future[None]

    def taken(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


@dataclass
class Query:
    """One run of the query: a driver process from its start to its stop (or kill -9)."""

    world: World
    version: str
    trigger: str
    stop_at: float  # virtual time after which the query is stopped between batches
    idle: int = 0  # triggers in a row that planned no batch
    stopping: bool = False  # a stop interrupted a batch
    attempts: list[Participant] = field(default_factory=list)  # of the batch running
    refusal: str | None = None  # the source's ConfigurationError that failed the run

    async def run(self) -> str:
        world = self.world
        reader = world.new_driver()
        try:
            outcome = await self._stream(reader)
        except QueryFailed as failure:
            world.sched.note(f"query fails: {failure}")
            outcome = "failed"
        await world.sched.point("stop: the source's close")
        await reader.close()
        world.sched.note(f"query ends ({outcome})")
        return outcome

    async def _stream(self, reader: BatchCoordinator) -> str:
        world, checkpoint = self.world, self.world.checkpoint
        last = max(checkpoint.offsets, default=None)
        wrapped = self.trigger == AVAILABLE_NOW and self.version == V40
        fetched = await self._call(reader.latest_offset(None, None)) if wrapped else None
        if last is not None and self.version == V40:
            latest = _offset(checkpoint.offsets[last])
            world.sched.note(f"setLatestSeenOffset(batch {last}: gen {latest.gen})")
            await self._call(reader.partitions(latest, latest))
        if self.trigger == AVAILABLE_NOW and self.version == V42:
            await self._call(reader.prepare_available_now())
        if last is not None and last not in checkpoint.commits:
            start = await self._start(reader, last)
            await self._batch(reader, last, start, _offset(checkpoint.offsets[last]))
        batch = 0 if last is None else last + 1
        while world.sched.now < self.stop_at:
            committed = checkpoint.offsets.get(batch - 1)
            if self.version == V42:
                start = _offset(committed) if committed else await self._initial(reader)
                latest = await self._call(reader.latest_offset(start, None))
            elif fetched is not None:
                if not committed:
                    await self._initial(reader)
                latest = fetched
                await self._call(reader.latest_offset(None, None))  # reportLatestOffset
            else:
                latest = await self._call(reader.latest_offset(None, None))
            logged = _json(latest)  # as Spark serializes it, once per trigger
            if committed is not None and logged == committed:
                if self.trigger == AVAILABLE_NOW:
                    return "done"
                self.idle += 1
                await world.sched.sleep(world.trigger_interval)
                continue
            self.idle = 0
            await world.sched.point(f"write offset log {batch}")
            checkpoint.offsets[batch] = logged
            world.sched.note(f"offset log {batch}: gen {latest.gen} {_slots(latest)}")
            if committed is not None:
                await self._call(reader.commit(_offset(committed)))
            start = await self._start(reader, batch)
            await self._batch(reader, batch, start, _offset(logged))
            batch += 1
            await world.sched.sleep(world.trigger_interval * world.sched.rng.random())
        return "stopped"

    async def _start(self, reader: BatchCoordinator, batch: int) -> SourceOffset:
        before = self.world.checkpoint.offsets.get(batch - 1)
        return _offset(before) if before else await self._initial(reader)

    async def _initial(self, reader: BatchCoordinator) -> SourceOffset:
        return _through_json(await self._call(reader.initial_offset()))

    async def _call(self, call: Any) -> Any:
        """A call into the source; an error there fails the query, as in Spark."""
        try:
            return await call
        except Exception as error:
            if isinstance(error, ConfigurationError):
                self.refusal = str(error)
            elif not isinstance(error, EXPLAINED):
                self.world.observed.problem(
                    "the source failed on an error no fault explains",
                    f"{type(error).__name__}: {error}",
                )
            raise QueryFailed(f"the source raised {type(error).__name__}: {error}") from error

    async def _batch(
        self, reader: BatchCoordinator, batch: int, start: SourceOffset, end: SourceOffset
    ) -> None:
        world = self.world
        partitions = await self._call(reader.input_partitions(start, end))
        world.sched.note(
            f"batch {batch} (gen {start.gen}->{end.gen}): "
            + ", ".join(
                "+".join(f"{s.slot} limit {s.limit} acks {list(s.committed)}" for s in _slots_of(p))
                for p in partitions
            )
        )
        if world.setup.early_stops and world.sched.rng.random() < EARLY_READ:
            await self._stopped_early(batch, partitions)
        running = asyncio.gather(*(self._task(batch, p) for p in partitions))
        if world.sched.rng.random() < world.stopped_mid_batch:  # stopped while its tasks run
            await world.sched.sleep(world.sched.rng.uniform(0, world.stops_within))
            if not running.done():
                self.stopping = True  # no more task attempts; the running ones go on a while
                self._pause_at_the_stop()
                running.add_done_callback(lambda done: done.cancelled() or done.exception())
                raise QueryFailed(f"the query was stopped during batch {batch}")
        results = await running
        self.attempts.clear()
        # by slot, or by packed task's index: a re-run must emit the same rows, in the same
        # order, in the same input partition (the nats sink's ids are batch/partition/row)
        rows = {
            f"task {i}" if isinstance(p, PackedSlots) else p.slot: r
            for i, (p, r) in enumerate(zip(partitions, results, strict=True))
            if r
        }
        world.observed.full_run(batch, rows)
        await world.sched.point(f"sink writes batch {batch}")
        if world.sched.rng.random() < world.sink_failure:
            raise QueryFailed(f"the sink failed to write batch {batch}")
        world.observed.sink_write(batch, rows)
        world.sched.note(f"sink has batch {batch}: {rows}")
        await world.sched.point(f"write commit log {batch}")
        world.checkpoint.commits.add(batch)
        world.sched.note(f"commit log {batch}")

    def _pause_at_the_stop(self) -> None:
        """In the worlds whose stopped runs' executors pause (`Setup.paused_by_the_stop`): each
        attempt of the batch still running pauses its process from here, within half its ack
        wait, so that a read it has begun ends after the new checkpoint's give-back."""
        world = self.world
        longest = world.setup.paused_by_the_stop * world.setup.ack_wait
        for attempt in self.attempts:
            if longest and not attempt.dead and not attempt.finished.done():
                pause = world.side.uniform(0.0, longest)
                world.sched.stall(attempt, f"the stop of {attempt.name}'s run", pause)

    async def _stopped_early(
        self, batch: int, partitions: list[SlotPartition | PackedSlots]
    ) -> None:
        """A job of the user's before the batch's full read (foreachBatch's `df.isEmpty()`,
        `limit(n)`, `take`): some of the batch's tasks, each stopped after its first record
        batches. The job ends once each has handed them out, or ended, or failed (ignored here:
        the user's job is not the batch's); the closes run on beside the full read."""
        sched, loop = self.world.sched, asyncio.get_running_loop()
        ends = []
        for partition in partitions:
            if sched.rng.random() >= EARLY_TASK:
                continue
            stop = EarlyStop(sched.rng.randint(1, 2), loop.create_future())
            attempt = sched.spawn(
                f"b{batch}/{_name(partition)}#early",
                "task",
                self.world.task(partition, stop),
                parent=sched.current(),
            )
            attempt.finished.add_done_callback(lambda done: done.cancelled() or done.exception())
            ends.append(asyncio.wait([attempt.finished, stop.ended], return_when=FIRST_COMPLETED))
        if ends:
            await asyncio.gather(*ends)
        await sched.point(f"the early job of batch {batch} ends")

    async def _task(self, batch: int, partition: SlotPartition | PackedSlots) -> list[int]:
        """A task's attempts: a new one when none runs. Under speculation
        (`Setup.speculation`: seconds), an attempt that has run that long without an end gets
        a copy beside it (one at a time, as TaskSetManager does); the first to succeed gives
        the rows and the others are killed; each attempt that fails or is lost counts, and the
        fourth fails the query, even while another attempt runs."""
        sched, name = self.world.sched, _name(partition)
        running: dict[asyncio.Future[list[int]], Participant] = {}
        failures = 0
        failed: BaseException | None = None  # the last attempt's error
        speculation = self.world.setup.speculation or None
        while True:
            if not running:
                await sched.point(f"start task {name} of batch {batch}")
                if self.stopping:
                    raise QueryFailed("stopped")
                self._attempt(batch, partition, running, failures)
            copy_after = speculation if len(running) == 1 else None
            done, _ = await asyncio.wait(
                running, timeout=copy_after, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                sched.note(f"speculation: a copy of task {name} of batch {batch}")
                self._attempt(batch, partition, running, failures)
                continue
            for finished in done:
                running.pop(finished)
                try:
                    rows: list[int] = finished.result()
                except (Crashed, Lost):
                    await sched.point("task attempt gone")
                    failed = None
                except Exception as error:
                    await sched.point(f"task attempt failed: {type(error).__name__}")
                    failed = error
                else:
                    for other in running.values():
                        sched.kill(other, at="another attempt of its task succeeded")
                    await sched.point("task result")
                    return rows
                failures += 1
                if failures >= TASK_ATTEMPTS:
                    why = f"task {name} of batch {batch} failed {TASK_ATTEMPTS} times"
                    if isinstance(failed, ConfigurationError):  # the query fails with the last
                        self.refusal = str(failed)
                        why += f": {failed}"
                    raise QueryFailed(why)

    def _attempt(
        self,
        batch: int,
        partition: SlotPartition | PackedSlots,
        running: dict[asyncio.Future[list[int]], Participant],
        failures: int,
    ) -> None:
        sched = self.world.sched
        task = sched.spawn(
            f"b{batch}/{_name(partition)}#{failures + len(running)}",
            "task",
            self.world.task(partition),
            parent=sched.current(),
        )
        # Its end is known even when this task is gone before it looks (its driver died).
        task.finished.add_done_callback(lambda done: done.cancelled() or done.exception())
        running[task.finished] = task
        self.attempts.append(task)


def counted_by_spark(attempt: Participant) -> bool:
    """Whether Spark counts a failure of the task `attempt` (toward spark.task.maxFailures): its
    driver's run still awaits it. Not a zombie's: one Spark lost (and retried), or one running
    on after its driver's run ended (stopped, or killed with its process while the attempt's
    executor was paused: it wakes and runs on a while), whose failure reaches no one."""
    driver = attempt.parent
    return not attempt.lost and driver is not None and not driver.finished.done()


def _slots_of(partition: SlotPartition | PackedSlots) -> tuple[SlotPartition, ...]:
    return partition.slots if isinstance(partition, PackedSlots) else (partition,)


def _name(partition: SlotPartition | PackedSlots) -> str:
    """A task's name: its slot's, or its packed slots' joined."""
    return "+".join(slot.slot for slot in _slots_of(partition))


def _slots(offset: SourceOffset) -> str:
    return str({name: plan.limit for name, plan in offset.slots.items()})
