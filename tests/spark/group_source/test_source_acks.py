"""The acks of committed batches, end to end: they go out from the tasks of the batch after
(a slot with nothing new gets an ack-only task), and a far-off trigger does not let them wait
past the ack wait (the driver restarts it meanwhile)."""

from __future__ import annotations

import asyncio
import json
import tarfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import (
    Collector,
    Slot,
    assert_exactly_once,
    consumer_info,
    foreach_batches,
    in_background,
    make_consumer,
    make_stream,
    publish,
    puller,
    seqs,
    seqs_of,
    source,
    source_runners,
    static_group,
    unacked,
    wait_until,
    waiting_pull_sent,
)

from nats_spark.client import NatsClient, close_shared_clients, open_blocking, shared_client
from nats_spark.connection import ConnectionSettings
from nats_spark.jetstream.acks import NAK, InProgressKeeper, publish_acks
from nats_spark.jetstream.api import to_nanos
from nats_spark.loop import Blocking, event_loop, run_sync
from nats_spark.server import EmbeddedServer, binary_version, find_server_binary
from nats_spark.spark.group_source import ledger, ledger_protocol
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator
from nats_spark.spark.group_source.driver.offsets import SourceOffset
from nats_spark.spark.group_source.ledger import (
    Ledger,
    LedgerBucket,
    LedgerConflict,
    Pointer,
    pointer_key,
    read_deliveries,
    read_head,
    read_pointer,
    write_pointer,
)
from nats_spark.spark.group_source.options import SourceOptions, parse_options
from nats_spark.spark.group_source.packed_heads import PACKED_FORMAT, packed_token
from nats_spark.spark.group_source.task.slot_entry import SlotEntry
from nats_spark.spark.group_source.task.slot_reader import read_slot

pytestmark = pytest.mark.spark

# Made by fixtures/make_previous_release.py with nats-spark a81f2fb (ledger format 1).
PREVIOUS_RELEASE = Path(__file__).with_name("fixtures") / "previous-release.tar.gz"
GROUP = "g"  # the priority group of the plain consumer


def publish_to_one_key(client: Blocking[NatsClient], stream: str, start: int, count: int) -> None:
    """Messages numbered `start`... all on one subject: one partition of a group gets them."""

    async def send() -> None:
        for i in range(start, start + count):
            await client.target.js.publish(f"{stream}.k0", str(i).encode())

    run_sync(send())


@pytest.mark.compat("4.0")
def test_slot_with_nothing_new_still_gets_its_acks(spark, client, nats_url, unique, tmp_path):
    """Both partitions read in a batch; then only one of them gets new messages. The other's
    committed messages are acked by an ack-only task, while the query runs."""
    stream = f"IDLE{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=2)
    publish(client, stream, 40)
    sink = Collector()
    query = foreach_batches(source(spark, nats_url, stream, "g"), sink, tmp_path / "cp")
    try:
        wait_until(lambda: len(sink.values) >= 40 or query.exception(), 120, "40 rows")
        publish_to_one_key(client, stream, 40, 20)
        wait_until(lambda: len(sink.values) >= 60 or query.exception(), 60, "60 rows")
        wait_until(lambda: unacked(client, stream, "g") == 0, 30, "both partitions acked")
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    assert_exactly_once(sink.values, 60)


@pytest.mark.compat("4.0")
def test_a_failed_query_acks_its_committed_batch_at_stop(spark, client, nats_url, unique, tmp_path):
    """Batch 0 is committed; batch 1, whose tasks would ack it, fails in the sink before they
    run. Spark then ends the source's driver process with SIGTERM, and the driver acks batch 0
    before it exits instead of leaving it to the next start."""
    stream = f"STOPACK{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=2)
    publish(client, stream, 40)
    read: list[int] = []

    def sink(batch: Any, batch_id: int) -> None:
        if batch_id:
            raise RuntimeError("the sink is down")  # before any task of the batch runs
        read.extend(int(r.data.decode()) for r in batch.select("data").collect())

    query = foreach_batches(source(spark, nats_url, stream, "g"), sink, tmp_path / "cp")
    try:
        wait_until(lambda: query.exception() is not None, 120, "batch 1 to fail")
    finally:
        query.stop()
    assert_exactly_once(read, 40)
    wait_until(lambda: unacked(client, stream, "g") == 0, 30, "batch 0 acked at stop")


def sink_down_after(rows: int, committed: list[int]) -> Callable[[Any, int], None]:
    """A foreachBatch sink that keeps payloads in `committed` and fails every batch with rows
    once it holds `rows` (as a driver killed there leaves it: logged, not committed)."""

    def sink(batch: Any, batch_id: int) -> None:
        payloads = [int(r.data.decode()) for r in batch.select("data").collect()]
        if payloads and len(committed) >= rows:
            raise RuntimeError("the sink is down")
        committed.extend(payloads)

    return sink


