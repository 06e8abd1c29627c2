"""Helpers shared by the test modules (one definition each; no test module imports another):
groups with streams, publishing, queries and checks, launching Spark and server processes, group
administration, connections, plain pull consumers, and a slot read the way a task reads it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest
from nats.js.errors import BucketNotFoundError

import nats_spark.job
import pyspark_nats_pcg
from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConnectionFailed, NotFound
from nats_spark.jetstream.acks import delivered_at
from nats_spark.jetstream.api import to_nanos
from nats_spark.jetstream.pull import FetchResult, PullConsumer
from nats_spark.loop import Blocking, event_loop, run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.config import PartitioningFilter
from nats_spark.pcg.consumers import (
    PRIORITY_GROUP,
    GroupConsumer,
    ensure_group_consumer,
    member_consumer,
    partition_consumer,
    read_stream,
)
from nats_spark.pcg.partitioning import member_partitions, partition_for
from nats_spark.pcg.store import GroupKind, load_group
from nats_spark.spark.group_source.ledger import Ledger, pointer_key, read_deliveries, read_head
from nats_spark.spark.group_source.ledger_protocol import Marks, ack
from nats_spark.spark.group_source.slot_partition import SlotPartition, SlotReading

SPARK_VERSION = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
# Spark 4.2+ passes the committed start offset to latestOffset, so the source acks a query's last
# batch before it stops; older versions leave it to the next start (the README's guarantee
# "nothing left behind").
ACKS_LAST_BATCH = SPARK_VERSION >= (4, 2)
NO_DATA_PROGRESS = "spark.sql.streaming.noDataProgressEventInterval"
PROGRESS_KEPT = "spark.sql.streaming.numRecentProgressUpdates"
# Spark 4.2+ reports reportLatestOffset() (per-member lag and pin status) in progress.
REPORTS_LAG = SPARK_VERSION >= (4, 2)

REPO = Path(__file__).resolve().parents[1]
SPARK_HOME = os.path.dirname(pyspark.__file__)
JOB_FILE = nats_spark.job.__file__
# Spark finds `pyspark_*` modules (the auto-registered `nats-pcg`) with pkgutil in a fresh Python
# worker. An editable install's import hook is invisible to pkgutil, so processes that rely on the
# auto-registration get the module's directory as PYTHONPATH, as a wheel install would have it.
AUTO_REGISTER_PATH = str(Path(pyspark_nats_pcg.__file__).parent)


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


async def send_numbered(
    client: NatsClient, prefix: str, count: int, start: int = 0, keys: int = 37, pad: int = 0
) -> set[bytes]:
    """`count` messages `<prefix>.k<i % keys>` with payload `<i>` (and `pad` spaces after it,
    which `int` ignores) and header `n: <i>`, for i from `start`, each confirmed by JetStream;
    returns the payloads."""
    sent = set()
    for i in range(start, start + count):
        data = str(i).encode() + b" " * pad
        await client.js.publish(f"{prefix}.k{i % keys}", data, headers={"n": str(i)})
        sent.add(data)
    return sent


def needs_server(client: Blocking[NatsClient], version: tuple[int, int, int], what: str) -> None:
    """Skip the test on a server older than `version` (the suite runs on others with
    NATS_SERVER_BIN or NATS_URL): `what` needs it."""
    if client.server_version < version:
        pytest.skip(f"{what} needs nats-server {'.'.join(map(str, version))}+")


def publish(
    client: Blocking[NatsClient], stream: str, count: int, start: int = 0, pad: int = 0
) -> None:
    """`send_numbered` to `<stream>.*` from outside the event loop."""
    run_sync(send_numbered(client.target, stream, count, start, pad=pad))


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


def unpinned(client: Blocking[NatsClient], stream: str, group: str) -> bool:
    """No consumer reading the group has a pinned client: a stopped query's pins are gone (they
    time out after priority_timeout, the source's ackWait)."""
    entry = run_sync(load_group(client.target, stream, group))
    names = [m.member for m in entry.config.member_mappings] or entry.config.members
    for name in names:
        for consumer in consumers_of(client, stream, group, name):
            try:
                info = run_sync(client.api.consumer_info(consumer.stream, consumer.name))
            except NotFound:
                continue  # not made yet: nothing pinned
            if any(g.get("pinned_client_id") for g in info.get("priority_groups", [])):
                return False
    return True


