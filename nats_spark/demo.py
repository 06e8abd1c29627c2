"""`make demo`: a partitioned consumer group streamed through Spark, end to end, on a local server.

Starts an embedded nats-server (or uses `--server`), creates a stream that stores
`<partition>.<subject>` and a static group of three members over its six partitions, publishes a
steady flow, reads it with `readStream.format("nats-pcg")` until every message is read and acked,
and prints what happened: the lag while it runs, a few rows, rows per partition and member, and a
summary (duplicates, missing, unacked). Everything it starts is stopped in reverse order: the
publisher, the query, Spark, then the server.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings, parse_servers
from nats_spark.loop import run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.kinds import GroupKind
from nats_spark.server import EmbeddedServer
from nats_spark.spark.failure_lines import failure_line
from nats_spark.spark.local_session import local_session, stop_between_batches
from nats_spark.spark.progress import LagSample

GROUP = "demo"
MEMBERS = ["m1", "m2", "m3"]
PARTITIONS = 6
SAMPLE_ROWS = 5
TABLE = "nats_pcg_demo"  # the memory sink's table
# time, published, rows read, and the group's lag on the server: pending, ack pending
LAG_COLUMNS = "{:>6} {:>10} {:>7} {:>8} {:>12}"


@contextlib.contextmanager
def nats_url(explicit: str | None) -> Iterator[str]:
    if explicit:
        yield explicit
        return
    with EmbeddedServer(own_session=True) as server:  # Ctrl-C is the demo's to handle
        print(f"embedded nats-server {'.'.join(map(str, server.version))} at {server.url}")
        yield server.url


def subject_prefix(stream: str) -> str:
    return stream.lower()


async def create_group(client: NatsClient, stream: str) -> None:
    """The stream over `<prefix>.*`, stored as `<partition>.<prefix>.*`, and the static group."""
    prefix = subject_prefix(stream)
    await client.api.create_stream(
        {
            "name": stream,
            "subjects": [f"{prefix}.*"],
            "subject_transform": {
                "src": f"{prefix}.*",
                "dest": f"{{{{partition({PARTITIONS},1)}}}}.{prefix}.{{{{wildcard(1)}}}}",
            },
        }
    )
    await admin.create_static(client, stream, GROUP, PARTITIONS, members=MEMBERS)


async def remove_group(client: NatsClient, stream: str) -> None:
    """What the demo made on a server it did not start: the group's consumers, entry, stream."""
    await admin.delete_static(client, stream, GROUP)
    await client.api.delete_stream(stream)


def unacked(client: NatsClient, stream: str) -> dict[str, int]:
    """The group's `pending` and `ackPending` on the server, over the consumers the source
    reads through (its partition consumers in the default layout), as `nats-pcg status` counts."""
    _, members, partitions = run_sync(admin.group_status(client, stream, GROUP, GroupKind.STATIC))
    total: dict[str, int] = admin.group_lag(members, partitions)["total"]
    return total


