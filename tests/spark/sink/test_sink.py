"""The `nats` sink: DataFrames to JetStream, exactly once in the target stream."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import (
    assert_exactly_once,
    launch,
    needs_server,
    publish,
    settled,
    source,
    spark_env,
    static_group,
    wait_until,
)

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.jetstream.api import NANOS
from nats_spark.loop import run_sync
from nats_spark.requests_at_once import all_results
from nats_spark.spark.failure_lines import SparkFailed, one_line_failures

pytestmark = pytest.mark.spark
SPARK_MASTER = "local[2,3]"  # a failed task is tried again (up to 3 attempts)


def target(
    client: Any, name: str, window: float = 120.0, atomic: bool = False, max_msg_size: int = -1
) -> str:
    run_sync(
        client.api.create_stream(
            {
                "name": name,
                "subjects": [f"{name}.>"],
                "duplicate_window": int(window * NANOS),
                "allow_atomic": atomic,
                "max_msg_size": max_msg_size,
            }
        )
    )
    return name


TOO_LARGE = 1024  # max_msg_size of the streams failing_write writes to


def stored(client: Any, stream: str) -> list[Any]:
    """Every message of `stream`, in order (fetched many at a time: one after the other, the
    50,000 of a test took most of its run)."""
    count = run_sync(client.api.stream_info(stream))["state"]["messages"]
    return run_sync(all_results(client.api.get_message(stream, seq) for seq in range(1, count + 1)))


PROBE = "probe"  # the last token of a subject the tests publish markers to, not rows


def values(client: Any, stream: str) -> list[int]:
    return [int(m.data.decode()) for m in stored(client, stream) if not m.subject.endswith(PROBE)]


def stores_probe(client: Any, stream: str, probe_id: str) -> bool:
    """Whether `stream` stores a probe message with id `probe_id`: it does unless it still
    holds that id in its duplicate window (stored probes are left out of `values`)."""
    ack = run_sync(client.js.publish(f"{stream}.{PROBE}", b"", headers={"Nats-Msg-Id": probe_id}))
    return not ack.duplicate


def writer(df: Any, url: str, **options: Any) -> Any:
    w = df.write.format("nats").mode("append").option("servers", url)
    for key, value in options.items():
        w = w.option(key, str(value))
    return w


class CoreCounter:
    """Counts every publish to `subject` as core NATS delivers it (duplicates included, which
    JetStream drops): proves that a retry published rows a second time."""

    def __init__(self, settings: ConnectionSettings, subject: str) -> None:
        self.count = 0

        async def start() -> tuple[NatsClient, Any]:
            client = await NatsClient.open(settings)

            async def seen(msg: Any) -> None:
                self.count += 1

            return client, await client.nc.subscribe(subject, cb=seen)

        self.client, self.sub = run_sync(start())

    def close(self) -> None:
        run_sync(self.client.close())


def test_batch_write_with_subjects_headers_and_ids(spark, client, nats_url, unique):
    stream = target(client, f"W{unique}")
    rows = [(f"{stream}.k{i % 3}", str(i), {"n": [str(i), "x"]}) for i in range(300)]
    df = spark.createDataFrame(
        rows, "subject STRING, data STRING, headers MAP<STRING, ARRAY<STRING>>"
    ).repartition(3)
    writer(df, nats_url, stream=stream).save()
    messages = stored(client, stream)
    assert_exactly_once([int(m.data.decode()) for m in messages], 300)
    for message in messages:
        n = int(message.data.decode())
        assert message.subject == f"{stream}.k{n % 3}"
        headers = message.headers.decode()
        assert f"n: {n}\r\n" in headers and "n: x\r\n" in headers and "Nats-Msg-Id: " in headers


def failing_write(spark: Any, stream: str, fail_at: int, **options: Any) -> None:
    """Write 0..1999 (two tasks of 1000 rows, chunks of 50) to `stream.all`, a stream created
    with `max_msg_size=TOO_LARGE`; the first attempt of the task holding `fail_at` fails there
    (JetStream refuses that row as too large), after the chunks before it were published."""
    from pyspark.sql.functions import col, udf

    @udf("string")
    def data_failing_once(n: int) -> str:
        from pyspark import TaskContext

        if n == fail_at and TaskContext.get().attemptNumber() == 0:
            return "x" * (TOO_LARGE + 1)
        return str(n)

    small = {"spark.sql.execution.arrow.maxRecordsPerBatch": "50"}  # chunks of 50 rows
    before = {key: spark.conf.get(key) for key in small}
    try:
        for key, value in small.items():
            spark.conf.set(key, value)
        df = spark.range(0, 2000, numPartitions=2).select(
            data_failing_once(col("id")).alias("data")
        )
        url = options.pop("url")
        writer(df, url, stream=stream, subject=f"{stream}.all", **options).save()
    finally:
        for key, value in before.items():
            spark.conf.set(key, value)


def test_task_failure_mid_write_stores_each_row_once(spark, client, settings, nats_url, unique):
    """A task fails after it published part of its rows; Spark runs it again, which publishes
    them all again with the same message ids: the stream keeps one copy of each."""
    stream = target(client, f"F{unique}", max_msg_size=TOO_LARGE)
    counter = CoreCounter(settings, f"{stream}.>")
    try:
        failing_write(spark, stream, 1700, url=nats_url)
        wait_until(lambda: counter.count > 2000, 10, "the retried rows to be seen")
    finally:
        counter.close()
    assert_exactly_once(values(client, stream), 2000)
    assert counter.count > 2000, "the retried task published nothing a second time"


def test_atomic_batches_with_a_task_failure_mid_write(spark, client, settings, nats_url, unique):
    """On a stream with allow_atomic every row lands in an atomic batch of atomicBatchSize
    consecutive rows of one task (all stored at its commit, or none); a task that fails after
    seven of its batches is run again: the server refuses those seven as holding stored ids, the
    retry sends them row by row (all dropped as duplicates) and stores the rest in batches."""
    needs_server(client, (2, 12, 0), "atomic batch publish")
    stream = target(client, f"AB{unique}", atomic=True, max_msg_size=TOO_LARGE)
    counter = CoreCounter(settings, f"{stream}.>")
    try:
        failing_write(spark, stream, 1750, url=nats_url, atomicBatchSize=100)
        wait_until(lambda: counter.count >= 2700, 10, "the retried rows to be seen")
    finally:
        counter.close()
    messages = stored(client, stream)
    assert_exactly_once([int(m.data.decode()) for m in messages], 2000)
    batches: dict[str, list[tuple[int, int]]] = {}
    for message in messages:
        batch = message.headers and dict(
            line.split(": ", 1) for line in message.headers.decode().split("\r\n")[1:] if line
        ).get("Nats-Batch-Id")
        assert batch, f"row {message.data!r} was not published in an atomic batch"
        batches.setdefault(batch, []).append((message.seq, int(message.data.decode())))
    assert len(batches) == 20
    for rows in batches.values():
        seqs, values_ = zip(*rows, strict=True)
        assert len(rows) == 100 and values_[0] % 100 == 0
        assert list(seqs) == list(range(seqs[0], seqs[0] + 100)), "a batch was interleaved"
        assert list(values_) == list(range(values_[0], values_[0] + 100))
    # first attempt: 1700 rows; retry of the failed task: 1000 (700 of them row by row)
    assert counter.count >= 2700


def test_atomic_batch_size_needs_a_stream_that_allows_it(spark, client, nats_url, unique):
    stream = target(client, f"NA{unique}")
    df = spark.createDataFrame([("1",)], "data STRING")
    with pytest.raises(Exception, match=f"stream '{stream}' does not allow atomic batches"):
        writer(df, nats_url, subject=f"{stream}.x", stream=stream, atomicBatchSize=10).save()
    assert values(client, stream) == []


@pytest.mark.compat
def test_streaming_group_to_stream_exactly_once_across_a_replay(
    spark, client, nats_url, unique, tmp_path
):
    """nats-pcg -> Spark -> nats. A batch re-run after a crash (its commit log entry gone) is
    published again with the same ids and dropped; after the duplicate window it is stored
    twice, as docs/sink.md says. The window is long for the replay (a slow machine must not
    outlast it) and shortened before the late one (a stream update applies to stored ids)."""
    source_stream = f"SG{unique}"
    static_group(client, source_stream, "g", ["m1", "m2"], partitions=4)
    sink_stream = target(client, f"SK{unique}", window=600.0)
    publish(client, source_stream, 500)
    checkpoint = tmp_path / "cp"

    def run_once() -> int:
        """One batch (trigger once: no later batch acks it, as after a crash); its row count."""
        df = source(spark, nats_url, source_stream, "g").selectExpr(
            f"concat('{sink_stream}.', cast(partition as string)) as subject", "data"
        )
        query = (
            df.writeStream.format("nats")
            .option("servers", nats_url)
            .option("stream", sink_stream)
            .option("checkpointLocation", str(checkpoint))
            .trigger(once=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
        return sum(progress["numInputRows"] for progress in query.recentProgress)

    assert run_once() == 500
    assert_exactly_once(values(client, sink_stream), 500)

    def forget_commit() -> None:
        """A crash after the sink wrote batch 0, before Spark's commit log: it runs again."""
        (checkpoint / "commits" / "0").unlink()
        (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)

    forget_commit()
    assert run_once() == 500  # the same rows again (the ledger replays them), ids dropped
    assert_exactly_once(values(client, sink_stream), 500)
    # The same, later than the stream's duplicate window: stored twice (documented).
    forget_commit()
    assert stores_probe(client, sink_stream, "newest")  # its id is newer than every row's
    config = run_sync(client.api.stream_info(sink_stream)).config
    # An update that changes the window fires the server's purge timer at once, but before it
    # applies the new window (nats-server 2.15 stream.go, update): a purge that wins that race
    # keeps the old 600 s and sleeps that long. A second change, from 2 s to 1 s, fires it again
    # with a window of at most 2 s whichever side wins.
    for seconds in (2.0, 1.0):
        run_sync(client.api.update_stream({**config, "duplicate_window": int(seconds * NANOS)}))
    # The server purges ids older than the window on its own timer: once the probe, stored
    # after every row, is forgotten, so are the rows' ids.
    wait_until(lambda: stores_probe(client, sink_stream, "newest"), 60, "the window to pass")
    assert run_once() == 500
    assert len(values(client, sink_stream)) == 1000


