"""`make demo`: a partitioned consumer group streamed through Spark, end to end, on a local server.

Starts an embedded nats-server (or uses `--server`), creates a partitioned stream and a static group
of three members, publishes a steady flow, reads it with `readStream.format("nats-pcg")` for a
bounded time, and prints a summary: published, rows per member, duplicates, missing, unacked.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings, parse_servers
from nats_spark.loop import run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.consumers import member_consumer
from nats_spark.progress import progress_bar
from nats_spark.server import EmbeddedServer


@contextlib.contextmanager
def nats_url(explicit: str | None) -> Iterator[str]:
    if explicit:
        yield explicit
        return
    with EmbeddedServer() as server:
        print(f"embedded nats-server {'.'.join(map(str, server.version))} at {server.url}")
        yield server.url


async def setup(client: NatsClient, stream: str, members: list[str], partitions: int) -> None:
    await client.api.create_stream(
        {
            "name": stream,
            "subjects": [f"{stream.lower()}.*"],
            "subject_transform": {
                "src": f"{stream.lower()}.*",
                "dest": f"{{{{partition({partitions},1)}}}}.{stream.lower()}.{{{{wildcard(1)}}}}",
            },
        }
    )
    await admin.create_static(client, stream, "demo", partitions, members=members)


def publish_steadily(client: NatsClient, stream: str, total: int, seconds: float) -> None:
    """`total` messages spread evenly over `seconds`, each confirmed by JetStream."""
    chunk = max(total // max(int(seconds * 10), 1), 1)

    async def send(start: int, end: int) -> None:
        futures = [
            await client.js.publish_async(f"{stream.lower()}.customer{i % 97}", f"{i}".encode())
            for i in range(start, end)
        ]
        for future in futures:
            await future

    began = time.monotonic()
    for start in range(0, total, chunk):
        run_sync(send(start, min(start + chunk, total)))
        progress_bar(min(start + chunk, total), total, "publishing")
        pause = began + seconds * (start + chunk) / total - time.monotonic()
        if pause > 0:
            time.sleep(pause)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nats_spark.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="use this NATS server instead of an embedded one")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="publishing time")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this long")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    members, stream = ["m1", "m2", "m3"], f"DEMO{int(time.time()) % 100000}"
    with nats_url(args.server) as url:
        client = run_sync(NatsClient.open(ConnectionSettings(servers=parse_servers(url))))
        run_sync(setup(client, stream, members, partitions=6))
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("nats-spark-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        per_member: Counter[str] = Counter()
        seen: Counter[int] = Counter()

        def collect(batch, batch_id):  # runs on the driver for every committed micro-batch
            for row in batch.select("member", "data").collect():
                per_member[row.member] += 1
                seen[int(row.data)] += 1

        query = (
            spark.readStream.format("nats-pcg")
            .option("servers", url)
            .option("stream", stream)
            .option("group", "demo")
            .option("ackWait", "30s")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", tempfile.mkdtemp(prefix="nats-spark-demo-"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        publisher = threading.Thread(
            target=publish_steadily, args=(client, stream, args.messages, args.seconds)
        )
        publisher.start()
        deadline = time.monotonic() + args.timeout
        entry = run_sync(admin.static_info(client, stream, "demo"))

        def unacked() -> int:
            total = 0
            for member in members:
                consumer = member_consumer(entry, member)
                info = run_sync(client.api.consumer_info(consumer.stream, consumer.name))
                total += info.num_pending + info.num_ack_pending
            return total

        while time.monotonic() < deadline and (
            publisher.is_alive() or len(seen) < args.messages or unacked()
        ):
            if query.exception():
                break
            time.sleep(0.5)
        publisher.join()
        query.stop()
        error = query.exception()
        left = unacked()
        spark.stop()
        run_sync(client.close())
    duplicates = sum(count - 1 for count in seen.values())
    missing = args.messages - len(seen)
    print("\nnats-pcg demo summary")
    print(f"  messages published   {args.messages}")
    for member in members:
        print(f"  rows from {member:<10} {per_member[member]}")
    print(f"  duplicates           {duplicates}")
    print(f"  missing              {missing}")
    print(f"  unacked              {left}")
    if error:
        print(f"  query failed: {error}")
    return 0 if not (duplicates or missing or left or error) else 1


if __name__ == "__main__":
    sys.exit(main())