class Publisher(threading.Thread):
    """Publishes `total` messages `<prefix>.customer<n>` (payload: the message number) spread
    evenly over `seconds`, each confirmed by JetStream; `finish()` stops it early."""

    def __init__(self, client: NatsClient, stream: str, total: int, seconds: float) -> None:
        super().__init__(name="demo-publisher", daemon=True)
        self.client = client
        self.prefix = subject_prefix(stream)
        self.total = total
        self.seconds = seconds
        self.published = 0
        self.stopping = threading.Event()

    async def _send(self, start: int, end: int) -> None:
        futures = [
            await self.client.js.publish_async(f"{self.prefix}.customer{i % 97}", str(i).encode())
            for i in range(start, end)
        ]
        for future in futures:
            await future

    def run(self) -> None:
        chunk = max(self.total // max(int(self.seconds * 10), 1), 1)
        began = time.monotonic()
        for start in range(0, self.total, chunk):
            if self.stopping.is_set():
                return
            end = min(start + chunk, self.total)
            run_sync(self._send(start, end))
            self.published = end
            self.stopping.wait(began + self.seconds * end / self.total - time.monotonic())

    def finish(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join()


@dataclass
class Run:
    """What `watch` saw: each batch's progress by batch id (the query's recent progress keeps
    the last 100 only) and the group's lag on the server, sampled a few times a second."""

    batches: dict[int, Any] = field(default_factory=dict)
    lag: list[LagSample] = field(default_factory=list)


def watch(
    query: Any,
    publisher: Publisher,
    client: NatsClient,
    stream: str,
    timeout: float,
    interrupted: threading.Event,
) -> Run:
    """Print the lag about once a second until every message is read and acked (or the query
    fails, `timeout` passes or the user interrupts)."""
    print(LAG_COLUMNS.format("time", "published", "rows", "pending", "ack pending"))
    seen = Run()
    began = time.monotonic()
    shown = -1.0
    while (elapsed := time.monotonic() - began) < timeout and query.exception() is None:
        if interrupted.is_set():
            return seen
        lag = unacked(client, stream)
        seen.lag.append(LagSample(datetime.now(UTC), lag["pending"], lag["ackPending"]))
        # From progress, not a count of the table: no Spark job beside the query's.
        seen.batches.update((p["batchId"], p) for p in query.recentProgress)
        rows = sum(p["numInputRows"] for p in seen.batches.values())
        done = not publisher.is_alive() and rows >= publisher.total
        settled = done and lag["pending"] + lag["ackPending"] == 0
        if settled or elapsed - shown >= 1.0:
            print(
                LAG_COLUMNS.format(
                    f"{elapsed:.1f}s",
                    publisher.published,
                    rows,
                    lag["pending"],
                    lag["ackPending"],
                ),
                flush=True,
            )
            shown = elapsed
        if settled:
            return seen
        interrupted.wait(0.25)
    return seen


def save_plot(seen: Run, path: str) -> None:
    """The run's input rate and lag as a PNG at `path` (with the `plot` extra's matplotlib)."""
    from nats_spark.spark.progress import batch_points, plot_run, png

    try:
        figure = plot_run(
            batch_points(seen.batches.values()), seen.lag, title="make demo: nats-pcg query"
        )
    except ImportError:
        print("\n(no plot: pip install 'nats-spark[plot]' for matplotlib)")
        return
    with open(path, "wb") as out:
        out.write(png(figure))
    print(f"\nlag and input rate over the run: {path}")


def summary(spark: Any, published: int, left: dict[str, int], error: Any) -> bool:
    """Print a few rows, the rows per partition and the summary; whether all went well."""
    from pyspark.sql.functions import col

    rows = spark.table(TABLE)
    print("\nthe first rows")
    shown = rows.select("partition", "member", "subject", col("data").cast("string"), "stream_seq")
    shown.orderBy("stream_seq").show(SAMPLE_ROWS, truncate=False)
    print("\nrows per partition")
    per_partition = rows.groupBy("partition", "member").count().orderBy("partition").collect()
    for row in per_partition:
        print(f"  partition {row.partition} ({row.member})  {row['count']}")
    numbers = Counter(int(row.data) for row in rows.select("data").collect())
    duplicates = sum(count - 1 for count in numbers.values())
    missing = len(set(range(published)) - numbers.keys())
    not_acked = left["pending"] + left["ackPending"]
    print("\nnats-pcg demo summary")
    print(f"  messages published   {published}")
    print(f"  rows read            {numbers.total()}")
    for member in MEMBERS:
        from_member = sum(row["count"] for row in per_partition if row.member == member)
        print(f"  rows from {member:<10} {from_member}")
    print(f"  duplicates           {duplicates}")
    print(f"  missing              {missing}")
    print(f"  unacked              {not_acked}")
    if error:
        print(f"  query failed: {failure_line(error, spark)}")
    return not (duplicates or missing or not_acked or error)


@contextlib.contextmanager
def first_interrupt() -> Iterator[threading.Event]:
    """An event that the first Ctrl-C sets (so the demo stops in order, not wherever the
    KeyboardInterrupt lands, such as inside a call into Spark); a second Ctrl-C interrupts."""
    interrupted = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def handle(signum: int, frame: Any) -> None:
        interrupted.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, handle)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def run(args: argparse.Namespace) -> int:
    stream = f"DEMO{int(time.time()) % 100000}"
    # Exits run in reverse: publisher, query, checkpoint, Spark, stream, client, server last.
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(nats_url(args.server))
        client = run_sync(NatsClient.open(ConnectionSettings(servers=parse_servers(url))))
        stack.callback(lambda: run_sync(client.close()))
        run_sync(create_group(client, stream))
        if args.server:
            stack.callback(lambda: run_sync(remove_group(client, stream)))
        print(
            f"stream {stream}: {subject_prefix(stream)}.* stored as <partition>.<subject>, "
            f"{PARTITIONS} partitions; static group {GROUP!r} of {', '.join(MEMBERS)}"
        )
        spark = local_session("nats-spark-demo")
        stack.callback(spark.stop)
        # After Spark's start: its context installs a SIGINT handler of its own.
        interrupted = stack.enter_context(first_interrupt())
        checkpoint = stack.enter_context(tempfile.TemporaryDirectory(prefix="nats-spark-demo-"))
        query = (
            spark.readStream.format("nats-pcg")
            .option("servers", url)
            .option("stream", stream)
            .option("group", GROUP)
            .load()
            .writeStream.format("memory")
            .queryName(TABLE)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        stack.callback(query.stop)
        print(f'reading with spark.readStream.format("nats-pcg") (Spark {spark.version})\n')
        publisher = Publisher(client, stream, args.messages, args.seconds)
        publisher.start()
        stack.callback(publisher.finish)
        seen = watch(query, publisher, client, stream, args.timeout, interrupted)
        publisher.finish()
        stop_between_batches(query)
        if interrupted.is_set():
            print("\ninterrupted: stopping the query, Spark (and the embedded server)")
            return 130
        healthy = summary(spark, publisher.published, unacked(client, stream), query.exception())
        if args.plot:
            save_plot(seen, args.plot)
    return 0 if healthy else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nats_spark.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="use this NATS server instead of an embedded one")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="publishing time")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this long")
    parser.add_argument(
        "--plot",
        default="nats-pcg-demo.png",
        help="PNG of the lag and input rate over the run (default %(default)s; '' for none)",
    )
    args = parser.parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:  # before Spark ran, or a second Ctrl-C
        print("\ninterrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