def source(spark: Any, url: str, stream: str, group: str | None = None, **options: Any) -> Any:
    """`readStream.format("nats-pcg")` of `group` (or of the plain consumer `consumer=`)."""
    reader = spark.readStream.format("nats-pcg").option("servers", url).option("stream", stream)
    if group is not None:
        reader = reader.option("group", group)
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
    df: Any,
    handler: Callable[[Any, int], None],
    checkpoint: Any,
    every: str = "200 milliseconds",
    report_idle: bool = False,
) -> Any:
    """Start `df` into `handler` (foreachBatch) with a processing-time trigger of `every`;
    `report_idle`: progress on every trigger, also those without data (`wait_for_triggers`)."""
    conf = df.sparkSession.conf
    if report_idle:
        conf.set(NO_DATA_PROGRESS, "100ms")  # read as the query starts
    try:
        return (
            df.writeStream.foreachBatch(handler)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=every)
            .start()
        )
    finally:
        if report_idle:
            conf.unset(NO_DATA_PROGRESS)


def wait_for_triggers(query: Any, count: int, after: datetime, what: str) -> None:
    """Until `count` triggers of `query` (started with `report_idle`) began after `after` (UTC):
    the proof that the query had as many chances to act, for a test of what it must not do."""

    def triggers() -> int:
        return sum(datetime.fromisoformat(p["timestamp"]) > after for p in query.recentProgress)

    wait_until(lambda: triggers() >= count, 60, f"{count} triggers {what}")


