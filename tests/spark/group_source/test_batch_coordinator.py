"""The driver's coordinator without a server: `BatchCoordinator` over an in-memory ledger bucket, a
fixed target and consumer infos the test sets, through Spark's calls (latestOffset, partitions,
commit, progress, stop): batches with messages, an idle slot's acks, a pin held by another
client, a restarted driver re-planning a logged batch, an availableNow run's end."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from memory_bucket import MemoryBucket, attempt
from nats.js.errors import NoKeysError

from nats_spark import clock
from nats_spark.errors import ConfigurationError, NatsSparkError
from nats_spark.jetstream.replies import ConsumerInfo, StreamInfo
from nats_spark.loop import run_sync
from nats_spark.spark.group_source import ledger_protocol
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator
from nats_spark.spark.group_source.driver.consumer_checks import (
    PlacedPastAcked,
    SeenConsumers,
    Skipped,
    restart_at,
)
from nats_spark.spark.group_source.driver.driver_ledger import EntriesLost
from nats_spark.spark.group_source.driver.offsets import SlotPlan, SourceOffset
from nats_spark.spark.group_source.driver.targets import Held, Slot
from nats_spark.spark.group_source.ledger import read_head, read_pointer
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.group_source.slot_partition import Recreation, SlotPartition
from nats_spark.spark.group_source.task.columns import SlotColumns

pytestmark = pytest.mark.unit

SLOTS = [
    Slot(f"partition-{p}", "S", f"g-partition-{p}", "PCG", "pinned_client", "m1", True)
    for p in range(2)
]


class Server:
    """What the driver's connection is asked: stream and consumer infos, as the test sets them."""

    def __init__(self) -> None:
        self.consumers: dict[str, dict[str, Any]] = {s.consumer: {} for s in SLOTS}
        self.usable, self.nc, self.denied = True, None, []
        self.api = SimpleNamespace(stream_info=self.stream_info, consumer_info=self.consumer_info)

    def show(
        self,
        slot: Slot,
        pending: int = 0,
        ack_pending: int = 0,
        pin: str = "",
        delivered: int = 0,
        ack_wait: float = 30.0,
    ) -> None:
        self.consumers[slot.consumer] = {
            "num_pending": pending,
            "num_ack_pending": ack_pending,
            "delivered": {"stream_seq": delivered},
            "config": {"ack_wait": int(ack_wait * 1e9)},
            "priority_groups": [{"group": "PCG", "pinned_client_id": pin}] if pin else [],
        }

    async def stream_info(self, stream: str) -> StreamInfo:
        return StreamInfo({"state": {"first_seq": 1, "last_seq": 100}})

    async def consumer_info(self, stream: str, consumer: str) -> ConsumerInfo:
        return ConsumerInfo(self.consumers[consumer])

    async def close(self) -> None:
        self.usable = False


class Target:
    """A group whose slots stay the same; remembers what the query said it holds."""

    layout = None
    warning = None

    def __init__(self) -> None:
        self.held: list[Held] = []
        self.seen = SeenConsumers()

    async def resolve(self, client: Any, held: Held) -> list[Slot]:
        self.held.append(held)
        return SLOTS

    def slot_named(self, name: str) -> Slot:
        return next(slot for slot in SLOTS if slot.name == name)

    def look(self, slot: Slot, info: ConsumerInfo, skipped: Skipped) -> None:
        """The test's consumers keep their config and identity (see test_consumer_checks)."""

    def recreation(self, slot: Slot) -> None:
        """Not checked by the tasks either (see test_acceptance)."""


def driver_of(server: Server, kv: MemoryBucket) -> BatchCoordinator:
    """A driver (as a query's start or restart makes one) connected to `server` and `kv`."""
    options = parse_options({"servers": "nats://127.0.0.1:1", "stream": "S", "group": "g"})
    reader = BatchCoordinator(options)
    reader.client = server  # type: ignore[assignment]
    reader.ledger.attach(kv)
    reader.target = Target()  # type: ignore[assignment]
    return reader


@pytest.fixture
def driver() -> tuple[BatchCoordinator, Server, MemoryBucket]:
    server, kv = Server(), MemoryBucket()
    for slot in SLOTS:
        server.show(slot)
    return driver_of(server, kv), server, kv


def run_task(kv: MemoryBucket, partition: SlotPartition, seqs: list[int], pin: str) -> None:
    """What the partition's task records (and seals) in the ledger."""
    entry = attempt(kv, partition)
    run_sync(entry.claim())
    columns = SlotColumns("S", "m1", False, False)
    for seq in seqs:
        columns.add(b"S.k", b"", None, 1, seq, seq, 0)
    replies = [b"$JS.ACK.S.%b.1.%d.%d.0.0" % (partition.consumer.encode(), s, s) for s in seqs]
    run_sync(entry.record(columns, replies, pin, 0.0))
    run_sync(entry.seal())