def run_until_it_fails(
    df: Any, sink: Callable[[Any, int], None], checkpoint: Any, run: str
) -> None:
    """Run `df` into `sink` until the query fails, then until its driver side has stopped (what
    the source does at stop is done then)."""
    query = foreach_batches(df, sink, checkpoint)
    try:
        wait_until(lambda: query.exception() is not None, 120, f"{run} to fail")
    finally:
        query.stop()
    wait_until(lambda: not source_runners(), 90, f"{run}'s driver side to stop")


@pytest.mark.compat("4.0")
def test_a_restart_acks_nothing_of_the_logged_batch_it_could_not_commit(
    spark, client, nats_url, unique, tmp_path
):
    """A batch fails in the sink after its tasks took its messages (as a driver killed there
    leaves it: logged, not committed); the query restarts from its checkpoint and the re-run
    fails too. Spark 4.0/4.1 call `partitions(latest, latest)` on that restart: when both runs
    have stopped, only the committed batches are acked."""
    stream = f"RERUN{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=2)
    publish(client, stream, 60)
    committed: list[int] = []
    sink = sink_down_after(40, committed)
    df = source(spark, nats_url, stream, "g", maxMessagesPerTrigger=20)
    run_until_it_fails(df, sink, tmp_path / "cp", "the first run")
    run_until_it_fails(df, sink, tmp_path / "cp", "the restarted run")
    assert len(committed) >= 40 and len(set(committed)) == len(committed)
    assert unacked(client, stream, "g") == 60 - len(committed), "acked before commit"


@pytest.mark.compat("4.0")
def test_a_new_checkpoint_reads_what_the_old_query_left_uncommitted(
    spark, client, nats_url, unique, tmp_path
):
    """A query stops with a batch its tasks took but Spark never committed (the sink failed);
    the next query on the group starts from a new checkpoint. That batch's messages are read
    again, once, whatever the Spark version (4.0/4.1 plan the first batch in the stored
    lineage: taken as the old query's, they were dropped as emitted and acked), and before
    newer messages of their keys (given back at once, not after their ack wait)."""
    stream = f"FRESH{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=2)
    publish(client, stream, 60)
    first: list[int] = []
    second: list[int] = []
    df = source(spark, nats_url, stream, "g", maxMessagesPerTrigger=20, ackWait="20s")
    run_until_it_fails(df, sink_down_after(40, first), tmp_path / "old", "the old query")
    assert len(first) == 40 and unacked(client, stream, "g") == 20
    publish(client, stream, 20, start=60)  # keys 3, 4 and 5 also have messages 40, 41 and 42

    def sink(batch: Any, batch_id: int) -> None:
        second.extend(int(r.data.decode()) for r in batch.select("data").collect())

    query = foreach_batches(df, sink, tmp_path / "new")
    try:
        wait_until(lambda: unacked(client, stream, "g") == 0, 60, "the left batch acked")
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted(first + second) == list(range(80)), "a message was lost or read twice"
    by_key: dict[int, list[int]] = {}
    for value in second:
        by_key.setdefault(value % 37, []).append(value)  # send_numbered's keys
    assert all(values == sorted(values) for values in by_key.values()), by_key


def test_far_off_trigger_keeps_committed_messages_from_coming_back(client, nats_url, unique):
    """A 1.5 s ack wait and a next batch (trigger) 5 s after the first: meanwhile the finished
    batch's messages wait for their acks, which the next batch's task sends. Another reader of
    the overflow consumer must not get them back in between; the next batch acks them. Driven
    through the batch coordinator as Spark calls it, so the gap between triggers is exact."""
    stream, name = f"FAR{unique}", "shared"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "overflow", group=GROUP, ack_wait=to_nanos(1.5))
    publish(client, stream, 10)
    options = {"servers": nats_url, "stream": stream, "consumer": name}
    reader = BatchCoordinator(parse_options({**options, "ledgerBucket": f"L{unique}"}))
    other = puller(client, stream, name, GROUP)

    def batch(start: SourceOffset) -> tuple[SourceOffset, list[int]]:
        end = run_sync(reader.latest_offset(start, None))
        rows = []
        for partition in run_sync(reader.partitions(start, end)):
            rows += seqs_of(read_slot(partition))
        return end, rows

    taken: list[Any] = []
    try:
        end, rows = batch(run_sync(reader.initial_offset()))
        assert rows == list(range(1, 11))
        deadline = time.monotonic() + 5  # more than three ack waits until the next trigger
        while time.monotonic() < deadline:
            taken += other.fetch(10, expires=0.5).messages
        assert taken == [], f"{len(taken)} messages of the finished batch came back"
        assert consumer_info(client, stream, name)["num_ack_pending"] == 10
        end, rows = batch(end)  # the next trigger: its task acks the first batch
        assert rows == []
        assert consumer_info(client, stream, name)["num_ack_pending"] == 0
    finally:
        run_sync(reader.close())
        run_sync(other.target.close())