def source_runners() -> list[int]:
    """Pids of Spark's Python streaming source runners (a query's driver side, where the source
    acks at stop) that run below this process. Spark stops a query without waiting for its
    runner, so a test waits for them to exit to know that what they do at stop is done."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])

    def below_us(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    found = []
    for pid in filter(below_us, parents):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"python_streaming_source_runner" in command:
            found.append(pid)
    return found


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


class Trigger(NamedTuple):
    """A trigger of a query as its progress shows it (epoch seconds): when it started, by when
    the source had answered its latestOffset (where pacing decides), and the rows it read."""

    start: float
    planned_by: float
    rows: int


def triggers_of(query: Any) -> list[Trigger]:
    """Every trigger of `query` (started with `report_idle`) in its progress, in order."""
    found = []
    for p in query.recentProgress:
        start = datetime.fromisoformat(p["timestamp"]).timestamp()
        planned_by = start + p["durationMs"]["latestOffset"] / 1000
        found.append(Trigger(start, planned_by, p["numInputRows"]))
    return sorted(found)


PACING_SLACK = 0.1  # seconds: clock rounding (progress has milliseconds) and reading the clocks
SEEN_AFTER = 0.5  # seconds after its publish returned, a message is in the counts the source reads


def pacing_problems(
    triggers: list[Trigger],
    published: list[tuple[float, int]],
    started: float,
    minimum: int,
    delay: float,
) -> list[str]:
    """What `triggers` did against minMessagesPerTrigger=`minimum`, maxTriggerDelay=`delay`
    (docs/options.md), with the messages `published` ((when the publish had returned, count))
    into a query started after `started`. A trigger's decision falls between its start and
    `planned_by`, so each rule is checked against the bounds that make it hold however slowly
    the triggers run: a batch under the minimum planned within the delay of the previous batch
    (or the query's start); a trigger that held back at least the minimum; one that held back
    messages when the delay had surely passed."""
    problems: list[str] = []
    read = 0
    last = (started, triggers[0].planned_by)  # between when the previous batch was planned
    for trigger in triggers:
        there = sum(count for at, count in published if at + SEEN_AFTER < trigger.start) - read
        if trigger.rows:
            waited = trigger.planned_by - last[0]
            if trigger.rows < minimum and waited < delay - PACING_SLACK:
                problems.append(f"a batch of {trigger.rows} went {waited:.1f}s after the last")
            read += trigger.rows
            last = (trigger.start, trigger.planned_by)
        elif there >= minimum:
            problems.append(f"a trigger held back {there} messages, the minimum {minimum} or more")
        elif there > 0 and trigger.start - last[1] > delay + PACING_SLACK:
            waited = trigger.start - last[1]
            problems.append(f"a trigger held back {there} messages {waited:.1f}s after the last")
    return problems


def check_trigger_pacing(
    df: Any, publish_numbered: Callable[[int, int], None], checkpoint: Any
) -> None:
    """`df` read with minMessagesPerTrigger=20, maxTriggerDelay=5s (and messages 0-4 published):
    15 more are published after 5 triggers, 3 more once 20 rows are in, 20 more once those 3
    are. Every trigger keeps to the options (`pacing_problems`) however long triggers take:
    the 3 wait out the delay after the batch before them, the 20 go at once after theirs, and,
    where the query starts within the delay, the 5 are held back until 20 go at once.
    `publish_numbered(start, count)` publishes messages numbered start... ."""
    sink = Collector()
    started = time.time()
    published = [(started, 5)]
    conf = df.sparkSession.conf
    conf.set(PROGRESS_KEPT, "1000")  # every trigger of the query, not the last 100
    query = foreach_batches(df, sink, checkpoint, report_idle=True)

    def publish_then_wait(start: int, count: int) -> None:
        publish_numbered(start, count)
        published.append((time.time(), count))
        total = start + count
        wait_until(lambda: len(sink.values) >= total or query.exception(), 30, f"{total} rows")
        assert query.exception() is None, query.exception()

    try:
        wait_for_triggers(query, 5, datetime.fromtimestamp(started, UTC), "with 5 messages")
        publish_then_wait(5, 15)
        publish_then_wait(20, 3)
        publish_then_wait(23, 20)
        # Progress is reported once a batch has ended, after its rows reached the sink.
        wait_until(lambda: sum(t.rows for t in triggers_of(query)) >= 43, 30, "the last progress")
        triggers = triggers_of(query)
    finally:
        query.stop()
        conf.unset(PROGRESS_KEPT)
    assert_exactly_once(sink.values, 43)
    problems = pacing_problems(triggers, published, started, 20, 5.0)
    assert problems == [], f"{problems}; published {published}, triggers {triggers}"


def format_one_chunk(replies: list[bytes]) -> bytes:
    """A ledger chunk as releases before ledger format 2 wrote it: the reply subjects' joined
    size (4 bytes, little endian), then the subjects joined by newlines, zstd-compressed."""
    text = b"\n".join(replies)
    codec = pa.Codec("zstd", compression_level=1)
    return len(text).to_bytes(4, "little") + codec.compress(text, asbytes=True)


# Launching Spark and server processes, and group administration for the CLI and admin tests.


def spark_env(**extra: str) -> dict[str, str]:
    """Environment for Spark processes of this venv's pyspark, on loopback, with this interpreter
    for drivers and Python workers (they import nats_spark)."""
    return {
        **os.environ,
        "SPARK_HOME": SPARK_HOME,  # bin/ scripts look for it with `python3`, which lacks pyspark
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        # `python -m nats_spark.job` starts its own JVM: no web UI on a fixed port 4040.
        "PYSPARK_SUBMIT_ARGS": "--conf spark.ui.enabled=false pyspark-shell",
        **extra,
    }


def spark_bin(name: str) -> str:
    return os.path.join(SPARK_HOME, "bin", name)


@dataclass
class Launched:
    """A process started by a test, in its own session so that it can be stopped with its JVM."""

    name: str
    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once it ended; killed (and failing) after `timeout`."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.name} still running after {timeout}s; stderr: {self.tail()}")
        return code, self.out.read_text(errors="replace"), self.err.read_text(errors="replace")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.err.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 15) -> None:
        """SIGTERM to its process group, then SIGKILL if it lingers."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(grace)


def launch(name: str, args: Sequence[str], logs: Path, env: dict[str, str]) -> Launched:
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            list(args), stdout=stdout, stderr=stderr, env=env, cwd=logs, start_new_session=True
        )
    return Launched(name, process, out, err)