def test_a_batch_then_an_idle_slots_acks_then_stop(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], published_acks: list[bytes]
) -> None:
    reader, server, kv = driver
    start = run_sync(reader.initial_offset())
    server.show(SLOTS[0], pending=10)
    end = run_sync(reader.latest_offset(start, None))
    assert (end.gen, end.slots) == (1, {"partition-0": SlotPlan(10, 10)})
    [task] = run_sync(reader.partitions(start, end))
    assert (task.slot, task.limit, task.committed, task.siblings) == ("partition-0", 10, (), ())

    run_task(kv, task, list(range(1, 11)), pin="pin-0")
    server.show(SLOTS[0], ack_pending=10, pin="pin-0")
    run_sync(reader.commit(end))
    # nothing new: a batch only so that its task acks what the finished one took
    following = run_sync(reader.latest_offset(end, None))
    assert (following.gen, following.slots) == (2, {})
    assert reader.target.held[-1].unacked == {"partition-0": 10}  # type: ignore[attr-defined]
    [ack_only] = run_sync(reader.partitions(end, following))
    assert (ack_only.slot, ack_only.limit, ack_only.committed) == ("partition-0", 0, (1,))
    assert ack_only.pin_id == "pin-0"  # the pin the entry recorded is the query's own
    progress = reader.report()
    assert progress["members"]["partition-0"] == {
        "pending": 0,
        "ackPending": 10,
        "status": "pinned",
        "member": "m1",
    }
    assert progress["lag"]["total"] == {"pending": 0, "ackPending": 10, "behindLatest": 0}

    run_sync(reader.commit(following))  # its task did not run: the driver acks at stop
    run_sync(reader.close())
    assert len(published_acks) == 10 and published_acks[0] == b"$JS.ACK.S.g-partition-0.1.1.1.0.0"


def test_another_clients_pin_stands_the_slot_by_and_is_logged_once(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], caplog: pytest.LogCaptureFixture
) -> None:
    reader, server, _ = driver
    start = run_sync(reader.initial_offset())
    server.show(SLOTS[0], pending=5, pin="theirs")
    server.show(SLOTS[1], pending=3)
    with caplog.at_level(logging.WARNING):
        end = run_sync(reader.latest_offset(start, None))
        assert run_sync(reader.latest_offset(end, None)).slots == {"partition-1": SlotPlan(3, 3)}
    assert end.slots == {"partition-1": SlotPlan(3, 3)}
    assert reader.report()["members"]["partition-0"]["status"] == "standby"
    standing_by = [r for r in caplog.records if "another client holds the pin" in r.message]
    assert len(standing_by) == 1
    run_sync(reader.close())