def test_a_batch_run_again_after_a_restart_keeps_what_it_read(client, nats_url, unique):
    """After a restart Spark runs the logged batch again without a `latestOffset` before it:
    the restarted driver must keep what that batch's tasks sealed from then on, not from its
    next planning. Another reader of the overflow consumer (a 1.5 s ack wait) must not get
    them back while the batch's end is long in coming (seed 230 of the simulation's worlds
    with another client)."""
    stream, name = f"RERUN{unique}", "shared"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "overflow", group=GROUP, ack_wait=to_nanos(1.5))
    publish(client, stream, 10)
    options = parse_options(
        {"servers": nats_url, "stream": stream, "consumer": name, "ledgerBucket": f"L{unique}"}
    )
    before, restarted = BatchCoordinator(options), BatchCoordinator(options)
    other = puller(client, stream, name, GROUP)
    taken: list[Any] = []
    try:
        start = run_sync(before.initial_offset())
        end = run_sync(before.latest_offset(start, None))  # logged; the query stops
        run_sync(before.close())
        rows = []
        for partition in run_sync(restarted.partitions(start, end)):
            rows += seqs_of(read_slot(partition))
        assert rows == list(range(1, 11))
        deadline = time.monotonic() + 5  # more than three ack waits
        while time.monotonic() < deadline:
            taken += other.fetch(10, expires=0.5).messages
        assert taken == [], f"{len(taken)} messages of the re-run batch came back"
        assert consumer_info(client, stream, name)["num_ack_pending"] == 10
    finally:
        run_sync(restarted.close())
        run_sync(other.target.close())


@pytest.mark.compat("4.0")
def test_a_batch_spark_runs_again_after_a_restart_keeps_what_it_read(
    spark, client, nats_url, unique, tmp_path
):
    """The test above through Spark: batch 0 fails in the sink after its tasks read it (logged,
    its entries sealed, not committed); restarted on the checkpoint, Spark runs it again
    without a `latestOffset` before it, and the sink holds the re-run for over two ack waits
    while another reader of the overflow consumer pulls. The re-run's `partitions` started
    keeping its messages: the other reader gets none, and every message is emitted once."""
    ack_wait = 5.0  # Spark's restart must fit in it (1.7 s from the failure to the re-run)
    stream, name = f"HELD{unique}", "shared"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "overflow", group=GROUP, ack_wait=to_nanos(ack_wait))
    publish(client, stream, 20)
    other = puller(client, stream, name, GROUP)
    first: list[int] = []
    taken: list[int] = []  # what the other reader got while the re-run was held

    def fail_after_reading(rows: list[int]) -> None:
        first.extend(rows)
        raise RuntimeError("the sink failed after batch 0 was read")

    def pull_while_held(rows: list[int]) -> None:
        held_until = time.monotonic() + 2.5 * ack_wait
        while time.monotonic() < held_until:
            taken.extend(int(m.data.decode()) for m in other.fetch(20, expires=0.5).messages)

    def ack_pending() -> int:
        return consumer_info(client, stream, name)["num_ack_pending"]

    sink = Collector()
    sink.after_read[0] = fail_after_reading
    df = source(spark, nats_url, stream, consumer=name)
    try:
        run_until_it_fails(df, sink, tmp_path / "cp", "the first run")
        assert sorted(first) == list(range(20)), "batch 0 did not read all 20"
        sink.after_read[0] = pull_while_held
        query = foreach_batches(df, sink, tmp_path / "cp")
        try:
            wait_until(lambda: 0 in sink.batches or query.exception(), 120, "batch 0 run again")
            assert query.exception() is None, query.exception()
            assert taken == [], f"the other reader got {len(taken)} deliveries: {taken}"
            publish(client, stream, 10, start=20)  # the query goes on
            wait_until(lambda: len(sink.values) >= 30 or query.exception(), 60, "30 rows")
            wait_until(lambda: not ack_pending(), 30, "every message acked")
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
    finally:
        run_sync(other.target.close())
    assert sink.batches[0] == first, "the re-run emitted other rows than the first run"
    assert_exactly_once(sink.values, 30)