@pytest.mark.parametrize(
    "frame, options, message",
    [
        ("value STRING", {}, "column data is missing"),
        ("data INT", {}, "column data has type int"),
        ("data STRING", {}, "no subject: the DataFrame has no subject column"),
        ("subject INT, data STRING", {}, "column subject has type int"),
        ("subject STRING, data STRING, headers INT", {}, "column headers has type int"),
        ("data STRING", {"subject": "a b"}, "option subject='a b' is not a subject"),
        ("data STRING", {"subject": "elsewhere.x"}, "subject 'elsewhere.x' is not captured"),
        ("data STRING", {"subject": "X.y", "stream": "NOPE"}, "stream 'NOPE' does not exist"),
        ("data STRING", {"subject": "X.y", "retryTimeout": "soon"}, "retryTimeout='soon'"),
        ("data STRING", {"subject": "X.y", "colour": "blue"}, "unknown option 'colour'"),
        ("data STRING", {"subject": "X.y", "atomicBatchSize": "5000"}, "atomicBatchSize"),
        ("data STRING", {"subject": "X.y", "atomicBatchSize": "9"}, "needs the stream option"),
    ],
)
def test_bad_input_fails_before_anything_is_published(spark, nats_url, frame, options, message):
    df = spark.createDataFrame([], frame)
    with pytest.raises(Exception, match=message):
        writer(df, nats_url, **options).save()


