"""availableNow reads every message available when it starts: also what an earlier query (on
another checkpoint) or a killed task attempt of this one held unrecorded or unacked."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import (
    SPARK_VERSION,
    Collector,
    assert_exactly_once,
    batches_logged,
    kill_group,
    publish,
    python_workers,
    reading,
    source,
    source_runners,
    start_job,
    static_group,
    unacked,
    unpinned,
    wait_until,
)

from nats_spark.loop import run_sync
from nats_spark.spark.group_source.ledger import Ledger, pointer_key, read_pointer
from nats_spark.spark.group_source.options import SourceOptions

pytestmark = pytest.mark.spark

SPARK_MASTER = "local[2,3]"  # task retries, as on a cluster


def pins_named(client: Any, stream: str) -> bool:
    """Whether the pointer of group `g` of `stream` in the default ledger bucket names a pin
    (a driver learns its tasks' pins when it plans its next batch)."""

    async def named() -> bool:
        kv = await Ledger.bucket(client.target, SourceOptions.ledger_bucket, create=False)
        pointer = await read_pointer(kv, pointer_key(stream, "g"))
        return pointer is not None and bool(pointer.pins)

    return run_sync(named())


def start_available_now(df: Any, sink: Collector, checkpoint: Any) -> Any:
    """Start `df` into `sink` (foreachBatch) with Trigger.AvailableNow."""
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    return writer.trigger(availableNow=True).start()


def ended(query: Any, timeout: float = 180) -> None:
    """Wait for an availableNow run to end by itself."""
    try:
        assert query.awaitTermination(timeout), "the availableNow run did not end"
    finally:
        query.stop()


def available_now(df: Any, sink: Collector, checkpoint: Any) -> None:
    """Run `df` into `sink` with Trigger.AvailableNow until it ends."""
    ended(start_available_now(df, sink, checkpoint))


def kill_python_workers() -> None:
    """SIGKILL the Python workers the pyspark daemon forked (the tasks' readers die mid-way,
    as on a lost executor; Spark retries them)."""
    workers = set(python_workers())
    for pid in workers:
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue  # ended meanwhile
        if parent in workers:
            os.kill(pid, signal.SIGKILL)


def failing_run(df: Any, checkpoint: Any) -> None:
    """A query whose first batch with rows fails in its sink after its tasks took them (logged,
    never committed), left stopped with its messages held."""

    def sink(batch: Any, batch_id: int) -> None:
        if batch.count():
            raise RuntimeError("the sink is down")

    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    query = query.trigger(processingTime="200 milliseconds").start()
    try:
        wait_until(lambda: query.exception() is not None, 120, "the old query to fail")
    finally:
        query.stop()
    wait_until(lambda: not source_runners(), 90, "the old query's driver side to stop")


@pytest.mark.compat("4.0")
def test_available_now_on_a_new_checkpoint_reads_what_an_old_query_held(
    spark, client, nats_url, unique, tmp_path
):
    """A query's batch fails in its sink after its tasks took all 100 messages, and the query
    stops. An availableNow run on a new checkpoint reads all of them (on Spark 4.0/4.1, whose
    one batch gives them back, the run after it does), without waiting for the old pins."""
    stream = f"AN{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=2)
    publish(client, stream, 100)
    df = source(spark, nats_url, stream, "g", ledgerBucket=f"L{unique}")
    failing_run(df, tmp_path / "old")
    assert unacked(client, stream, "g") == 100
    sink = Collector()
    available_now(df, sink, tmp_path / "new")
    if SPARK_VERSION < (4, 2):  # one batch, which gives them back: the next run reads them
        assert sink.values == []
        available_now(df, sink, tmp_path / "new")
    assert_exactly_once(sink.values, 100)


@pytest.mark.compat
@pytest.mark.skipif(
    SPARK_VERSION < (4, 2), reason="Spark 4.0/4.1 run availableNow as one batch (README)"
)
def test_available_now_waits_for_what_a_killed_task_held(spark, client, nats_url, unique, tmp_path):
    """The run's Python workers are killed while its tasks pull (pulls of 5, so that some are
    in flight): what they took and had not recorded comes back only once its ack wait (30 s)
    runs out, while the retries read on. The run waits for it (its consumers show it
    ack-pending beyond what the ledger holds) and ends with every message read once."""
    stream = f"AK{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=2)
    publish(client, stream, 1500)
    sink = Collector()
    df = source(spark, nats_url, stream, "g", fetchBatchSize=5, ledgerBucket=f"L{unique}")
    query = start_available_now(df, sink, tmp_path / "cp")
    try:
        reading(client, stream, "g", "m1")
        kill_python_workers()
    finally:
        ended(query)
    assert_exactly_once(sink.values, 1500)
    assert unacked(client, stream, "g") == 0


@pytest.mark.compat
@pytest.mark.skipif(
    SPARK_VERSION < (4, 2),
    reason="Spark 4.0/4.1 plan a new checkpoint's first batch in the stored lineage, whose pins "
    "they resume (README)",
)
@pytest.mark.parametrize(
    "planned_on", [True, False], ids=["planned-on", "killed-before-planning-on"]
)
def test_available_now_does_not_wait_out_a_killed_query_s_pin(
    spark, client, nats_url, unique, tmp_path, planned_on
):
    """A query (its own process) reads m1 and holds its pin (the priority timeout is its ack
    wait, 60 s) when its whole process group is killed with kill -9: it never releases the pin.
    An availableNow run on a new checkpoint finds the dead query's presence record stale and
    releases the pin: it reads the 100 messages published since and ends before the pin would
    have timed out (before: it stood by and ended with none). Killed before its driver planned
    past its first batch (triggers a day apart), the query's pointer does not name the pin its
    task took, only the batch's ledger entry does: the run takes the pins of the last query's
    newest entries as that query's too, and also reads the 100 that batch took (given back:
    never acked); before, it stood by until the pin timed out."""
    stream = f"AP{unique}"
    static_group(client, stream, "g", ["m1"], partitions=1)
    publish(client, stream, 100)
    out, log = tmp_path / "out", tmp_path / "job.log"
    trigger = "200ms" if planned_on else "24h"  # Spark runs the next at midnight UTC
    job = start_job(nats_url, stream, out, tmp_path / "old", log, "ackWait=60s", trigger=trigger)
    try:
        wait_until(lambda: batches_logged(log) >= 1, 180, "the old query's first batch")
        if planned_on:
            wait_until(
                lambda: pins_named(client, stream) and unacked(client, stream, "g") == 0,
                60,
                "the old query to ack its batch and its pointer to name its pin",
            )
        else:
            assert not pins_named(client, stream)
        assert not unpinned(client, stream, "g")
    finally:
        kill_group(job)
    killed = time.monotonic()  # the pin times out 60 s after the old query's last pull, or sooner
    publish(client, stream, 100, start=100)
    sink = Collector()
    df = source(spark, nats_url, stream, "g", ackWait="60s")
    available_now(df, sink, tmp_path / "new")
    took = time.monotonic() - killed
    first = 100 if planned_on else 0
    assert sorted(sink.values) == list(range(first, 200)), f"read {len(sink.values)}"
    assert took < 55, f"the run ended {took:.0f} s after the kill: it waited out the pin"