@pytest.mark.compat("4.0")
def test_a_batch_spark_runs_again_after_a_restart_pulls_for_the_consumer_s_ack_wait(
    spark, client, nats_url, unique, tmp_path
):
    """Batch 0 is logged and its sink fails before any task runs; then a holder takes all 10
    messages and keeps them. Restarted on the checkpoint, Spark runs batch 0 again without a
    `latestOffset` before it: its task finds nothing ready and waits (`fetchTimeout` 12 s), and
    the holder gives message 1 back as the task's waiting pull starts. The re-run's partitions
    carry the consumer's 3 s ack wait: that pull lasts a third of it, and the task's keeper then
    holds message 1; the sink holds the batch for two ack waits while another reader's pull
    waits behind the task's. The other reader gets nothing, the server delivers message 1 no
    more, and with the 9 the holder then gives back every message is emitted once. Planned
    with the option's 30 s (seed 782: the driver had not looked at the consumer), the pull
    waited 10 s with message 1 in it, kept by nothing, and the server gave it to the other
    reader."""
    ack_wait = 3.0  # under the longest pull the option's 30 s allows (10 s)
    stream, name = f"WAIT{unique}", "shared"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "overflow", group=GROUP, ack_wait=to_nanos(ack_wait))
    publish(client, stream, 10)
    df = source(spark, nats_url, stream, consumer=name, fetchTimeout="12s")

    def down(batch: Any, batch_id: int) -> None:
        raise RuntimeError("the sink is down")  # before any task of batch 0 runs

    run_until_it_fails(df, down, tmp_path / "cp", "the first run")
    holder, other = puller(client, stream, name, GROUP), puller(client, stream, name, GROUP)
    held = holder.fetch(10, expires=2).deliveries.replies
    assert len(held) == 10, "the holder did not take all 10"
    keeper = InProgressKeeper(client.target.nc, ack_wait, "holder")
    keeper.hold(range(10), held, time.monotonic())
    keeping = asyncio.run_coroutine_threadsafe(keeper.run(), event_loop())

    def delivered() -> int:
        return consumer_info(client, stream, name)["delivered"]["consumer_seq"]

    sink = Collector()
    sink.after_read[0] = lambda rows: time.sleep(2 * ack_wait)  # the sink holds the batch
    with waiting_pull_sent(client, stream, name) as waiting:
        query = foreach_batches(df, sink, tmp_path / "cp")
        try:
            assert waiting.wait(120), "batch 0 run again sent no waiting pull"
            keeper.release([0])
            run_sync(publish_acks(client.target.nc, [held[0]], kind=NAK))
            wait_until(lambda: delivered() == 11, 5, "message 1 at the task's pull", every=0.02)
            # Queued behind the task's pull, which the server serves first; lasting three ack
            # waits, it is first once a redelivery has moved the task's pull behind it.
            pulling = in_background(other, 10, expires=3 * ack_wait)
            wait_until(lambda: 0 in sink.batches or query.exception(), 60, "batch 0 committed")
            assert query.exception() is None, query.exception()
            taken = [int(m.data) for m in pulling.result(3 * ack_wait + 10).messages]
            assert taken == [], f"the other reader got {taken}"
            assert sink.batches[0] == [0]
            assert delivered() == 11, "message 1 was delivered again while its batch held it"
            keeper.stop()
            keeping.result(10)
            run_sync(publish_acks(client.target.nc, held[1:], kind=NAK))  # given back
            wait_until(lambda: len(sink.values) >= 10 or query.exception(), 60, "10 rows")
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
            keeper.stop()
            run_sync(holder.target.close())
            run_sync(other.target.close())
    assert_exactly_once(sink.values, 10)


def test_settled_entries_that_come_back_without_their_chunks_are_removed_again(
    client, nats_url, unique, monkeypatch
):
    """A server killed uncleanly can bring back ledger keys it had removed (a lost tombstone):
    under `chaos/run.py` the heads of 36 settled batches came back without their chunks, and
    every restart of the query failed on reading them. A restarted driver removes the entries
    of fenced gens whose chunks are gone again, and the query reads on. Driven through the
    batch coordinator as Spark 4.2+ calls it; the return is written back by hand."""
    monkeypatch.setattr(ledger_protocol, "SETTLE_SECONDS", 0.0)  # settled at the next look
    stream, name = f"BACK{unique}", "shared"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "overflow", group=GROUP, ack_wait=to_nanos(60))
    options = parse_options(
        {"servers": nats_url, "stream": stream, "consumer": name, "ledgerBucket": f"L{unique}"}
    )
    bucket = LedgerBucket(client.target, f"L{unique}")
    first, restarted = BatchCoordinator(options), BatchCoordinator(options)
    taken: list[int] = []

    def batch(reader: BatchCoordinator, start: SourceOffset) -> SourceOffset:
        end = run_sync(reader.latest_offset(start, None))
        for partition in run_sync(reader.partitions(start, end)):
            taken.extend(seqs_of(read_slot(partition)))
        return end

    try:
        start = run_sync(first.initial_offset())
        publish(client, stream, 5)
        start = batch(first, start)
        head_key = f"{start.lineage}.{start.gen}.{name}"
        head = run_sync(bucket.get(head_key)).value
        for count in range(3):  # acked by the next batch's task, then settled and removed
            publish(client, stream, 5, start=5 * (count + 1))
            start = batch(first, start)
        pointer = run_sync(read_pointer(bucket, pointer_key(stream, name)))
        assert pointer is not None and pointer.settled >= 1
        assert not run_sync(bucket.keys_matching(f"{head_key}.>"))
        run_sync(first.close())
        run_sync(bucket.put(head_key, head))  # back, without its chunks
        publish(client, stream, 5, start=20)
        batch(restarted, start)
        assert sorted(taken) == list(range(1, 26))
        assert run_sync(bucket.keys_matching(f"{start.lineage}.1.*")) == []
    finally:
        run_sync(first.close())
        run_sync(restarted.close())


