"""Helpers for Spark source tests: groups with streams, publishing, queries and checks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyspark

from nats_spark.client import NatsClient
from nats_spark.errors import NotFound
from nats_spark.loop import Blocking, run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.config import PartitioningFilter
from nats_spark.pcg.consumers import (
    GroupConsumer,
    member_consumer,
    partition_consumer,
    read_stream,
)
from nats_spark.pcg.partitioning import member_partitions
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


def consumers_of(
    client: Blocking[NatsClient], stream: str, group: str, member: str
) -> list[GroupConsumer]:
    """The consumers that read `member`'s partitions now: one per partition in the partition
    layout (where the group has them), else the member's own consumer."""
    entry = run_sync(load_group(client.target, stream, group))
    config = entry.config
    owned = member_partitions(config.members, config.max_members, config.member_mappings, member)
    partitions = [partition_consumer(entry, p) for p in owned]
    existing = set(run_sync(client.api.consumer_names(read_stream(entry)))) if partitions else set()
    return [c for c in partitions if c.name in existing] or [member_consumer(entry, member)]


def member_states(client: Blocking[NatsClient], stream: str, group: str) -> dict[str, dict]:
    """`num_pending` and `num_ack_pending` of every member, over the consumers reading it."""
    entry = run_sync(load_group(client.target, stream, group))
    names = [m.member for m in entry.config.member_mappings] or entry.config.members
    states = {}
    for name in names:
        state = {"pending": 0, "ack_pending": 0}
        for consumer in consumers_of(client, stream, group, name):
            info = run_sync(client.api.consumer_info(consumer.stream, consumer.name))
            state["pending"] += info["num_pending"]
            state["ack_pending"] += info["num_ack_pending"]
        states[name] = state
    return states


def source(spark: Any, url: str, stream: str, group: str, **options: Any) -> Any:
    reader = spark.readStream.format("nats-pcg").option("servers", url)
    reader = reader.option("stream", stream).option("group", group)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def write_nats(df: Any, url: str, stream: str, **options: str) -> None:
    """A batch write of `df` (subject, data) with the `nats` sink into `stream`."""
    writer = df.write.format("nats").mode("append").option("servers", url)
    writer.option("stream", stream).options(**options).save()


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
    df: Any, handler: Callable[[Any, int], None], checkpoint: Any, every: str = "200 milliseconds"
) -> Any:
    """Start `df` into `handler` (foreachBatch) with a processing-time trigger of `every`."""
    return (
        df.writeStream.foreachBatch(handler)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=every)
        .start()
    )


def unacked(client: Blocking[NatsClient], stream: str, group: str) -> int:
    """Messages of the group not acked yet: pending plus ack pending over all members; -1 while
    a member consumer is missing (deleted, not recreated yet)."""
    try:
        states = member_states(client, stream, group).values()
    except NotFound:
        return -1
    return sum(s["pending"] + s["ack_pending"] for s in states)


def reading(client: Blocking[NatsClient], stream: str, group: str, member: str) -> None:
    """Wait until `member`'s task is pulling: part of its backlog delivered, part still pending."""

    def mid_way() -> bool:
        try:
            state = member_states(client, stream, group)[member]
        except NotFound:
            return False  # the query has not created the member consumers yet
        return state["ack_pending"] >= 20 and state["pending"] > 0

    wait_until(mid_way, 60, f"the task of {member} to be pulling", every=0.02)


class Collector:
    """foreachBatch target: payload numbers of every committed batch (a re-run replaces its
    batch's rows). `after_read[batch_id]` runs once the rows are read, before the sink commits."""

    def __init__(self) -> None:
        self.batches: dict[int, list[int]] = {}
        self.lock = threading.Lock()
        self.after_read: dict[int, Callable[[list[int]], None]] = {}

    def __call__(self, batch: Any, batch_id: int) -> None:
        rows = [int(r.data.decode()) for r in batch.select("data").collect()]
        action = self.after_read.pop(batch_id, None)
        if action is not None:
            action(rows)
        with self.lock:
            self.batches[batch_id] = rows

    @property
    def values(self) -> list[int]:
        with self.lock:
            return [v for rows in self.batches.values() for v in rows]


def drained(
    query: Any, client: Blocking[NatsClient], stream: str, group: str, sink: Collector, total: int
) -> None:
    """Every row committed and, with the query idle, every message acked."""
    wait_until(lambda: len(sink.values) >= total or query.exception(), 120, f"{total} rows")
    assert query.exception() is None, query.exception()
    wait_until(lambda: unacked(client, stream, group) == 0, 60, "every member acked")


def check_trigger_pacing(
    df: Any, publish_numbered: Callable[[int, int], None], checkpoint: Any
) -> None:
    """`df` read with minMessagesPerTrigger=20, maxTriggerDelay=5s (and messages 0-4 published):
    5 messages are held back, 20 go at once, 3 more wait out the delay from the previous batch.
    `publish_numbered(start, count)` publishes messages numbered start... ."""
    sink = Collector()
    query = foreach_batches(df, sink, checkpoint)
    try:
        time.sleep(3)
        assert sink.values == [], f"a batch of {len(sink.values)} ran under the minimum of 20"
        publish_numbered(5, 15)
        wait_until(lambda: len(sink.values) >= 20 or query.exception(), 30, "20 rows")
        publish_numbered(20, 3)
        wait_until(lambda: len(sink.values) >= 23 or query.exception(), 30, "23 rows")
        assert query.exception() is None, query.exception()
        # Progress is reported once a batch has ended, after its rows reached the sink.
        rows_reported = lambda: sum(p["numInputRows"] for p in query.recentProgress)  # noqa: E731
        wait_until(lambda: rows_reported() >= 23, 30, "the progress of the last batch")
        with_rows = [len(rows) for rows in sink.batches.values() if rows]
        assert with_rows == [20, 3], with_rows
        # Triggers start before the source plans their batch: the gap between the two starts
        # is the delay less the first planning's time.
        started = {
            p["numInputRows"]: datetime.fromisoformat(p["timestamp"])
            for p in query.recentProgress
            if p["numInputRows"]
        }
        waited = (started[3] - started[20]).total_seconds()
        assert waited >= 4.5, f"3 messages went {waited:.1f}s after the previous batch"
    finally:
        query.stop()
    assert_exactly_once(sink.values, 23)


def format_one_chunk(replies: list[bytes]) -> bytes:
    """A ledger chunk as releases before ledger format 2 wrote it: the reply subjects' joined
    size (4 bytes, little endian), then the subjects joined by newlines, zstd-compressed."""
    text = b"\n".join(replies)
    codec = pa.Codec("zstd", compression_level=1)
    return len(text).to_bytes(4, "little") + codec.compress(text, asbytes=True)