def committed_rows(path: Path) -> list[dict]:
    """Rows of the files the file sink committed (listed in its `_spark_metadata` log), which is
    what Spark reads back; files of failed attempts are not counted."""
    files: set[str] = set()
    for log in (path / "_spark_metadata").iterdir():
        if log.name.startswith("."):
            continue  # checksum files
        for line in log.read_text().splitlines()[1:]:  # after the version line
            entry = json.loads(line)
            if entry["action"] == "add":
                files.add(urlparse(entry["path"]).path)  # compactions repeat earlier entries
    return [row for file in sorted(files) for row in pq.read_table(file).to_pylist()]


def row_payloads(rows: list[dict]) -> list[int]:
    return [int(row["data"].decode()) for row in rows]


def settled(client: Blocking[NatsClient], stream: str, group: str = "g") -> bool:
    """Every member of the group has nothing pending and nothing unacked."""
    return all(
        s == {"pending": 0, "ack_pending": 0} for s in member_states(client, stream, group).values()
    )


def job_flags(url: str, stream: str, out: Path) -> list[str]:
    return [
        "--servers",
        url,
        "--stream",
        stream,
        "--output",
        str(out / "data"),
        "--checkpoint",
        str(out / "checkpoint"),
        "--trigger",
        "availableNow",
    ]


def wait_for_log(process: Launched, text: str, count: int = 1, timeout: float = 60) -> None:
    def seen() -> bool:
        code = process.process.poll()
        if code is not None:
            pytest.fail(f"{process.name} exited with {code}: {process.tail()}")
        return process.err.read_text(errors="replace").count(text) >= count

    wait_until(seen, timeout, f"{count}x {text!r} in the log of {process.name}")


def opened(settings: ConnectionSettings) -> Iterator[Blocking[NatsClient]]:
    """A blocking client (for a fixture to yield from), closed after."""
    blocking = open_blocking(settings)
    yield blocking
    run_sync(blocking.target.close())


def assert_works(settings: ConnectionSettings) -> None:
    """Connect, make a JetStream request, close."""
    client = open_blocking(settings)
    try:
        assert "limits" in Blocking(client.api).account_info()
    finally:
        run_sync(client.target.close())


def refusal(settings: ConnectionSettings, within: float = 8.0) -> str:
    """The one-line ConnectionFailed message of a connect with `settings`, which must be quick."""
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as caught:
        run_sync(NatsClient.open(settings), timeout=30)
    assert time.monotonic() - started < within, "the failed connect took too long (hang?)"
    message = str(caught.value)
    assert "\n" not in message
    return message


def api(client) -> Blocking:
    return Blocking(client.api)


def kv(client, kind: GroupKind):
    """The kind's KV bucket, made the way store.create_group makes it if no test did yet."""
    try:
        bucket = run_sync(client.js.key_value(kind.bucket))
    except BucketNotFoundError:
        bucket = run_sync(client.js.create_key_value(bucket=kind.bucket, history=1))
    return Blocking(bucket)


def make_stream(client, name: str, subjects: list[str] | None = None, **extra) -> str:
    """A stream over `subjects` (by default `<name>.*`, what `publish` sends to)."""
    subjects = subjects if subjects is not None else [f"{name}.*"]
    api(client).create_stream({"name": name, "subjects": subjects, **extra})
    return name


def static_stream(client, unique: str, partitions: int) -> str:
    """A stream storing `<p>.<unique>.<key>` for `<unique>.<key>`, as static groups need."""
    dest = f"{{{{partition({partitions},1)}}}}.{unique}.{{{{wildcard(1)}}}}"
    return make_stream(
        client,
        f"S{unique}",
        [f"{unique}.*"],
        subject_transform={"src": f"{unique}.*", "dest": dest},
    )


def publish_one(client, subject: str, data: bytes) -> None:
    run_sync(client.js.publish(subject, data))


def key_for(partition: int, partitions: int) -> str:
    return next(f"k{i}" for i in range(1000) if partition_for([f"k{i}"], partitions) == partition)