def test_a_checkpoint_of_ledger_format_two_restarts_exactly_once(client, nats_url, unique):
    """A query of the release before ledger format 3 (no `inline` in its heads: every record in a
    chunk), stopped with its first batch committed and acked and its second logged, not
    committed: restarted on this release, the re-run of the second batch replays exactly what
    its format 2 entry holds, the next batch's task acks it (reading its chunk), and that batch
    is recorded in format 3. The previous release is this one without inline records, its
    pointer and heads numbered 2 (the heads once the query stopped): the bytes that release
    wrote. Driven through the batch coordinator as Spark 4.2+ calls it."""
    stream, name = f"FMT2{unique}", "shared"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "overflow", group=GROUP, ack_wait=to_nanos(60))
    options = parse_options(
        {"servers": nats_url, "stream": stream, "consumer": name, "ledgerBucket": f"L{unique}"}
    )
    bucket = LedgerBucket(client.target, f"L{unique}")
    emitted: dict[int, list[int]] = {}  # by gen, as the sink keeps a re-run's rows once

    def run(reader: BatchCoordinator, start: SourceOffset, end: SourceOffset) -> list[int]:
        emitted[end.gen] = [
            seq
            for partition in run_sync(reader.partitions(start, end))
            for seq in seqs_of(read_slot(partition))
        ]
        return emitted[end.gen]

    def head_of(gen: int) -> dict[str, Any]:
        return json.loads(run_sync(bucket.get(f"{first_offset.lineage}.{gen}.{name}")).value)

    previous = pytest.MonkeyPatch()
    previous.setattr(ledger, "LEDGER_FORMAT", 2)
    previous.setattr(ledger, "INLINE_BYTES", -1)
    first, restarted = BatchCoordinator(options), BatchCoordinator(options)
    try:
        first_offset = start = run_sync(first.initial_offset())
        publish(client, stream, 5)
        end = run_sync(first.latest_offset(start, None))
        assert run(first, start, end) == [1, 2, 3, 4, 5]
        publish(client, stream, 5, start=5)
        start, end = end, run_sync(first.latest_offset(end, None))  # the first one committed
        assert run(first, start, end) == [6, 7, 8, 9, 10]
        run_sync(first.close())  # acks the committed batch
        for key in run_sync(bucket.keys_matching(f"{first_offset.lineage}.*.*")):
            head = json.loads(run_sync(bucket.get(key)).value)
            run_sync(bucket.put(key, json.dumps({**head, "format": 2}).encode()))
        assert head_of(start.gen)["state"] == "acked"
        logged = head_of(end.gen)
        assert logged["format"] == 2 and logged["state"] == "sealed" and "inline" not in logged
        previous.undo()

        publish(client, stream, 5, start=10)
        assert run(restarted, start, end) == [6, 7, 8, 9, 10], "the re-run read anew"
        start, end = end, run_sync(restarted.latest_offset(end, None))
        assert run(restarted, start, end) == [11, 12, 13, 14, 15]
        assert head_of(start.gen)["state"] == "acked"
        recorded = head_of(end.gen)
        assert recorded["format"] == 3 and recorded["inline"] and not recorded["chunks"]
        run_sync(restarted.commit(end))
        run_sync(restarted.close())  # acks it
        assert sorted(seq for rows in emitted.values() for seq in rows) == list(range(1, 16))
        info = consumer_info(client, stream, name)
        assert (info["num_pending"], info["num_ack_pending"]) == (0, 0), "not all acked"
    finally:
        previous.undo()
        run_sync(first.close())
        run_sync(restarted.close())


def ten_held_a_minute(
    client: Blocking[NatsClient],
    url: str,
    stream: str,
    bucket: str,
    partitions: int = 1,
    **more: str,
) -> SourceOptions:
    """Options of a query reading 4 messages a slot (unless `more` says otherwise) from a plain
    consumer (a minute's ack wait) of a new stream holding 10."""
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, "shared", "overflow", group=GROUP, ack_wait=to_nanos(60))
    publish(client, stream, 10)
    return parse_options(
        {
            "servers": url,
            "stream": stream,
            "consumer": "shared",
            "numPartitions": str(partitions),
            "ledgerBucket": bucket,
            "maxMessagesPerPartition": "4",
            **more,
        }
    )


