"""The driver of test_driver_kills.py's tests: a foreachBatch query over group `g` that
writes each batch's payload numbers to `<out>/batch-<id>.json` (atomically; a re-run rewrites its
batch's file), and SIGKILLs its own process group (itself and its JVM) at one point of the first
batch with rows:

- `pulling`: from a UDF on the rows, while the batch's tasks still run
- `after_sink`: in foreachBatch, after the file was written, before Spark's commit log
- `after_commit_log`: once a query with trigger `once` has ended: after the commit log of its
  batch, before the acks (which only the next batch's planning would send)
- anything else: never

    python fault_driver.py URL STREAM OUT CHECKPOINT KILL_AT TRIGGER (an interval or once)
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def main(url: str, stream: str, out: str, checkpoint: str, kill_at: str, trigger: str) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, udf

    from nats_spark.spark.group_source.source import NatsPcgDataSource
    from nats_spark.spark.registration import register_source
    from nats_spark.spark.shared.options import parse_duration

    group = os.getpgid(0)  # the session the test started: this process and the JVM

    def die() -> None:
        os.killpg(group, signal.SIGKILL)

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register_source(spark, NatsPcgDataSource)  # Spark 4.0/4.1 refuse it if found by themselves
    df = (
        spark.readStream.format("nats-pcg")
        .option("servers", url)
        .option("stream", stream)
        .option("group", "g")
        .option("maxMessagesPerTrigger", "100")
        .load()
    )
    if kill_at == "pulling":

        @udf("long")
        def kill_on_first_row(seq: int) -> int:
            die()  # runs in a Python worker of this driver's JVM
            return seq

        df = df.withColumn("stream_seq", kill_on_first_row(col("stream_seq")))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)

    def write(batch, batch_id: int) -> None:
        values = [int(r.data.decode()) for r in batch.select("data").collect()]
        if not values:
            return
        temporary = folder / f".batch-{batch_id}.json"
        temporary.write_text(json.dumps(values))
        os.replace(temporary, folder / f"batch-{batch_id}.json")
        if kill_at == "after_sink":
            die()

    writer = df.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
    if trigger == "once":
        writer = writer.trigger(once=True)
    else:
        millis = round(parse_duration("trigger", trigger) * 1000)
        writer = writer.trigger(processingTime=f"{millis} milliseconds")
    query = writer.start()
    print("query started", flush=True)
    query.awaitTermination()
    if kill_at == "after_commit_log":
        die()


if __name__ == "__main__":
    main(*sys.argv[1:7])