def start_job(
    url: str,
    stream: str,
    out: Path,
    checkpoint: Path,
    log: Path,
    *options: str,
    trigger: str = "200ms",
) -> subprocess.Popen:
    """The streaming job in its own process group, so kill -9 takes its JVM along; `options`
    are more source options, `name=value`."""
    args = [
        sys.executable,
        "-m",
        "nats_spark.job",
        "--servers",
        url,
        "--stream",
        stream,
        "--group",
        "g",
        "--output",
        str(out),
        "--checkpoint",
        str(checkpoint),
        "--trigger",
        trigger,
        "--master",
        "local[2]",
        "--option",
        "maxMessagesPerTrigger=150",
        "--option",
        "ackWait=5s",
        *(f"--option={option}" for option in options),
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen(
        args, stdout=log.open("a"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def kill_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def batches_logged(log: Path) -> int:
    return log.read_text().count("rows") if log.exists() else 0


# Plain pull consumers in a priority group, read with nats-py next to the source.


def consumer_info(client: Blocking[NatsClient], stream: str, name: str) -> dict[str, Any]:
    return run_sync(client.api.consumer_info(stream, name))


def make_consumer(
    client: Blocking[NatsClient],
    stream: str,
    name: str,
    policy: str | None,
    *,
    group: str,
    **extra: Any,
) -> dict[str, Any]:
    """A durable explicit-ack pull consumer; with `policy`, in priority group `group` (`extra`
    config wins, priority_groups included)."""
    config: dict[str, Any] = {"durable_name": name, "ack_policy": "explicit", **extra}
    if policy:
        config = {"priority_groups": [group], "priority_policy": policy, **config}
    return run_sync(client.api.create_consumer(stream, name, config))


def puller(
    client: Blocking[NatsClient], stream: str, consumer: str, group: str | None
) -> Blocking[PullConsumer]:
    """A nats-py puller of `consumer`, in priority group `group` (None: none)."""
    return Blocking(client.pull_consumer(stream, consumer, group=group))


def in_background(pull: Blocking[PullConsumer], batch: int, **kwargs: Any) -> Future[FetchResult]:
    """Start a fetch on the process loop and return at once."""
    return asyncio.run_coroutine_threadsafe(pull.target.fetch(batch, **kwargs), event_loop())


@contextlib.contextmanager
def waiting_pull_sent(
    client: Blocking[NatsClient], stream: str, consumer: str
) -> Iterator[threading.Event]:
    """Set once a pull request that waits (one with an expiry) is sent to `consumer` within the
    block: a message a test sends then reaches that pull at the start of its wait."""
    sent = threading.Event()

    async def note(msg: Any) -> None:
        if "expires" in json.loads(msg.data):
            sent.set()

    subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
    subscription = run_sync(client.target.nc.subscribe(subject, cb=note))
    run_sync(client.target.nc.flush())
    try:
        yield sent
    finally:
        run_sync(subscription.unsubscribe())


# One slot read the way a task reads it, and another instance of a member next to the source.


class Slot:
    """Member m1 of a one-member static group on a fresh stream, its consumer (1 s ack wait) and
    an ack ledger: `partition(...)` is what the driver would hand a task for one batch."""

    def __init__(self, client: Blocking[NatsClient], settings, unique: str) -> None:
        self.client, self.settings = client, settings
        self.stream, self.bucket, self.lineage = f"Z{unique}", f"L{unique}", uuid.uuid4().hex
        static_group(client, self.stream, "g", ["m1"], partitions=2)
        entry = run_sync(load_group(client.target, self.stream, "g"))
        self.consumer = member_consumer(entry, "m1", {"ack_wait": to_nanos(1)})
        run_sync(ensure_group_consumer(client.target, self.consumer))
        kv = run_sync(Ledger.bucket(client.target, self.bucket, create=True))
        self.ledger = Ledger(kv, self.lineage)

    def partition(
        self,
        gen: int,
        limit: int,
        pin: str | None = None,
        committed: tuple[int, ...] = (),
        dedupe: tuple[tuple[str, int, int], ...] = (),
    ) -> SlotPartition:
        return SlotPartition(
            reading=SlotReading(self.settings, self.bucket, 100, 3.0, False, True),
            pointer_key=pointer_key(self.stream, self.consumer.name),
            lineage=self.lineage,
            gen=gen,
            slot="m1",
            stream=self.stream,
            consumer=self.consumer.name,
            priority_group=PRIORITY_GROUP,
            member="m1",
            partitioned=True,
            limit=limit,
            pin_id=pin,
            committed=committed,
            dedupe=dedupe,
        )

    def entry(self, gen: int) -> tuple[Any, list[int]]:
        """The ledger head of batch `gen` and the stream sequences it recorded."""
        head, _ = run_sync(read_head(self.ledger, gen, "m1"))
        return head, run_sync(read_deliveries(self.ledger, head)).stream_seq

    def ledger_head(self, gen: int) -> Any:
        """The ledger head of batch `gen`, None while there is none."""
        found = run_sync(read_head(self.ledger, gen, "m1"))
        return found and found[0]

    def ack(self, *gens: int, slot: str = "m1") -> None:
        """What the next batch's task does first: ack the committed entries of `gens`."""
        for gen in gens:
            run_sync(ack(self.client.target, self.ledger, gen, slot, self.stream))

    def info(self) -> dict[str, Any]:
        return run_sync(self.client.api.consumer_info(self.consumer.stream, self.consumer.name))

    def overflow_consumer(self, name: str = "shared", ack_wait: float = 1.0) -> str:
        """An overflow consumer on the stream, for slots that share one."""
        config = {"durable_name": name, "ack_policy": "explicit", "ack_wait": to_nanos(ack_wait)}
        config |= {"priority_groups": [PRIORITY_GROUP], "priority_policy": "overflow"}
        run_sync(self.client.api.create_consumer(self.stream, name, config))
        return name


def seqs(batch: Any) -> list[int]:
    return batch.column("stream_seq").to_pylist()


def seqs_of(batches: Iterator[Any]) -> list[int]:
    return [s for batch in batches for s in seqs(batch)]


def rest(pulls: Any) -> list[int]:
    """Stream sequences of every record batch an unfinished `pull_record_batches` still yields."""
    rows: list[int] = []
    while True:
        try:
            rows += seqs(run_sync(pulls.__anext__()))
        except StopAsyncIteration:
            return rows


class OtherInstance:
    """Another instance of member m1 (as a Go member would be): pulls with its pin, acks."""

    def __init__(self, settings, stream: str, consumer: str) -> None:
        self.client = run_sync(NatsClient.open(settings))
        self.puller = self.client.pull_consumer(stream, consumer, group=PRIORITY_GROUP)
        self.received: list[int] = []
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def pull_once() -> None:
            result = await self.puller.fetch(50, expires=0.5)
            for msg in result.messages:
                self.received.append(int(msg.data.decode()))
                await msg.ack()

        while self.running:
            run_sync(pull_once())

    def stop(self) -> None:
        self.running = False
        self.thread.join(10)
        run_sync(self.client.close())


class Delivery(NamedTuple):
    """The metadata a JetStream delivery carries in its reply subject."""

    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    pending: int


def parse_reply(reply: str | bytes) -> Delivery:
    """Every field of an ack subject, v1 (9 tokens) or v2 (11+), decoded one by one: the
    reference the tests hold the read path's bulk parse (`ack_numbers`) and rebuilt subjects to."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    tokens = text.split(".")
    at = delivered_at(tokens, text)
    return Delivery(tokens[at - 2], tokens[at - 1], *(int(t) for t in tokens[at : at + 5]))


# What Spark's Python workers hold.


def python_workers() -> list[int]:
    """Pids of the pyspark daemon and the workers it forked, under this process's Spark JVM."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            with contextlib.suppress(OSError):
                if b"pyspark.daemon" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                    found.append(pid)
    return found


def assert_no_pandas_in_workers() -> None:
    """The workers that read never imported pandas (pyarrow does on its first conversion of
    Python objects: 0.3 CPU-s a worker)."""
    workers = python_workers()
    assert workers, "no pyspark worker found under this process"
    for pid in workers:
        with contextlib.suppress(OSError):
            maps = (Path("/proc") / str(pid) / "maps").read_text()
            assert "/pandas/" not in maps, f"pyspark worker {pid} imported pandas"


async def unkept(marks: Marks) -> None:
    """A give-back's `keep_marks` where no driver keeps them."""