def read_batches_until(reader: BatchCoordinator, start: SourceOffset, count: int) -> list[int]:
    """The stream sequences the reader's batches from `start` read, until `count` (at most 4
    batches), as Spark 4.2+ calls it."""
    taken: list[int] = []
    for _ in range(4):
        end = run_sync(reader.latest_offset(start, None))
        for part in run_sync(reader.partitions(start, end)):
            taken += seqs_of(read_slot(part))
        start = end
        if len(taken) >= count:
            break
    return taken


def test_a_new_checkpoint_gives_back_what_a_stopped_attempt_left_open(client, nats_url, unique):
    """A task attempt stopped mid-batch leaves its ledger entry open and its messages held (a
    minute's ack wait). A query on a new checkpoint takes the entry from that attempt (were it
    still recording, its next write would fail), NAKs what it holds and removes it: the
    messages come back at once, and its first batch reads them all, in order. Driven through
    the offset reader as Spark 4.2+ calls it."""
    stream = f"OPEN{unique}"
    options = ten_held_a_minute(client, nats_url, stream, f"L{unique}")
    old, new = BatchCoordinator(options), BatchCoordinator(options)
    try:
        start = run_sync(old.initial_offset())
        [partition] = run_sync(old.partitions(start, run_sync(old.latest_offset(start, None))))
        rows = read_slot(partition)
        assert seqs(next(rows)) == [1, 2, 3, 4]
        rows.close()  # Spark stopped the task: the entry stays open
        assert consumer_info(client, stream, "shared")["num_ack_pending"] == 4
        start = run_sync(new.initial_offset())  # no offsets: a new lineage replaces the old
        taken = read_batches_until(new, start, 10)
        assert taken == list(range(1, 11))
        assert run_sync(Ledger(new.ledger.kv, partition.lineage).heads()) == []
    finally:
        run_sync(old.close())
        run_sync(new.close())


def test_a_recorded_message_that_came_again_to_a_given_back_attempt_is_given_back_too(
    client, nats_url, unique
):
    """A stopped query's task attempt still pulls while a query on a new checkpoint gives its
    entry back (NAKs what it recorded, removes it): the NAKed messages come back to that
    attempt's next pull, which drops them as its own, and its next write fails on the removed
    entry. It gives them back too as it fails: else they would wait out their ack wait (a
    minute), behind the newer messages the new query reads (seed 727 of the simulation's
    worlds whose query is stopped mid-batch and replaced at once)."""
    stream = f"AGAIN{unique}"
    options = replace(
        ten_held_a_minute(client, nats_url, stream, f"L{unique}"),
        max_messages_per_partition=8,
        fetch_batch_size=2,
    )
    old, new = BatchCoordinator(options), BatchCoordinator(options)
    try:
        start = run_sync(old.initial_offset())
        [partition] = run_sync(old.partitions(start, run_sync(old.latest_offset(start, None))))
        rows = read_slot(partition)
        assert seqs(next(rows)) == [1, 2]  # recorded in its entry
        start = run_sync(new.initial_offset())
        end = run_sync(new.latest_offset(start, None))
        parts = run_sync(new.partitions(start, end))  # its first batch gives the entry back
        with pytest.raises(LedgerConflict):  # recorded ones again (its own: dropped), then a
            for _ in rows:  # write on the removed entry
                pass
        taken = [seq for part in parts for seq in seqs_of(read_slot(part))]
        taken += read_batches_until(new, end, 10 - len(taken))
        assert taken == list(range(1, 11))
    finally:
        run_sync(old.close())
        run_sync(new.close())


def test_a_new_checkpoint_gives_back_past_an_entry_that_took_nothing(client, nats_url, unique):
    """Of an earlier query's batch, one task attempt took messages and was stopped, another
    created its entry and died before it took any. The new checkpoint's give-back NAKs what the
    first holds all the same: they come back at once, and its batches read them in order. It
    failed on the empty entry once, after it had removed both and before it NAKed a message
    (the simulation's seeds 1132 and 4307). Driven through the offset reader as Spark 4.2+
    calls it."""
    options = ten_held_a_minute(client, nats_url, f"EMPTY{unique}", f"L{unique}", 2)
    old, new = BatchCoordinator(options), BatchCoordinator(options)
    try:
        start = run_sync(old.initial_offset())
        took, empty = run_sync(old.partitions(start, run_sync(old.latest_offset(start, None))))
        rows = read_slot(took)
        assert seqs(next(rows))  # held for a minute from now
        rows.close()  # Spark stopped the task: the entry stays open
        run_sync(SlotEntry(shared_client(empty.reading.connection), empty).claim())
        start = run_sync(new.initial_offset())  # no offsets: a new lineage replaces the old
        taken = read_batches_until(new, start, 10)
        assert sorted(taken) == list(range(1, 11))
        assert run_sync(Ledger(new.ledger.kv, took.lineage).heads()) == []
    finally:
        run_sync(old.close())
        run_sync(new.close())


