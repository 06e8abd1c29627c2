"""The connector under Spark: availableNow throughput into a `noop` sink, and per-batch latency
with a processingTime trigger under a steady load."""

from __future__ import annotations

import tempfile
import threading
import time
from datetime import datetime
from typing import Any

from bench.common import KEYS, ProcessSampler, percentile, publish
from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.loop import run_sync
from nats_spark.spark.local_session import local_session


def spark_session(master: str = "local[2]") -> Any:
    """A local session like the tests' (UI off, loopback only); workers use this interpreter."""
    return local_session("nats-spark-bench", master)


def reader(
    spark: Any,
    url: str,
    stream: str,
    group: str,
    options: dict[str, Any],
    source: str = "nats-pcg",
) -> Any:
    reader = spark.readStream.format(source).option("servers", url)
    reader = reader.option("stream", stream).option("group", group)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def noop_query(df: Any, checkpoint: str, **trigger: Any) -> Any:
    return (
        df.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .start()
    )


def available_now(
    spark: Any,
    url: str,
    stream: str,
    group: str,
    expected: int,
    options: dict[str, Any],
    sample_every: float = 0.2,
) -> dict[str, Any]:
    """Read everything `stream` holds through `group` into a noop sink; time it end to end, and
    from the start of the first batch (Spark's query start-up left out, as the baseline leaves
    out its connect) to the end (the final commit's acks included)."""
    with tempfile.TemporaryDirectory(prefix="nats-spark-bench-") as checkpoint:
        with ProcessSampler(sample_every) as sampler:
            started = time.perf_counter()
            query = noop_query(
                reader(spark, url, stream, group, options), checkpoint, availableNow=True
            )
            query.awaitTermination()
            ended = time.time()
            elapsed = time.perf_counter() - started
        progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    batches = [p for p in progress if p["numInputRows"]]
    batch_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in batches)
    if rows != expected:
        raise RuntimeError(f"{group}: read {rows} rows, expected {expected}")
    first_batch = datetime.fromisoformat(progress[0]["timestamp"]).timestamp()
    return {
        "messages": rows,
        "seconds": round(elapsed, 2),
        "msgs_per_s": round(rows / elapsed),
        "query_start_seconds": round(elapsed - (ended - first_batch), 2),
        "msgs_per_s_from_first_batch": round(rows / (ended - first_batch)),
        "batches": len(batches),
        "msgs_per_s_in_batches": round(rows / (batch_ms / 1000)) if batch_ms else None,
        "peak_rss": sampler.mib(),
        "cpu_us_per_msg": sampler.cpu_us_per_msg(rows),
        "cpu_seconds": sampler.cpu_seconds(),
    }


def publish_steadily(
    url: str, stream: str, rate: int, seconds: float, size: int, keys: int = KEYS
) -> float:
    """Publish `rate` messages/s for `seconds` over `keys` subjects, each confirmed by
    JetStream; returns the rate reached."""

    async def run() -> float:
        client = await NatsClient.open(ConnectionSettings(servers=(url,)))
        try:
            return await publish(client, stream, round(rate * seconds), size, keys, rate=rate)
        finally:
            await client.close()

    return run_sync(run())


def latency(
    spark: Any,
    url: str,
    stream: str,
    group: str,
    rate: int,
    seconds: float,
    trigger: str,
    options: dict[str, Any],
    size: int = 100,
) -> dict[str, Any]:
    """Per-batch time (`durationMs.triggerExecution`) under a steady load of `rate` msgs/s."""
    with tempfile.TemporaryDirectory(prefix="nats-spark-bench-") as checkpoint:
        query = noop_query(
            reader(spark, url, stream, group, options), checkpoint, processingTime=trigger
        )
        publisher = threading.Thread(
            target=publish_steadily, args=(url, stream, rate, seconds, size), daemon=True
        )
        publisher.start()
        publisher.join()
        time.sleep(3)  # let the last batches drain
        progress = query.recentProgress
        query.stop()
    warm = [p for p in progress if p["numInputRows"]][2:]  # skip query start-up batches
    durations = [p["durationMs"]["triggerExecution"] for p in warm]
    rows = [p["numInputRows"] for p in warm]
    parts = ("latestOffset", "addBatch", "walCommit", "commitOffsets")
    return {
        "rate_msgs_per_s": rate,
        "seconds": seconds,
        "trigger": trigger,
        "batches": len(durations),
        "rows_per_batch_p50": percentile(rows, 0.5),
        "batch_ms_p50": percentile(durations, 0.5),
        "batch_ms_p99": percentile(durations, 0.99),
        "batch_ms_max": max(durations, default=None),
        "p50_ms_by_phase": {
            part: percentile([p["durationMs"].get(part, 0) for p in warm], 0.5) for part in parts
        },
    }