def test_a_streaming_write_to_a_missing_stream_fails_at_its_first_batch(
    spark, nats_url, unique, tmp_path
):
    """Spark asks a Python sink nothing at start(): the first micro-batch checks the target
    before any of its tasks runs, and fails the query; `one_line_failures` raises the line
    alone."""
    rows = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    query = (
        rows.selectExpr("'X.y' AS subject", "CAST(value AS STRING) AS data")
        .writeStream.format("nats")
        .option("servers", nats_url)
        .option("stream", f"NO{unique}")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    with pytest.raises(SparkFailed) as failed, one_line_failures(spark):
        query.awaitTermination(120)
    assert str(failed.value) == (
        f"stream 'NO{unique}' does not exist on {nats_url}; create it or fix the stream option"
    )
    assert not query.recentProgress  # no batch completed


def test_a_row_no_stream_captures_fails_the_write_once_with_one_line(
    spark, client, nats_url, unique
):
    """Such a row fails every attempt the same way: its task ends without it and the driver
    fails the write, rather than Spark running the task again (three attempts here)."""
    stream = target(client, f"NC{unique}")
    df = spark.createDataFrame(
        [(f"{stream}.a", "1"), ("nowhere.b", "2")], "subject STRING, data STRING"
    )
    context = spark.sparkContext
    context.setJobGroup(f"refused-{unique}", "a write with a refused row")
    try:
        with pytest.raises(Exception) as caught:  # noqa: B017 - Spark wraps it in its own types
            writer(df.coalesce(1), nats_url).save()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    first = str(caught.value).splitlines()[0]
    assert "ConfigurationError: subject 'nowhere.b' is not captured by no stream" in first
    assert values(client, stream) == []  # its chunk was checked before any of it was sent
    tracker = context.statusTracker()
    [job] = tracker.getJobIdsForGroup(f"refused-{unique}")
    stages = [tracker.getStageInfo(stage) for stage in tracker.getJobInfo(job).stageIds]
    assert [(s.numCompletedTasks, s.numFailedTasks) for s in stages] == [(1, 0)]


def test_overwrite_is_refused(spark, nats_url):
    df = spark.createDataFrame([("1",)], "data STRING")
    with pytest.raises(Exception, match=r"cannot be overwritten; use mode\('append'\)"):
        df.write.format("nats").mode("overwrite").option("servers", nats_url).save()


def test_server_restart_mid_write(spark, unique):
    """The server dies while a task publishes: the task waits, sends again what was not
    acknowledged, and the stream still holds each row once."""
    from nats_spark.server import EmbeddedServer

    with EmbeddedServer() as server:
        own = run_sync(NatsClient.open(ConnectionSettings(servers=(server.url,))))
        try:
            stream = target(own, f"R{unique}")

            def stored_count() -> int:
                return run_sync(own.api.stream_info(stream))["state"]["messages"]

            df = spark.range(0, 50_000, numPartitions=2).selectExpr("cast(id as string) as data")

            def restart() -> None:  # once part of the rows is stored
                wait_until(lambda: 0 < stored_count() < 40_000, 60, "the write under way", 0.01)
                server.kill()
                time.sleep(1.0)  # time under test: the task's publishes meet a 1 s outage
                server.start()

            with ThreadPoolExecutor(1) as pool:
                restarted = pool.submit(restart)
                writer(df, server.url, subject=f"{stream}.n", stream=stream).save()
                restarted.result()  # the kill and restart happened (or the test fails with why)
            assert_exactly_once(values(own, stream), 50_000)
        finally:
            run_sync(own.close())


# Not `compat`: on the older Sparks the sink's replay runs in
# test_streaming_group_to_stream_exactly_once_across_a_replay and the source's driver kills in
# test_driver_kills.test_driver_killed_at_fixed_points; this one (their sum, 2 minutes) on the
# newest.
@pytest.mark.timeout(600)  # two job starts: a JVM each
def test_driver_killed_group_to_stream_exactly_once(client, nats_url, unique, tmp_path):
    """nats-pcg -> Spark -> nats in a job process, SIGKILLed (with its JVM) while batches are
    published, restarted from its checkpoint: the target stream holds every message once and the
    group is acked. The target allows atomic batches, which the sink then uses without being told.

    One kill: a restarted job killed again, writing to the nats sink, is the kill sweep's second
    round (test_chaos.test_kill_sweep, at a seal of the batch the restarted job re-runs); a
    static group's driver killed twice is
    test_source_recovery.test_driver_kill_minus_nine_twice_then_restart."""

    source_stream, sink_stream = f"KS{unique}", f"KT{unique}"
    static_group(client, source_stream, "g", ["m1", "m2"], partitions=4)
    target(client, sink_stream, atomic=True)
    # 150 a batch: the kill lands from the third batch on with under 1,200 stored, so the
    # restarted job has 300 or more left to read (3,000 only added ten batches after the restart).
    publish(client, source_stream, 1500)

    def job(trigger: str) -> Any:
        return launch(
            f"job-{trigger}-{time.monotonic_ns()}",
            [
                sys.executable,
                "-m",
                "nats_spark.job",
                "--servers",
                nats_url,
                "--stream",
                source_stream,
                "--group",
                "g",
                "--checkpoint",
                str(tmp_path / "cp"),
                "--trigger",
                trigger,
                "--option",
                "maxMessagesPerTrigger=150",
                "--format",
                "nats",
                "--sink-prefix",
                sink_stream,
                "--sink-stream",
                sink_stream,
            ],
            tmp_path / "logs",
            spark_env(),
        )

    def count() -> int:
        return run_sync(client.api.stream_info(sink_stream))["state"]["messages"]

    running = job("200ms")
    try:  # kill -9 while batches are written; a JVM start and a few batches: minutes when busy
        wait_until(lambda: count() >= 300, 240, "300 messages published", 0.05)
        assert count() < 1200, "the job ran past the window to kill it in"
    finally:
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait(30)
    # Run on until idle, which acks the last batch. Not availableNow: what a killed task held
    # unrecorded comes back only after its ack wait, maybe after such a run has ended (it reads
    # what is there when it starts: README, after the quick start).
    final = job("200ms")
    try:
        done = lambda: count() >= 1500 and settled(client, source_stream)  # noqa: E731
        wait_until(done, 240, "every message published and acked", 0.5)
    finally:
        final.stop()
    messages = stored(client, sink_stream)
    assert_exactly_once([int(m.data.decode()) for m in messages], 1500)
    if client.server_version >= (2, 12, 0):  # 2.11 ignores allow_atomic: row by row
        assert all(b"Nats-Batch-Id: " in (m.headers or b"") for m in messages)
    assert settled(client, source_stream), "messages of the group left unacked"


def test_auth_failure_is_one_line_without_the_secret(spark):
    from nats_spark.server import EmbeddedServer

    with EmbeddedServer(extra_args=["--user", "writer", "--pass", "right-Pw7"]) as server:
        df = spark.createDataFrame([("1",)], "data STRING")
        w = writer(df, server.url, subject="x.y", user="writer", password="wrong-Pw8")
        with pytest.raises(Exception) as caught:
            w.save()
    text = str(caught.value)
    assert "refused the credentials" in text and "wrong-Pw8" not in text, text


def test_a_refused_row_is_said_once_and_the_window_warning_once(client, nats_url, unique, tmp_path):
    """In a fresh Spark with task retries, as a user sees it: a streaming write reaching a row no
    stream captures fails without a task retry, the connector's line first in the error; the
    duplicate-window warning, checked again with every micro-batch, is logged once, labelled
    and naming the fix; a batch write before it (whose message ids no restart repeats) says
    nothing of the window."""
    stream = target(client, f"NOISE{unique}", window=60)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    driver = Path(__file__).with_name("sink_refusal_driver.py")
    args = [sys.executable, str(driver), nats_url, stream, str(tmp_path / "checkpoint")]
    run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
    output = run.stdout + run.stderr
    refused = f"subject 'nowhere.b' is not captured by stream '{stream}'"
    failed = [line for line in run.stdout.splitlines() if line.startswith("QUERY FAILED: ")]
    assert failed and "nats_spark.errors.ConfigurationError: " + refused in failed[0], output
    assert "Lost task" not in output and "failed 4 times" not in output, output
    # Once in Spark's log of the query's end, once in the error the query raised.
    assert output.count(refused) == 2, output
    assert output.count("drops repeated message ids") == 1, output
    warning = f"nats sink warning: stream {stream} drops repeated message ids within 60s only"
    assert output.count(warning) == 1 and "--dupe-window 1h" in output, output
    stored_values = values(client, stream)  # from batches before the refused row's
    assert len(set(stored_values)) == len(stored_values) and set(stored_values) <= set(range(5))