@pytest.mark.parametrize("outlived_by", ["a settled batch", "a given-back lineage"])
def test_a_driver_that_adopts_a_lineage_clears_what_outlived_attempts_left(
    client, nats_url, unique, outlived_by
):
    """What task attempts left after they outlived their entries, in a gen the pointer fences
    as settled, or of a lineage the pointer keeps as retired (given back): an OPEN entry, and
    a chunk whose head is gone. No batch seals, acks or settles either; the driver that next
    adopts a lineage gives the entry back and removes the chunk
    (`DriverLedger.give_back_outlived`). An attempt killed before its fence check holds
    nothing; here the entry holds 4 or 8 messages (a minute's ack wait), so that the give-back is
    seen on the server: they come back at once and the restarted query's batches read them,
    each once (left, they would wait out the minute and count as the query's own). The chunk
    is one an attempt wrote after its entry was settled, then found its head write failing and
    was killed before it removed it (the simulation's seed 1860); no head names it, and it
    stayed for good; so did a packed key created empty (a packed task's heads are written
    into a key created empty first) by an attempt killed before its first section. The slot
    may take 10 in pulls of 4: neither its first record nor the next
    (in flight as Spark closes the task) is its last, so neither seals the entry with it, and
    the attempt closed after the first leaves it OPEN."""
    stream = f"OUTLIVED{unique}"
    options = ten_held_a_minute(
        client,
        nats_url,
        stream,
        f"L{unique}",
        maxMessagesPerPartition="10",
        fetchBatchSize="4",
    )
    old, restarted = BatchCoordinator(options), BatchCoordinator(options)
    try:
        start = run_sync(old.initial_offset())
        end = run_sync(old.latest_offset(start, None))
        [partition] = run_sync(old.partitions(start, end))
        rows = read_slot(partition)
        assert seqs(next(rows)) == [1, 2, 3, 4]
        rows.close()  # the entry stays open, holding them
        kv, key = old.ledger.kv, old.ledger.pointer_key
        headless = f"{Ledger(kv, end.lineage).head_key(end.gen, 'partition-9')}.a1.0"
        run_sync(kv.put(headless, b"deliveries"))
        # a packed key created empty by an attempt killed before its first section (of the
        # fenced batch), and one of a batch past the fence, which a live task may be writing
        empty, live = (f"{end.lineage}.{gen}.{packed_token(0)}" for gen in (end.gen, end.gen + 9))
        for packed in (empty, live):
            run_sync(kv.put(packed, json.dumps({"format": PACKED_FORMAT, "sections": {}}).encode()))
        pointer = run_sync(read_pointer(kv, key))
        assert pointer is not None and pointer.lineage == end.lineage
        if outlived_by == "a settled batch":  # batch 1 committed and settled, created again
            restart = end
            run_sync(write_pointer(kv, key, replace(pointer, settled=end.gen)))
        else:  # a query on a new checkpoint gave the lineage back, then it was created again
            restart = SourceOffset.initial(f"{end.lineage}-new")
            run_sync(write_pointer(kv, key, Pointer(restart.lineage, 0, retired=[end.lineage])))
        run_sync(old.close())
        # the first record's 4 at least (the next one's if its write was under way at the
        # close; what it did not record is NAKed as it closes)
        assert consumer_info(client, stream, "shared")["num_ack_pending"] >= 4
        taken = read_batches_until(restarted, restart, 10)
        assert sorted(taken) == list(range(1, 11)), "a message was held, lost or read twice"
        left = run_sync(Ledger(restarted.ledger.kv, end.lineage).heads())
        assert (end.gen, partition.slot) not in left
        kept = run_sync(restarted.ledger.kv.keys_matching(f"{end.lineage}.>"))
        assert headless not in kept and empty not in kept
        assert (live in kept) == (outlived_by == "a settled batch")  # a given-back lineage goes
    finally:
        run_sync(old.close())
        run_sync(restarted.close())


def test_a_task_closed_mid_batch_gives_back_what_it_did_not_record(client, nats_url, unique):
    """A task attempt pulling in twos is closed after its first rows (Spark stops reading it):
    it lets its ledger write in flight finish and NAKs what it pulled and did not record: only
    what its entry holds stays with it (a minute's ack wait), the rest is another reader's at
    once."""
    stream, name = f"CLOSED{unique}", "shared"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "overflow", group=GROUP, ack_wait=to_nanos(60))
    publish(client, stream, 20)
    options = {"servers": nats_url, "stream": stream, "consumer": name, "fetchBatchSize": "2"}
    reader = BatchCoordinator(parse_options({**options, "ledgerBucket": f"L{unique}"}))
    other = puller(client, stream, name, GROUP)
    try:
        start = run_sync(reader.initial_offset())
        [partition] = run_sync(
            reader.partitions(start, run_sync(reader.latest_offset(start, None)))
        )
        rows = read_slot(partition)
        assert seqs(next(rows)) == [1, 2]
        rows.close()
        ledger = Ledger(reader.ledger.kv, partition.lineage)
        head, _ = run_sync(read_head(ledger, partition.gen, partition.slot))
        recorded = run_sync(read_deliveries(ledger, head)).stream_seq
        rest = [int(m.data.decode()) + 1 for m in other.fetch(20, expires=2).messages]
        assert sorted(recorded + rest) == list(range(1, 21))
    finally:
        run_sync(reader.close())
        run_sync(other.target.close())


