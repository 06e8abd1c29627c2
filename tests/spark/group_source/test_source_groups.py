"""The nats-pcg source over static and elastic groups, with a real Spark session and server."""

from __future__ import annotations

import json
import threading

import pytest
from spark_helpers import (
    ACKS_LAST_BATCH,
    REPORTS_LAG,
    assert_exactly_once,
    assert_no_pandas_in_workers,
    check_trigger_pacing,
    consumers_of,
    elastic_group,
    foreach_batches,
    member_states,
    payloads,
    publish,
    run_query,
    settled,
    source,
    static_group,
    unpinned,
    wait_until,
)

from nats_spark.loop import run_sync
from nats_spark.pcg import admin

pytestmark = pytest.mark.spark


def assert_acked_but_last_batch(client, stream, group, last_batch: int) -> None:
    states = member_states(client, stream, group).values()
    assert all(s["pending"] == 0 for s in states)
    unacked = sum(s["ack_pending"] for s in states)
    # Before Spark 4.2 nothing tells the source that the run's last batch committed.
    assert unacked == (0 if ACKS_LAST_BATCH else last_batch)


@pytest.mark.compat("4.0")
def test_static_group_available_now_exactly_once_and_acked(
    spark, client, nats_url, unique, tmp_path
):
    stream, group = f"S{unique}", "g"
    static_group(client, stream, group, ["m1", "m2", "m3"], partitions=6)
    publish(client, stream, 600)
    df = source(spark, nats_url, stream, group, ackWait="30s")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")

    def run() -> None:
        query = (
            df.writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None

    run()
    assert_no_pandas_in_workers()  # nothing but this source ran in this session's workers
    assert_exactly_once(payloads(spark, out), 600)
    assert_acked_but_last_batch(client, stream, group, 600)
    rows = spark.read.parquet(out)
    members = {
        r.member: r.partition for r in rows.select("member", "partition").distinct().collect()
    }
    assert set(members) == {"m1", "m2", "m3"}
    first = rows.orderBy("stream_seq").first()
    assert first.subject.startswith(f"{stream}.k") and first.stream == stream
    assert first.headers == {"n": [first.data.decode()]} and first.delivered == 1

    publish(client, stream, 300, start=600)
    run()  # restart from the checkpoint: acks what the first run left, then reads on
    assert_exactly_once(payloads(spark, out), 900)
    assert_acked_but_last_batch(client, stream, group, 300)


@pytest.mark.compat("4.0")
def test_next_batch_acks_a_full_consumer_and_reads_on(spark, client, nats_url, unique, tmp_path):
    """maxAckPending 50 over one partition: each batch takes 50, and the next batch's task acks
    them before it pulls, so the next batch reads on: no batch between them that only acks.
    Before Spark 4.2 an availableNow run on a Python source is one batch (Spark falls back to
    Trigger.Once), and nothing says that a run's batch committed before Spark plans the next
    one: each run after a full batch only acks it, and the run after that reads on."""
    stream, group = f"CAP{unique}", "g"
    static_group(client, stream, group, ["m1"], partitions=1)
    publish(client, stream, 200)
    df = source(spark, nats_url, stream, group, maxAckPending=50)
    expected = [[50, 50, 50, 50, 0]] if ACKS_LAST_BATCH else [[50], [0], [50], [0], [50], [0], [50]]
    rows = []
    for _ in expected:
        query, error = run_query(df, tmp_path)
        assert error is None, error
        rows.append([p["numInputRows"] for p in query.recentProgress])
    assert_exactly_once(payloads(spark, str(tmp_path / "out")), 200)
    assert rows == expected, rows
    assert_acked_but_last_batch(client, stream, group, 50)


@pytest.mark.compat("4.0")
def test_elastic_group_processing_time_leaves_nothing_unacked(
    spark, client, nats_url, unique, tmp_path
):
    stream, group = f"E{unique}", "eg"
    elastic_group(client, stream, group, ["a", "b"], partitions=4)
    publish(client, stream, 500)
    seen: list[int] = []

    def collect(batch, batch_id):
        seen.extend(int(r.data.decode()) for r in batch.select("data").collect())

    df = source(spark, nats_url, stream, group, ackWait="20s", maxMessagesPerTrigger=150)
    query = foreach_batches(df, collect, tmp_path / "cp", "300 milliseconds")
    try:
        wait_until(lambda: len(seen) >= 500, 90, "500 rows")
        # Idle now: the query must ack its last batch without new data arriving.
        wait_until(lambda: settled(client, stream, group), 30, "all members acked")
        assert query.exception() is None
        # Progress is reported once a batch has ended, after its rows reached the sink.
        batch_rows = lambda: [p["numInputRows"] for p in query.recentProgress]  # noqa: E731
        wait_until(lambda: sum(batch_rows()) >= 500, 30, "the progress of every batch")
    finally:
        query.stop()
    assert_exactly_once(seen, 500)
    assert sum(batch_rows()) == 500 and max(batch_rows()) <= 150, batch_rows()


@pytest.mark.compat("4.0")
def test_no_ack_before_commit(spark, client, nats_url, unique, tmp_path):
    stream, group = f"N{unique}", "g"
    static_group(client, stream, group, ["m1", "m2"], partitions=4)
    publish(client, stream, 400)
    seen: list[int] = []
    violations: list[str] = []

    def check(batch, batch_id):
        rows = batch.select("member", "data").collect()
        states = member_states(client, stream, group)
        for member in ("m1", "m2"):
            taken = sum(1 for r in rows if r.member == member)
            pending = states[member]["ack_pending"]
            # While the batch is in flight none of its messages may be acked.
            if pending < taken:
                violations.append(f"batch {batch_id} {member}: {taken} rows, {pending} pending")
        seen.extend(int(r.data.decode()) for r in rows)

    df = source(spark, nats_url, stream, group, maxMessagesPerTrigger=100)
    query = foreach_batches(df, check, tmp_path / "cp", "200 milliseconds")
    try:
        wait_until(lambda: len(seen) >= 400, 90, "400 rows")
        wait_until(lambda: settled(client, stream, group), 30, "acks after commit")
    finally:
        query.stop()
    assert not violations, violations
    assert_exactly_once(seen, 400)


@pytest.mark.compat("4.0")
def test_ack_wait_shorter_than_batch_messages_held_until_commit(
    spark, client, nats_url, unique, tmp_path
):
    """A batch that runs longer than the ack wait: the task keeps restarting the ack wait of what
    it took (in-progress acks), so nothing comes back before the commit acks it."""
    stream, group = f"R{unique}", "g"
    static_group(client, stream, group, ["m1"], partitions=2)
    publish(client, stream, 14000)
    seen: list[int] = []
    redelivered: list[int] = []

    def collect(batch, batch_id):
        seen.extend(int(r.data.decode()) for r in batch.select("data").collect())
        for consumer in consumers_of(client, stream, group, "m1"):
            info = run_sync(client.api.consumer_info(consumer.stream, consumer.name))
            redelivered.append(info["num_redelivered"])

    # Pulls of one message, each recorded in the ledger: the task outlasts the 2 s ack wait
    # (5,000 such pulls read for ~1.5 s in CI's fastest run). Not shorter: on two cores shared
    # with another test's Spark a task's round of 3,400 progress acks took 0.3-0.5 s to go out,
    # and rounds came 0.7-0.9 s apart, which a 1 s wait does not survive.
    df = source(spark, nats_url, stream, group, ackWait="2s", fetchBatchSize=1)
    query = foreach_batches(df, collect, tmp_path / "cp", "100 milliseconds")
    try:
        wait_until(lambda: len(seen) >= 14000, 240, "14000 rows")
        wait_until(lambda: settled(client, stream, group), 60, "all acked")
        longest = max(p.durationMs.get("triggerExecution", 0) for p in query.recentProgress)
    finally:
        query.stop()
    assert longest > 2500, f"the batches ({longest} ms) did not outlast the ack wait"
    assert max(redelivered) == 0, f"{max(redelivered)} messages came back before their commit"
    assert_exactly_once(seen, 14000)


def test_elastic_membership_change_followed(spark, client, nats_url, unique, tmp_path):
    stream, group = f"M{unique}", "eg"
    elastic_group(client, stream, group, ["a", "b"], partitions=4)
    publish(client, stream, 200)
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def collect(batch, batch_id):
        with lock:
            seen.extend(
                (r.member, int(r.data.decode())) for r in batch.select("member", "data").collect()
            )

    def members_read() -> set[str]:
        """The members the latest trigger planned to read (its progress report's lag)."""
        progress = query.lastProgress
        report = json.loads(progress["sources"][0]["latestOffset"] or "{}") if progress else {}
        return set(report.get("lag", {}).get("byMember", {}))

    df = source(spark, nats_url, stream, group, ackWait="5s")
    query = foreach_batches(df, collect, tmp_path / "cp", "300 milliseconds", report_idle=True)
    try:
        wait_until(lambda: len(seen) >= 200, 90, "first 200 rows")
        run_sync(admin.add_members(client.target, stream, group, ["c"]))
        publish(client, stream, 200, start=200)
        wait_until(lambda: len(seen) >= 400, 90, "rows after adding c")
        run_sync(admin.drop_members(client.target, stream, group, ["a"]))
        # A batch planned before the drop may still read a's consumer: publish once a trigger
        # has planned without it (triggers run one after another).
        wait_until(lambda: members_read() == {"b", "c"}, 60, "a trigger planned without a")
        publish(client, stream, 200, start=400)
        wait_until(lambda: len({v for _, v in seen}) >= 600, 90, "rows after dropping a")
        assert query.exception() is None
    finally:
        query.stop()
    assert_exactly_once([v for _, v in seen], 600)
    assert any(m == "c" for m, v in seen if v >= 200), "added member c never read"
    assert not any(m == "a" for m, v in seen if v >= 400), "dropped member a still read"


def test_starting_position_applies_to_new_consumers_only(spark, client, nats_url, unique, tmp_path):
    import datetime
    import time

    stream = f"SP{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 60)
    time.sleep(0.05)  # time under test: `middle` is a clock reading between the two publishes
    middle = datetime.datetime.now(datetime.UTC).isoformat()
    time.sleep(0.05)
    publish(client, stream, 40, start=60)

    def run(position: str, checkpoint: str) -> list[int]:
        # The previous query's pins time out (priority_timeout = ackWait).
        wait_until(lambda: unpinned(client, stream, "g"), 30, "the previous query's pins to go")
        df = source(spark, nats_url, stream, "g", startingPosition=position, ackWait="1s")
        query = (
            df.writeStream.format("memory")
            .queryName(f"sp_{unique}_{checkpoint}")
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120) and query.exception() is None
        rows = spark.sql(f"SELECT data FROM sp_{unique}_{checkpoint}").collect()
        return sorted(int(r.data.decode()) for r in rows)

    assert run(f"time:{middle}", "a") == list(range(60, 100))
    # The group's consumers exist now: another starting position does not move them. (Before
    # Spark 4.2 the first query's last batch stays unacked when it stops, and comes back.)
    publish(client, stream, 5, start=100)
    assert run("earliest", "b") == list(range(100 if ACKS_LAST_BATCH else 60, 105))
    admin_delete = run_sync(admin.delete_static(client.target, stream, "g"))
    assert admin_delete  # the partition consumers went with the group
    run_sync(admin.create_static(client.target, stream, "g", 4, members=["m1", "m2"]))
    assert run("sequence:101", "c") == list(range(100, 105))
    publish(client, stream, 3, start=105)
    run_sync(admin.delete_static(client.target, stream, "g"))
    run_sync(admin.create_static(client.target, stream, "g", 4, members=["m1", "m2"]))
    assert run("latest", "d") == []


def test_trigger_pacing(spark, client, nats_url, unique, tmp_path):
    stream = f"TP{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 5)
    df = source(spark, nats_url, stream, "g", minMessagesPerTrigger=20, maxTriggerDelay="5s")
    check_trigger_pacing(
        df, lambda start, count: publish(client, stream, count, start=start), tmp_path
    )


@pytest.mark.skipif(
    not REPORTS_LAG,
    reason="Spark 4.2+ puts reportLatestOffset in progress and runs availableNow "
    "in several batches for Python sources",
)
@pytest.mark.parametrize("layout", ["partition", "member"])
def test_lag_in_progress(spark, client, nats_url, unique, tmp_path, layout):
    stream = f"LG{unique}{layout[0]}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 500)
    df = source(spark, nats_url, stream, "g", consumerLayout=layout, maxMessagesPerTrigger=100)
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120) and query.exception() is None
    taken = 0
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) >= 5
    for progress in batches:
        lag = json.loads(progress["sources"][0]["latestOffset"])["lag"]
        assert lag["total"]["pending"] == 500 - taken  # earlier batches took the rest
        taken += progress["numInputRows"]
        assert lag["total"]["behindLatest"] == 500 - taken, (taken, lag)
        assert set(lag["byMember"]) == {"m1", "m2"}
        for field in ("pending", "ackPending", "behindLatest"):
            assert sum(m[field] for m in lag["byMember"].values()) == lag["total"][field]
    assert taken == 500
