"""The driver of test_sink.py's output test: a batch write of one probe row to stream T (short
duplicate window), then a streaming write to T whose rows from value 5 on go to a subject no
stream captures, on a Spark with task retries as on a cluster (`local[2,4]`) and Spark's default
WARN logging; prints the error the query ends with after `QUERY FAILED:`.

    python sink_refusal_driver.py URL STREAM CHECKPOINT
"""

from __future__ import annotations

import sys


def main(url: str, stream: str, checkpoint: str) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, when

    spark = (
        SparkSession.builder.master("local[2,4]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    probe = spark.createDataFrame([(f"{stream}.probe", "")], "subject STRING, data STRING")
    probe.write.format("nats").mode("append").option("servers", url).save()
    rows = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    subject = when(col("value") < 5, f"{stream}.ok").otherwise("nowhere.b")
    query = (
        rows.select(subject.alias("subject"), col("value").cast("string").alias("data"))
        .writeStream.format("nats")
        .option("servers", url)
        .option("stream", stream)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        query.awaitTermination(120)
    except Exception as error:
        print(f"QUERY FAILED: {error}", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
