"""Helpers for Spark source tests: groups with streams, publishing, queries and checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyspark

from nats_spark.client import NatsClient
from nats_spark.loop import Blocking, run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.config import PartitioningFilter
from nats_spark.pcg.consumers import member_consumer
from nats_spark.pcg.store import load_group

SPARK_VERSION = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
# Spark 4.2+ passes the committed start offset to latestOffset, so the source acks a query's last
# batch before it stops; older versions leave it to the next start (DESIGN guarantee 6).
ACKS_LAST_BATCH = SPARK_VERSION >= (4, 2)
# Spark 4.2+ reports reportLatestOffset() (per-member lag and pin status) in progress.
REPORTS_LAG = SPARK_VERSION >= (4, 2)


def static_group(
    client: Blocking[NatsClient], stream: str, group: str, members: list[str], partitions: int
) -> None:
    """A stream `<stream>` over `<stream>.*` storing `<p>.<subject>`, and a balanced group."""
    run_sync(
        client.api.create_stream(
            {
                "name": stream,
                "subjects": [f"{stream}.*"],
                "subject_transform": {
                    "src": f"{stream}.*",
                    "dest": f"{{{{partition({partitions},1)}}}}.{stream}.{{{{wildcard(1)}}}}",
                },
            }
        )
    )
    run_sync(admin.create_static(client.target, stream, group, partitions, members=members))


def elastic_group(
    client: Blocking[NatsClient], stream: str, group: str, members: list[str], partitions: int
) -> None:
    """A plain stream over `<stream>.*` and an elastic group hashing the second token."""
    run_sync(client.api.create_stream({"name": stream, "subjects": [f"{stream}.*"]}))
    run_sync(
        admin.create_elastic(
            client.target, stream, group, partitions, [PartitioningFilter(f"{stream}.*", [1])]
        )
    )
    run_sync(admin.add_members(client.target, stream, group, members))


def publish(client: Blocking[NatsClient], stream: str, count: int, start: int = 0) -> None:
    """`count` messages `<stream>.k<i % 37>` with payload `<i>`, confirmed by JetStream."""

    async def send() -> None:
        js = client.target.js
        for i in range(start, start + count):
            await js.publish(f"{stream}.k{i % 37}", str(i).encode(), headers={"n": str(i)})

    run_sync(send())


def member_states(client: Blocking[NatsClient], stream: str, group: str) -> dict[str, dict]:
    """`num_pending` and `num_ack_pending` of every member consumer of the group."""
    entry = run_sync(load_group(client.target, stream, group))
    names = [m.member for m in entry.config.member_mappings] or entry.config.members
    states = {}
    for name in names:
        consumer = member_consumer(entry, name)
        info = run_sync(client.api.consumer_info(consumer.stream, consumer.name))
        states[name] = {"pending": info["num_pending"], "ack_pending": info["num_ack_pending"]}
    return states


def source(spark: Any, url: str, stream: str, group: str, **options: Any) -> Any:
    reader = spark.readStream.format("nats-pcg").option("servers", url)
    reader = reader.option("stream", stream).option("group", group)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def wait_until(
    condition: Callable[[], Any], timeout: float = 60, what: str = "condition", every: float = 0.25
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def payloads(spark: Any, path: str) -> list[int]:
    """Payload numbers of every row in the parquet output at `path`."""
    return [int(row.data.decode()) for row in spark.read.parquet(path).select("data").collect()]


def assert_exactly_once(values: list[int], expected: int) -> None:
    duplicates = len(values) - len(set(values))
    missing = set(range(expected)) - set(values)
    assert duplicates == 0, f"{duplicates} duplicated rows"
    assert not missing, f"{len(missing)} messages missing, e.g. {sorted(missing)[:10]}"
    assert len(values) == expected


def run_query(df: Any, directory: Any) -> tuple[Any, Any]:
    """Run `df` into parquet with Trigger.AvailableNow: the query and the error it ended with."""
    from pyspark.errors import StreamingQueryException

    query = (
        df.writeStream.format("parquet")
        .option("path", str(directory / "out"))
        .option("checkpointLocation", str(directory / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the query did not finish"
    except StreamingQueryException as error:
        return query, error
    return query, None


def foreach_batches(
    df: Any, handler: Callable[[Any, int], None], checkpoint: Any, every: str
) -> Any:
    """Start `df` into `handler` (foreachBatch) with a processing-time trigger of `every`."""
    return (
        df.writeStream.foreachBatch(handler)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=every)
        .start()
    )