@pytest.mark.compat("4.0")
@pytest.mark.parametrize("packing", [{}, {"maxTasksPerBatch": 2}], ids=["", "packed"])
def test_restart_from_a_previous_release_checkpoint(spark, tmp_path, packing):
    """A checkpoint, sink files and JetStream store left by the previous release (a81f2fb,
    ledger format 1) after two kill -9s: batch 0 committed (its acks sent by the next run), batch
    1 logged and written to the sink but not committed. This release re-runs batch 1 from its
    format-1 entries (the same rows in the same order), acks them, and reads on: every message
    once, none left unacked; and it removes the bucket's 7-day max age. Once the fixture's ledger
    is older than that, the server has expired it when it starts, before any client: then the
    query stops with the data-loss error (its committed batch 0 is unacked), never a duplicate.
    Restarted with `maxTasksPerBatch`, the logged batch (whose offset has no packing) re-runs a
    task per slot as it ran, and the batches after it are packed."""
    with tarfile.open(PREVIOUS_RELEASE) as tar:
        tar.extractall(tmp_path, filter="data")
        ledger = tar.getmember("jetstream/jetstream/$G/streams/KV_nats-spark-ledger/msgs/1.blk")
    expired = time.time() - ledger.mtime > 7 * 24 * 3600  # the previous release's max age
    earlier = {
        int(f.stem.removeprefix("batch-")): json.loads(f.read_text())
        for f in (tmp_path / "out").glob("batch-*.json")
    }
    assert sorted(earlier) == [0, 1]
    with EmbeddedServer(store_dir=tmp_path / "jetstream") as server:
        client = open_blocking(ConnectionSettings(servers=(server.url,)))
        publish(client, "PREV", 50, start=250)
        sink = Collector()
        query = foreach_batches(
            source(spark, server.url, "PREV", "g", **packing), sink, tmp_path / "cp"
        )
        try:
            if expired:
                wait_until(query.exception, 120, "the data-loss error")
                assert "lost the entries of committed batch 1" in str(query.exception())
                assert not sink.values
                return
            wait_until(
                lambda: len(earlier[0]) + len(sink.values) >= 300 or query.exception(),
                120,
                "300 rows",
            )
            wait_until(lambda: unacked(client, "PREV", "g") == 0, 60, "every partition acked")
            assert query.exception() is None, query.exception()
            assert run_sync(client.api.stream_info("KV_nats-spark-ledger")).max_age == 0
        finally:
            query.stop()
            run_sync(client.target.close())
    assert sink.batches[1] == earlier[1], "the re-run of batch 1 differs from its first run"
    assert_exactly_once(earlier[0] + sink.values, 300)


def test_v2_ack_subjects_are_rebuilt_and_accepted(tmp_path, unique):
    """A server with a JetStream domain that sends v2 ack subjects (`$JS.ACK.<domain>.<account
    hash>.<stream>.<consumer>...`, feature flag js_ack_fc_v2): the ledger keeps that prefix, and
    the acks rebuilt from it and the entry's numbers are accepted."""
    if binary_version(find_server_binary()) < (2, 14, 0):
        pytest.skip("the v2 ack subjects' feature flag needs nats-server 2.14+")
    config = tmp_path / "v2.conf"
    config.write_text("jetstream { domain: hub }\nfeature_flags { js_ack_fc_v2: true }\n")
    with EmbeddedServer(config_file=config) as server:
        settings = ConnectionSettings(servers=(server.url,))
        client = open_blocking(settings)
        try:
            slot = Slot(client, settings, unique)
            publish(client, slot.stream, 10)
            assert seqs_of(read_slot(slot.partition(1, limit=10))) == list(range(1, 11))
            head, _ = run_sync(read_head(slot.ledger, 1, "m1"))
            assert head.prefix.startswith("$JS.ACK.hub.") and len(head.prefix.split(".")) == 6
            assert seqs_of(read_slot(slot.partition(2, limit=0, committed=(1,)))) == []
            wait_until(lambda: unacked(client, slot.stream, "g") == 0, 10, "the v2 acks")
        finally:
            close_shared_clients()  # the tasks' connection, before its server stops
            run_sync(client.target.close())
