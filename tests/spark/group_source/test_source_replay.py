"""Task retries and re-runs of logged batches replay exactly what the ledger recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from spark_helpers import (
    assert_exactly_once,
    publish,
    settled,
    source,
    static_group,
    wait_until,
)

pytestmark = [pytest.mark.spark, pytest.mark.compat("4.0")]

SPARK_MASTER = "local[2,3]"  # two cores, up to three attempts per task
# a task per partition (the default), or the 4 partitions packed into tasks that each read several
PACKINGS = pytest.mark.parametrize("packing", [{}, {"maxTasksPerBatch": 2}], ids=["", "packed"])


@PACKINGS
def test_failed_task_is_retried_exactly_once(spark, client, nats_url, unique, tmp_path, packing):
    from pyspark import TaskContext
    from pyspark.sql.functions import col, udf

    stream = f"T{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 400)
    marker = tmp_path / "failed"

    @udf("long")
    def fail_first_attempt(seq, member):
        # The first attempt of m1's task dies after its reader has taken and recorded messages
        # (packed, with it the other slots of its task, wherever they are).
        if member == "m1" and TaskContext.get().attemptNumber() == 0:
            Path(str(marker)).touch()
            raise RuntimeError("injected task failure")
        return seq

    seen: list[int] = []

    def collect(batch, batch_id):
        seen.extend(int(r.data.decode()) for r in batch.select("data").collect())

    df = source(spark, nats_url, stream, "g", fetchBatchSize=20, **packing)
    query = (
        df.withColumn("stream_seq", fail_first_attempt(col("stream_seq"), col("member")))
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: len(seen) >= 400, 90, "400 rows")
        wait_until(lambda: settled(client, stream), 30, "acks")
        assert query.exception() is None
    finally:
        query.stop()
    assert marker.exists(), "no task failed: the test did not inject its failure"
    assert_exactly_once(seen, 400)


@pytest.mark.parametrize("packing", [{}, {"maxTasksPerBatch": 1}], ids=["", "packed"])
def test_rerun_of_a_logged_batch_replays_the_same_rows(
    spark, client, nats_url, unique, tmp_path, packing
):
    """Packed into one task, the re-run emits the same rows in the same order (the nats sink's
    ids are batch/partition/row)."""
    stream = f"D{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 300)
    attempts: dict[int, list[list[tuple[str, int]]]] = {}
    fail = [True]

    tasks: set[int] = set()  # the input partitions batches had

    def record(batch, batch_id):
        from pyspark.sql.functions import spark_partition_id

        read = batch.select("member", "stream_seq", spark_partition_id().alias("task")).collect()
        rows = [(r.member, r.stream_seq) for r in read]
        tasks.update(r.task for r in read)
        attempts.setdefault(batch_id, []).append(rows)
        if fail[0]:
            raise RuntimeError("sink failed after the batch was read")

    def run():
        return (
            source(spark, nats_url, stream, "g", maxMessagesPerTrigger=120, **packing)
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def rows_committed() -> int:
        return sum(len(tries[-1]) for tries in attempts.values())

    failing = run()
    with pytest.raises(Exception, match="sink failed"):
        failing.awaitTermination(120)
    publish(client, stream, 50, start=300)  # new messages must not leak into the re-run
    fail[0] = False
    query = run()
    try:
        wait_until(lambda: rows_committed() >= 350, 90, "350 rows")
        wait_until(lambda: settled(client, stream), 30, "acks")
    finally:
        query.stop()
    first, again = attempts[0]
    for member in ("m1", "m2"):
        assert [s for m, s in again if m == member] == [s for m, s in first if m == member]
    assert sorted(again) == sorted(first)
    if packing:
        assert again == first
        assert tasks == {0}
    else:
        assert len(tasks) == 4
    every = [s for batch_id, tries in attempts.items() for m, s in tries[-1]]
    assert_exactly_once([s - 1 for s in every], 350)