def test_a_restarted_driver_plans_a_logged_batch_again_and_numbers_on(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    first, server, kv = driver
    start = run_sync(first.initial_offset())
    server.show(SLOTS[0], pending=10)
    server.show(SLOTS[1], pending=4)
    end = run_sync(first.latest_offset(start, None))
    tasks = run_sync(first.partitions(start, end))
    run_task(kv, tasks[0], list(range(1, 11)), pin="pin-0")  # then the driver is killed
    restarted = driver_of(server, kv)
    again = run_sync(restarted.partitions(start, end))  # Spark re-runs the logged batch
    assert [(t.slot, t.limit, t.pin_id) for t in again] == [
        ("partition-0", 10, "pin-0"),  # the pin its entry recorded
        ("partition-1", 4, None),
    ]
    run_task(kv, again[1], [11, 12, 13, 14], pin="pin-1")  # the re-run's
    server.show(SLOTS[0], ack_pending=10, pin="pin-0")
    server.show(SLOTS[1], ack_pending=4, pin="pin-1")
    following = run_sync(restarted.latest_offset(end, None))
    assert (following.lineage, following.gen, following.slots) == (end.lineage, 2, {})
    assert [
        (t.slot, t.limit, t.committed) for t in run_sync(restarted.partitions(end, following))
    ] == [
        ("partition-0", 0, (1,)),
        ("partition-1", 0, (1,)),
    ]
    run_sync(first.close())
    run_sync(restarted.close())


def test_a_logged_batch_run_again_carries_each_consumer_s_own_ack_wait(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    """A restarted driver asked to run a logged batch again has not planned, so it has not seen
    the consumers: it looks at them first, and its tasks keep what they take for the
    consumers' 4 s ack wait, not for the option's 30 s (seed 782 of the simulation's worlds with
    another client: kept every 10 s, a message ran out of its wait while its task lived)."""
    first, server, kv = driver
    start = run_sync(first.initial_offset())
    server.show(SLOTS[0], pending=3, ack_wait=4.0)
    server.show(SLOTS[1], pending=2, ack_wait=4.0)
    end = run_sync(first.latest_offset(start, None))
    run_sync(first.partitions(start, end))  # then the driver is killed
    restarted = driver_of(server, kv)
    again = run_sync(restarted.partitions(start, end))
    assert [(t.slot, t.ack_wait) for t in again] == [("partition-0", 4.0), ("partition-1", 4.0)]
    run_sync(first.close())
    run_sync(restarted.close())


class CheckingTarget(Target):
    """A target that checks its consumers' identity, as the source's targets do."""

    def look(self, slot: Slot, info: ConsumerInfo, skipped: Skipped) -> None:
        self.seen.look(slot.stream, slot.consumer, info, self.recreation(slot), skipped)

    def recreation(self, slot: Slot) -> Recreation:  # type: ignore[override]
        return Recreation("recreate it at ", self.seen.next_after_acked(slot.stream, slot.consumer))


def checking(reader: BatchCoordinator) -> BatchCoordinator:
    """`reader` with a target that checks its consumers' identity (`CheckingTarget`)."""
    reader.target = CheckingTarget()  # type: ignore[assignment]
    reader.ledger.seen = reader.target.seen
    return reader


def started_over(tasks: list[SlotPartition]) -> list[tuple[str, bool]]:
    return [(t.slot, t.consumer_sighting.started_over) for t in tasks if t.consumer_sighting]


def test_a_logged_batch_run_again_tells_its_tasks_of_a_consumer_created_again_since(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    """A consumer created again (from the start: it acked nothing yet) while the query was
    stopped is taken by the restarted driver, and the tasks of the logged batch it runs again
    are told (`started_over`): what the batch's first run took of the old one comes again as
    first deliveries. The batch it plans next holds only what the new one delivered."""
    first, server, kv = driver
    start, end = first_batch_then_its_consumer_created_again(checking(first), server, kv)
    restarted = checking(driver_of(server, kv))
    again = run_sync(restarted.partitions(start, end))  # Spark re-runs the logged batch
    assert started_over(again) == [("partition-0", True), ("partition-1", False)]
    following = run_sync(restarted.latest_offset(end, None))
    assert started_over(run_sync(restarted.partitions(end, following))) == [
        ("partition-0", False),
        ("partition-1", False),
    ]
    run_sync(first.close())
    run_sync(restarted.close())


def first_batch_then_its_consumer_created_again(
    first: BatchCoordinator, server: Server, kv: MemoryBucket
) -> tuple[SourceOffset, SourceOffset]:
    """Batch 1 planned by `first`, partition-0's task recording 1 and 2, then the driver killed
    and partition-0's consumer created again: the batch's start and end."""
    for slot in SLOTS:
        server.show(slot, pending=2)
        server.consumers[slot.consumer]["created"] = "2026-11-30T01:00:00Z"
    start = run_sync(first.initial_offset())
    end = run_sync(first.latest_offset(start, None))
    tasks = run_sync(first.partitions(start, end))
    assert started_over(tasks) == [("partition-0", False), ("partition-1", False)]
    run_task(kv, tasks[0], [1, 2], pin="pin-0")
    server.consumers[SLOTS[0].consumer]["created"] = "2026-11-30T01:05:00Z"
    return start, end


class PlacingTarget(CheckingTarget):
    """A static group's target whose first resolve creates partition-0's consumer where the
    server shows it then, as `startingPosition` does (`SeenConsumers.place`)."""

    def __init__(self) -> None:
        super().__init__()
        self.to_place = True

    async def resolve(self, client: Any, held: Held) -> list[Slot]:
        if self.to_place:
            self.to_place = False
            name = SLOTS[0].consumer
            self.seen.place("S", name, await client.api.consumer_info("S", name))
        return await super().resolve(client, held)

    def recreation(self, slot: Slot) -> Recreation:
        return restart_at(self.seen.next_after_acked(slot.stream, slot.consumer))


def placing(reader: BatchCoordinator) -> BatchCoordinator:
    """`reader` with a target that places partition-0's consumer (`PlacingTarget`)."""
    reader.target = PlacingTarget()  # type: ignore[assignment]
    reader.ledger.seen = reader.target.seen
    return reader


def test_a_consumer_placed_below_the_marks_is_judged_by_what_the_logged_batch_holds(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], published_acks: list[bytes]
) -> None:
    """A static group's consumer (floor 3) whose 4-5 a query on an earlier checkpoint acked:
    batch 1 took 4-6, then the consumer was deleted and, on the advice, created by the restarted
    query at 4 (`startingPosition`). Run again, the batch replays 4-6, whose entries drop the
    new consumer's deliveries of them: it is read on, its tasks told it started over. A new
    checkpoint's query, which holds none of them (no sighting to judge it by either), refuses
    the consumer it placed there as it plans, deletes it, and advises 6."""
    first, server, kv = driver
    name = SLOTS[0].consumer
    for slot in SLOTS:
        server.show(slot, pending=3)
        server.consumers[slot.consumer]["created"] = "2026-11-30T01:00:00Z"
        server.consumers[slot.consumer]["ack_floor"] = {"stream_seq": 3}
    start = run_sync(checking(first).initial_offset())
    first.target.seen.given_back({("S", name): [4, 5]})
    end = run_sync(first.latest_offset(start, None))
    run_task(kv, run_sync(first.partitions(start, end))[0], [4, 5, 6], pin="pin-0")
    server.consumers[name]["created"] = "2026-11-30T01:05:00Z"  # placed at 4: floor 3
    again = run_sync(placing(driver_of(server, kv)).partitions(start, end))
    assert started_over(again) == [("partition-0", True), ("partition-1", False)]
    deleted: list[str] = []

    async def delete_consumer(stream: str, consumer: str) -> None:
        deleted.append(consumer)

    server.api.delete_consumer = delete_consumer
    server.consumers[name]["created"] = "2026-11-30T01:10:00Z"
    fresh = placing(driver_of(server, kv))
    new_start = run_sync(fresh.initial_offset())
    with pytest.raises(PlacedPastAcked, match="startingPosition=sequence:6, so it creates"):
        run_sync(fresh.latest_offset(new_start, None))
    assert deleted == [name]


def test_each_driver_that_runs_a_batch_again_tells_its_tasks_of_a_consumer_created_again(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    """The restarted driver that took the consumer created again since the logged batch was
    planned wrote the new one's sighting to the pointer and told the batch's tasks; killed
    before the batch committed, the next driver, which finds the new consumer in the pointer,
    tells them too (seed 2159 of the simulation's worlds whose shared consumer is created
    again: untold, a task took what the old one delivered to a sibling as a first delivery
    of the new one, and both emitted it). Once the batch commits, no batch is told."""
    first, server, kv = driver
    start, end = first_batch_then_its_consumer_created_again(checking(first), server, kv)
    second = checking(driver_of(server, kv))
    run_sync(second.partitions(end, end))  # Spark 4.0/4.1's `setLatestSeenOffset`
    run_sync(second.latest_offset(None, None))
    pointer = run_sync(read_pointer(kv, second.ledger.pointer_key))
    assert pointer is not None
    assert pointer.consumers["S"][SLOTS[0].consumer][0] == "2026-11-30T01:05:00Z"
    told = [("partition-0", True), ("partition-1", False)]
    assert started_over(run_sync(second.partitions(start, end))) == told
    third = checking(driver_of(server, kv))  # the second was killed before the batch committed
    assert started_over(run_sync(third.partitions(start, end))) == told
    following = run_sync(third.latest_offset(end, None))
    assert started_over(run_sync(third.partitions(end, following))) == [
        ("partition-0", False),
        ("partition-1", False),
    ]
    for reader in (first, second, third):
        run_sync(reader.close())


def test_a_first_latest_offset_before_the_checkpoint_is_known_leaves_a_consumer_to_the_run_again(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    """Spark 4.0/4.1's availableNow run asks `latestOffset()` before `setLatestSeenOffset`: its
    driver knows neither what the query committed nor what the logged batch holds, and leaves
    the consumer created again unjudged (the pointer keeps the old sighting) to the batch's run
    again, which takes it and tells the tasks (seeds 42, 280 and 614 of the simulation's worlds
    whose operator follows the advice: that look refused a consumer created where a task's
    refusal said, for marks the batch held, and advised a start past the batch)."""
    first, server, kv = driver
    start, end = first_batch_then_its_consumer_created_again(checking(first), server, kv)
    second = checking(driver_of(server, kv))
    run_sync(second.latest_offset(None, None))
    pointer = run_sync(read_pointer(kv, second.ledger.pointer_key))
    assert pointer is not None
    assert pointer.consumers["S"][SLOTS[0].consumer][0] == "2026-11-30T01:00:00Z"
    told = [("partition-0", True), ("partition-1", False)]
    assert started_over(run_sync(second.partitions(start, end))) == told
    for reader in (first, second):
        run_sync(reader.close())


def test_a_planning_that_refuses_a_consumer_writes_that_one_taken_before_started_over(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    """A restarted driver's planning takes partition 0's consumer, created again from the
    start, and then refuses partition 1's, created again with a moving start: the pointer it
    writes before it refuses keeps partition 0's new sighting, so it keeps as well that the
    consumer started over after batch 1 was planned (a next driver, which takes that sighting
    as seen, tells a run of batch 1 again: `DriverLedger.started_over`)."""
    first, server, kv = driver
    _, end = first_batch_then_its_consumer_created_again(checking(first), server, kv)
    created_again = server.consumers[SLOTS[1].consumer]
    created_again["created"] = "2026-11-30T01:05:00Z"
    created_again["config"]["deliver_policy"] = "new"
    second = checking(driver_of(server, kv))
    run_sync(second.partitions(end, end))  # Spark 4.0/4.1's `setLatestSeenOffset`
    with pytest.raises(ConfigurationError, match="deliver policy new"):
        run_sync(second.latest_offset(None, None))
    pointer = run_sync(read_pointer(kv, second.ledger.pointer_key))
    assert pointer is not None
    assert pointer.consumers["S"][SLOTS[0].consumer][0] == "2026-11-30T01:05:00Z"
    assert pointer.started_over == [["S", SLOTS[0].consumer, 1]]
    for reader in (first, second):
        run_sync(reader.close())


def test_a_driver_refusing_a_consumer_created_again_first_writes_what_it_saw(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    """A planning that saw partition 0's floor move to 10 and then refused partition 1's
    consumer, created again below its floor, writes the pointer before it refuses: the next
    start judges partition 0's consumer, created again at 11 as the line may say, against floor
    10, not the pointer's older 0 (seeds 13, 129, 255 of the simulation's worlds whose operator
    follows the advice; no seed of 0-12000 of those worlds catches the refusal without it since
    other partitions' messages between the floors no longer count as unread)."""
    reader, server, kv = driver
    reader.target = CheckingTarget()  # type: ignore[assignment]
    reader.ledger.seen = reader.target.seen
    server.show(SLOTS[1], delivered=5)
    for slot in SLOTS:
        server.consumers[slot.consumer]["created"] = "2026-11-30T01:00:00Z"
    start = run_sync(reader.initial_offset())
    run_sync(reader.latest_offset(start, None))
    server.show(SLOTS[0], delivered=10)
    server.consumers[SLOTS[0].consumer]["created"] = "2026-11-30T01:00:00Z"
    server.show(SLOTS[1])
    server.consumers[SLOTS[1].consumer]["created"] = "2026-11-30T01:05:00Z"
    with pytest.raises(ConfigurationError, match="was deleted and created again"):
        run_sync(reader.latest_offset(start, None))
    pointer = run_sync(read_pointer(kv, reader.ledger.pointer_key))
    assert pointer is not None
    assert pointer.consumers == {
        "S": {
            "g-partition-0": ["2026-11-30T01:00:00Z", 10, 0],
            "g-partition-1": ["2026-11-30T01:00:00Z", 5, 0],
        }
    }
    run_sync(reader.close())


def test_an_available_now_run_ends_where_the_stream_ended_at_its_start(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    reader, server, _ = driver
    start = run_sync(reader.initial_offset())
    run_sync(reader.prepare_available_now())  # the stream's last sequence is 100
    server.show(SLOTS[0], pending=50, delivered=100)  # arrived after the run started
    server.show(SLOTS[1], pending=5, ack_pending=3, delivered=99)
    end = run_sync(reader.latest_offset(start, None))
    # The 3 ack-pending beyond the ledger (a killed attempt's) are waited for: an ack wait.
    assert end.slots == {"partition-1": SlotPlan(8, 5)}
    assert reader.report()["members"]["partition-0"]["status"] == "done"
    [task] = run_sync(reader.partitions(start, end))
    assert 0 < task.redelivery_wait <= 32
    run_sync(reader.close())


def test_spark_40_restart_acks_nothing_of_the_logged_uncommitted_batch(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], published_acks: list[bytes]
) -> None:
    """Spark 4.0/4.1 restart a query with `setLatestSeenOffset(latest logged)`, which calls
    `partitions(latest, latest)` before the logged batch is re-run; here the re-run then fails
    in the sink and the query stops. Only batch 1 is committed: nothing of batch 2 is acked."""
    first, server, kv = driver
    start = run_sync(first.initial_offset())
    server.show(SLOTS[0], pending=10)
    one = run_sync(first.latest_offset(start, None))
    [task] = run_sync(first.partitions(start, one))
    run_task(kv, task, list(range(1, 11)), pin="pin-0")
    server.show(SLOTS[0], pending=5, ack_pending=10, pin="pin-0")
    two = run_sync(first.latest_offset(one, None))
    [task] = run_sync(first.partitions(one, two))  # batch 1 is committed
    run_task(kv, task, list(range(11, 16)), pin="pin-0")  # then the driver is killed
    # The task acked none of batch 1 (it was killed first): its acks are due at the re-run.

    restarted = driver_of(server, kv)
    run_sync(restarted.partitions(two, two))  # setLatestSeenOffset(two)
    rerun = run_sync(restarted.partitions(one, two))  # the logged batch, re-run; it fails
    assert [(t.slot, t.committed) for t in rerun] == [("partition-0", (1,))]
    run_sync(restarted.close())  # the query stops: it may ack batch 1, never batch 2
    acked = {int(subject.split(b".")[5]) for subject in published_acks}
    assert acked <= set(range(1, 11)), f"acked before commit: {sorted(acked - set(range(1, 11)))}"
    head = run_sync(read_head(restarted.ledger.ledger, 2, "partition-0"))  # type: ignore[union-attr]
    assert head is not None and head[0].state.value == "sealed"


def test_spark_40_next_start_acks_the_last_committed_batch_when_nothing_is_new(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], published_acks: list[bytes]
) -> None:
    """A query on Spark 4.0/4.1 stops after batch 1 committed (Spark never says so: no batch
    follows). Its next start finds nothing new and still acks batch 1, in a batch of its own."""
    first, server, kv = driver
    start = run_sync(first.initial_offset())
    server.show(SLOTS[0], pending=10)
    one = run_sync(first.latest_offset(None, None))  # 4.0/4.1: no start offset
    [task] = run_sync(first.partitions(start, one))
    run_task(kv, task, list(range(1, 11)), pin="pin-0")
    run_sync(first.close())
    assert published_acks == []  # not known committed: left to the next start

    server.show(SLOTS[0], ack_pending=10, pin="pin-0")
    server.usable = True  # the restarted driver's own connection
    restarted = driver_of(server, kv)
    assert run_sync(restarted.partitions(one, one)) == []  # setLatestSeenOffset(one)
    following = run_sync(restarted.latest_offset(None, None))
    assert following.gen == 2 and following.slots == {}
    [ack_only] = run_sync(restarted.partitions(one, following))
    assert (ack_only.slot, ack_only.limit, ack_only.committed) == ("partition-0", 0, (1,))
    run_sync(restarted.commit(following))
    run_sync(restarted.close())  # its task did not run here: the driver acks at stop
    assert len(published_acks) == 10


def first_batch_on_spark_40(
    reader: BatchCoordinator, server: Server, kv: MemoryBucket
) -> tuple[SourceOffset, SourceOffset]:
    """A new query's batch 0 in Spark 4.0/4.1's order (`latestOffset()` before its start,
    `initialOffset()`), its task taking messages 1-10; returns its start and end."""
    server.show(SLOTS[0], pending=10)
    end = run_sync(reader.latest_offset(None, None))
    start = run_sync(reader.initial_offset())
    assert (start.lineage, start.gen) == (end.lineage, 0)
    [task] = run_sync(reader.partitions(start, end))
    run_task(kv, task, list(range(1, 11)), pin="pin-0")
    return start, end


def test_spark_40_plans_batch_0_before_its_start_in_one_lineage(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], published_acks: list[bytes]
) -> None:
    """Spark 4.0/4.1 ask a new query's source for its latest offset before its initial one (the
    start of batch 0). Both name one lineage: a new one would leave batch 0's entries behind
    (never acked nor deduped) and take the gens committed in the first lineage as committed in
    the second. Here batch 2 fails in the sink and the query stops: only batch 1 is acked."""
    reader, server, kv = driver
    start, one = first_batch_on_spark_40(reader, server, kv)
    server.show(SLOTS[0], pending=5, ack_pending=10, pin="pin-0")
    two = run_sync(reader.latest_offset(None, None))
    assert (two.lineage, two.gen) == (one.lineage, 2)
    run_sync(reader.commit(one))
    [task] = run_sync(reader.partitions(one, two))
    run_task(kv, task, list(range(11, 16)), pin="pin-0")
    run_sync(reader.close())
    assert sorted(int(subject.split(b".")[5]) for subject in published_acks) == list(range(1, 11))


def acked_5_and_6_then_created_again(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
    monkeypatch: pytest.MonkeyPatch,
    floor: int,
    looked_at_since: bool = True,
) -> tuple[Server, MemoryBucket, list[bytes]]:
    """A query on Spark 4.0/4.1 that saw partition-0's consumer at floor 4 commits 5-6 and acks
    them at stop (its entry is ACKED), then the consumer is created again at `floor`; with
    what the ledger sends from then on (+ACK, -NAK). `looked_at_since`: a run of the query
    restarted on its checkpoint looked at the old consumer after the acks (it took them), as
    the pointer it wrote keeps; else the new consumer may have been created before they came
    (nothing tells), and ignored them."""
    sent: list[bytes] = []

    async def send(nc: object, commands: list[bytes], count: int) -> int:
        sent.extend(line for line in b"".join(commands).split(b"\r\n")[1::2])
        return count

    monkeypatch.setattr(ledger_protocol, "send_acks", send)
    first, server, kv = driver
    server.show(SLOTS[0], pending=2)
    for slot in SLOTS:
        server.consumers[slot.consumer]["created"] = "2026-11-30T01:00:00Z"
        server.consumers[slot.consumer]["ack_floor"] = {"stream_seq": 4}
    end = run_sync(checking(first).latest_offset(None, None))
    start = run_sync(first.initial_offset())
    [task] = run_sync(first.partitions(start, end))
    run_task(kv, task, [5, 6], pin="pin-0")
    run_sync(first.commit(end))
    run_sync(first.close())
    assert sent == [b"+ACK"] * 2
    server.usable = True  # the next queries' own connections
    server.show(SLOTS[0])
    if looked_at_since:  # the old consumer, its floor below 5 still (acks lost below, say)
        old = {"created": "2026-11-30T01:00:00Z", "ack_floor": {"stream_seq": 4}}
        server.consumers[SLOTS[0].consumer].update(old)
        restarted = checking(driver_of(server, kv))
        run_sync(restarted.latest_offset(end, None))
        run_sync(restarted.close())
        server.usable = True
    again = {"created": "2026-11-30T01:05:00Z", "ack_floor": {"stream_seq": floor}}
    server.consumers[SLOTS[0].consumer].update(again)
    return server, kv, sent


def judged_on_a_new_checkpoint(server: Server, kv: MemoryBucket) -> BatchCoordinator:
    """A new checkpoint's availableNow run on Spark 4.0/4.1 (wrapped): the `latestOffset()`
    fetched before anything is told (unjudged), `initialOffset()`, then `reportLatestOffset`'s,
    which judges the consumers before the first batch's give-back."""
    reader = checking(driver_of(server, kv))
    run_sync(reader.latest_offset(None, None))
    run_sync(reader.initial_offset())
    run_sync(reader.latest_offset(None, None))
    return reader


def test_spark_40_refusal_before_a_new_checkpoint_s_give_back_advises_past_what_it_marks(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition-0's consumer, whose 5-6 a query on an earlier checkpoint acked, created again
    from the start, is judged by a new checkpoint's run before its first batch gives back the
    entry of 5-6 (keeping them as acked by that query): it advises a start past them, 7, as a
    refusal after the give-back does; not 5, which that refusal refused again (seed 767 of the
    simulation's worlds whose operator follows the advice). A consumer created at 7 is read on,
    and the give-back NAKs 5-6 (ignored: acked)."""
    server, kv, sent = acked_5_and_6_then_created_again(driver, monkeypatch, floor=0)
    with pytest.raises(ConfigurationError, match="recreate it at 7$"):
        judged_on_a_new_checkpoint(server, kv)
    server.usable = True
    created_at_7 = {"created": "2026-11-30T01:10:00Z", "ack_floor": {"stream_seq": 6}}
    server.consumers[SLOTS[0].consumer].update(created_at_7)
    advised = judged_on_a_new_checkpoint(server, kv)  # the checkpoint again: nothing logged
    first_batch = advised.current
    assert first_batch is not None
    run_sync(advised.partitions(SourceOffset(first_batch.lineage, 0), first_batch))
    assert sent[2:] == [b"-NAK"] * 2
    run_sync(advised.close())


def test_spark_40_entries_a_new_checkpoint_gives_back_hold_nothing_of_its_own(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer created again where the earlier query's sighting left it (5: floor 4),
    judged before the new checkpoint's give-back: the ACKED entry of 5-6 is that query's, whose
    give-back removes it, not one of this query's that drops the new consumer's deliveries of
    them. It is refused, as after the give-back; taken, it would deliver 5-6 again, which
    nothing drops once the give-back removed the entry."""
    server, kv, _ = acked_5_and_6_then_created_again(driver, monkeypatch, floor=4)
    with pytest.raises(ConfigurationError, match="acked messages up to stream sequence 6"):
        judged_on_a_new_checkpoint(server, kv)


def test_spark_40_a_new_checkpoint_reads_again_what_acks_may_have_missed_by_a_recreation(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry of 5-6 was marked ACKED after the query's last look at partition-0's consumer,
    which is found created again from the start: nothing tells whether the acks reached the old
    consumer or came an instant after the new one was created, which ignored them (seed 1586 of
    the simulation's worlds whose operator follows the advice: 9 ms after). 5-6 count as
    committed and never acked, not as marks: the advice starts at 5, not past them at 7 (which
    the live checkpoint would never have read), a consumer created at 5 is read on, and the
    give-back keeps no mark of them."""
    server, kv, sent = acked_5_and_6_then_created_again(
        driver, monkeypatch, floor=0, looked_at_since=False
    )
    with pytest.raises(ConfigurationError, match="recreate it at 5$"):
        judged_on_a_new_checkpoint(server, kv)
    server.usable = True
    created_at_5 = {"created": "2026-11-30T01:10:00Z", "ack_floor": {"stream_seq": 4}}
    server.consumers[SLOTS[0].consumer].update(created_at_5)
    advised = judged_on_a_new_checkpoint(server, kv)
    first_batch = advised.current
    assert first_batch is not None
    run_sync(advised.partitions(SourceOffset(first_batch.lineage, 0), first_batch))
    assert sent[2:] == [b"-NAK"] * 2
    assert advised.target.seen.acked_earlier == {}
    run_sync(advised.close())


class ShortListingBucket(MemoryBucket):
    """nats-py's `keys()` as it comes back 2 or 3 times in 1,000: empty while keys exist."""

    async def keys(self) -> list[str]:
        raise NoKeysError


def test_a_restarted_driver_acks_entries_a_key_listing_would_miss(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    """A restarted driver learns its lineage's entries from the bucket; a KV key listing can
    come back empty while they exist, and a sealed entry it missed would never be acked (its
    messages come back after the ack wait and are emitted again)."""
    first, server, memory = driver
    kv = ShortListingBucket()
    first.ledger.attach(kv)
    start = run_sync(first.initial_offset())
    server.show(SLOTS[0], pending=10)
    one = run_sync(first.latest_offset(start, None))
    [task] = run_sync(first.partitions(start, one))
    run_task(kv, task, list(range(1, 11)), pin="pin-0")
    server.show(SLOTS[0], ack_pending=10, pin="pin-0")

    restarted = driver_of(server, kv)  # the driver is killed, Spark commits batch 1 meanwhile
    two = run_sync(restarted.latest_offset(one, None))
    [ack_only] = run_sync(restarted.partitions(one, two))
    assert (ack_only.slot, ack_only.committed) == ("partition-0", (1,))
    run_sync(first.close())
    run_sync(restarted.close())


def test_spark_40_asks_initial_offset_after_planning_and_gets_the_same_lineage(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], published_acks: list[bytes]
) -> None:
    """Spark 4.0/4.1 plan a new query's batch 0 with `latestOffset()` before they ask for its
    start, and ask again before every batch until one is committed; a restart before then tells
    the logged batch only later (`setLatestSeenOffset`). Every answer is in one lineage, and a
    batch that fails in the sink is not acked at stop."""
    first, server, kv = driver
    start, zero = first_batch_on_spark_40(first, server, kv)
    assert run_sync(first.initial_offset()) == start  # batch 0 failed in the sink: asked again
    run_sync(first.close())

    server.usable = True  # the restarted query's own connection
    restarted = driver_of(server, kv)
    assert run_sync(restarted.partitions(zero, zero)) == []  # setLatestSeenOffset(zero)
    assert run_sync(restarted.initial_offset()) == start
    run_sync(restarted.close())
    assert published_acks == []


def test_a_new_checkpoint_whose_driver_died_before_its_first_batch_still_gives_back(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark 4.2+: a query on a new checkpoint asks `initialOffset` (a new lineage, which the
    pointer then names) and its driver dies before the first batch; restarted, it asks again
    and gets a third lineage. The first query's uncommitted batch is still given back (NAKed,
    its entry removed) at the first batch: not left to its ack wait and the bucket's max age."""
    sent: list[bytes] = []

    async def send(nc: object, commands: list[bytes], count: int) -> int:
        sent.extend(line for line in b"".join(commands).split(b"\r\n") if line)
        return count

    monkeypatch.setattr(ledger_protocol, "send_acks", send)
    first, server, kv = driver
    start = run_sync(first.initial_offset())
    server.show(SLOTS[0], pending=10)
    one = run_sync(first.latest_offset(start, None))
    [task] = run_sync(first.partitions(start, one))
    run_task(kv, task, list(range(1, 11)), pin="pin-0")  # never committed: the query dies

    server.show(SLOTS[0], ack_pending=10, pin="pin-0")
    server.show(SLOTS[1], pending=5)  # what the first batch of the new checkpoint reads
    dies_early = driver_of(server, kv)  # the new checkpoint's first driver
    assert run_sync(dies_early.initial_offset()).lineage not in (start.lineage, None)
    restarted = driver_of(server, kv)  # no offset was logged: its restart starts afresh
    begin = run_sync(restarted.initial_offset())
    end = run_sync(restarted.latest_offset(begin, None))
    run_sync(restarted.partitions(begin, end))
    assert sent[1::2] == [b"-NAK"] * 10
    assert run_sync(read_head(first.ledger.ledger, 1, "partition-0")) is None  # type: ignore[arg-type]
    for reader in (first, dies_early, restarted):
        run_sync(reader.close())


def test_a_bucket_with_a_max_age_loses_it_before_anything_is_planned() -> None:
    """A max age expires every key by its last write (the in-memory bucket as nats-server): the
    driver's first call removes it, before any key is written."""
    server, kv = Server(), MemoryBucket(expire_after=60.0)
    now = [1000.0]
    previous = clock.use(lambda: now[0])
    try:
        run_sync(kv.put("old", b"1"))
        now[0] += 60
        assert run_sync(kv.keys_matching("*")) == []  # expired by its last write's age
        reader = driver_of(server, kv)
        run_sync(reader.initial_offset())
        assert kv.expire_after == 0.0
        now[0] += 3600
        assert run_sync(kv.keys_matching("query.*.*")) == ["query.S.g"]  # kept
    finally:
        clock.use(previous)


def test_a_bucket_whose_max_age_may_not_be_removed_is_refused_with_the_fix() -> None:
    class Locked(MemoryBucket):
        async def clear_max_age(self) -> None:
            raise NatsSparkError("permission denied to publish $JS.API.STREAM.UPDATE.KV_ledger")

    kv = Locked(expire_after=7 * 24 * 3600.0)
    reader = driver_of(Server(), kv)
    with pytest.raises(ConfigurationError) as refused:
        run_sync(reader.initial_offset())
    message = str(refused.value)
    assert "\n" not in message and "max age of 604800 s" in message
    assert message.endswith("nats stream edit KV_ledger --max-age=0")
    assert kv.values == {}  # nothing written, nothing planned


def lost_after_a_committed_batch(
    driver: tuple[BatchCoordinator, Server, MemoryBucket], ack_pending: int
) -> tuple[BatchCoordinator, SourceOffset, SourceOffset]:
    """Batch 1 committed, its driver killed before the acks, the bucket emptied (expired, purged
    or recreated), the driver restarted: the restart's next batch, planned."""
    first, server, kv = driver
    start = run_sync(first.initial_offset())
    server.show(SLOTS[0], pending=10)
    one = run_sync(first.latest_offset(start, None))
    [task] = run_sync(first.partitions(start, one))
    run_task(kv, task, list(range(1, 11)), pin="pin-0")  # committed; then the driver is killed
    kv.values.clear()
    kv.written.clear()
    server.show(SLOTS[0], pending=5, ack_pending=ack_pending)  # the pin timed out
    restarted = driver_of(server, kv)
    return restarted, one, run_sync(restarted.latest_offset(one, None))


def test_a_committed_batchs_lost_entries_stop_the_restart(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    restarted, one, two = lost_after_a_committed_batch(driver, ack_pending=10)
    with pytest.raises(EntriesLost, match="lost the entries of committed batch 1 of partition-0"):
        run_sync(restarted.partitions(one, two))


def test_a_committed_batchs_lost_entries_cost_nothing_once_nothing_is_pending(
    driver: tuple[BatchCoordinator, Server, MemoryBucket],
) -> None:
    """A query stopped after its acks went out: no message of the batch can come back."""
    restarted, one, two = lost_after_a_committed_batch(driver, ack_pending=0)
    run_sync(restarted.partitions(one, two))
    run_sync(restarted.close())
