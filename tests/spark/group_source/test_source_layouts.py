"""The two read layouts of a group: a consumer per partition (the default) or per member (Go's),
the refusal to mix them with running Go-layout members, and moving a group between them."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from spark_helpers import (
    REPORTS_LAG,
    Collector,
    assert_exactly_once,
    consumers_of,
    drained,
    elastic_group,
    foreach_batches,
    payloads,
    publish,
    run_query,
    settled,
    source,
    static_group,
    unpinned,
    wait_for_triggers,
    wait_until,
)

from nats_spark.loop import run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.consumers import (
    PRIORITY_GROUP,
    ensure_group_consumer,
    member_consumer,
    partition_consumer,
    read_stream,
)
from nats_spark.pcg.member import GroupMember, consume
from nats_spark.pcg.store import load_group

pytestmark = pytest.mark.spark

# How often an idle query reports progress (Spark's default: every 10 s).


def names(client: Any, stream: str) -> list[str]:
    return sorted(run_sync(client.api.consumer_names(stream)))


def go_member(client: Any, stream: str, group: str, member: str) -> GroupMember:
    """A running Go-layout member (this project's member runtime) that acks what it gets."""

    async def handle(message: Any) -> None:
        await message.ack()

    return run_sync(consume(client.target, stream, group, member, handle))


def test_partition_layout_is_the_default(spark, client, nats_url, unique, tmp_path):
    """8 partitions over 4 members: one single-filter pinned durable per partition, one Spark
    input partition each; the member column names each partition's owner; no member consumer."""
    stream, group = f"PL{unique}", "g"
    static_group(client, stream, group, ["m1", "m2", "m3", "m4"], partitions=8)
    publish(client, stream, 800)
    query, error = run_query(
        source(spark, nats_url, stream, group, ledgerBucket=f"L{unique}"), tmp_path
    )
    assert error is None, error
    rows = spark.read.parquet(str(tmp_path / "out")).select("member", "partition", "data")
    rows = rows.collect()
    assert_exactly_once([int(r.data.decode()) for r in rows], 800)
    owners = {r.partition: r.member for r in rows}
    assert owners == {p: f"m{p // 2 + 1}" for p in range(8)}
    assert names(client, stream) == [f"g-partition-{p}" for p in range(8)]
    for p in range(8):
        info = run_sync(client.api.consumer_info(stream, f"g-partition-{p}"))
        config = info["config"]
        assert config["filter_subject"] == f"{p}.>" and not config.get("filter_subjects")
        assert config["priority_groups"] == [PRIORITY_GROUP]
        assert config["priority_policy"] == "pinned_client"
        assert config["durable_name"] == f"g-partition-{p}"
    wait_until(lambda: settled(client, stream, group), 30, "every partition acked")
    if REPORTS_LAG:
        report = json.loads(query.lastProgress["sources"][0]["latestOffset"])
        assert report["layout"] == "partition"
        assert report["members"]["partition-5"]["member"] == "m3"
    # The group's deletion takes the partition consumers along.
    deleted = run_sync(admin.delete_static(client.target, stream, group))
    assert sorted(deleted) == [f"g-partition-{p}" for p in range(8)]
    assert names(client, stream) == []


def test_active_go_member_refused_at_start_and_auto_reads_its_layout(
    spark, client, nats_url, unique, tmp_path
):
    stream, group = f"GM{unique}", "g"
    static_group(client, stream, group, ["m1", "m2"], partitions=4)
    publish(client, stream, 200)
    member = go_member(client, stream, group, "m1")
    try:
        wait_until(lambda: member.active, 10, "the Go-layout member to hold its pin")
        _, error = run_query(
            source(spark, nats_url, stream, group, consumerLayout="partition"), tmp_path / "a"
        )
        assert error is not None
        assert "Go-layout member 'm1'" in str(error) and "consumerLayout=member" in str(error)
        # Refused before anything was taken: no partition consumer was created.
        assert not [n for n in names(client, stream) if "partition" in n]

        # auto reads the member layout beside the running member: m2's share, all of it.
        publish(client, stream, 100, start=200)
        _, error = run_query(source(spark, nats_url, stream, group), tmp_path / "b")
        assert error is None, error
        rows = spark.read.parquet(str(tmp_path / "b" / "out")).select("member").collect()
        assert {r.member for r in rows} == {"m2"}
        assert not [n for n in names(client, stream) if "partition" in n]
    finally:
        run_sync(member.stop())


def test_go_member_starting_while_running_stops_the_query(
    spark, client, nats_url, unique, tmp_path
):
    stream, group = f"GR{unique}", "g"
    static_group(client, stream, group, ["m1", "m2"], partitions=4)
    publish(client, stream, 100)
    seen: list[int] = []

    def collect(batch: Any, batch_id: int) -> None:
        seen.extend(int(r.data.decode()) for r in batch.select("data").collect())

    query = foreach_batches(source(spark, nats_url, stream, group), collect, tmp_path / "cp")
    member = None
    try:
        wait_until(lambda: len(seen) >= 100, 60, "100 rows")
        member = go_member(client, stream, group, "m2")
        publish(client, stream, 100, start=100)
        wait_until(lambda: query.exception() is not None, 30, "the query to stop")
        assert "Go-layout member 'm2'" in str(query.exception())
    finally:
        query.stop()
        if member is not None:
            run_sync(member.stop())


@pytest.mark.parametrize("kind", ["static", "elastic"])
def test_group_moves_between_layouts_without_loss_or_repeat(
    spark, client, nats_url, unique, tmp_path, kind
):
    """member layout -> partition layout -> member layout, one checkpoint, messages published
    in between: every message exactly once; the old layout's consumers are moved past or gone."""
    stream, group = f"MV{unique}", "g"
    make = static_group if kind == "static" else elastic_group
    make(client, stream, group, ["m1", "m2"], partitions=4)
    entry = run_sync(load_group(client.target, stream, group))
    where = read_stream(entry)
    values: list[int] = []

    def run(layout: str, first: int, count: int) -> None:
        publish(client, stream, count, start=first)
        df = source(
            spark, nats_url, stream, group, consumerLayout=layout, ledgerBucket=f"L{unique}"
        )
        _, error = run_query(df, tmp_path)
        assert error is None, error
        values[:] = payloads(spark, str(tmp_path / "out"))
        wait_until(lambda: settled(client, stream, group), 30, "everything acked")

    run("member", 0, 300)
    member_names = [member_consumer(entry, m).name for m in ("m1", "m2")]
    assert set(member_names) <= set(names(client, where))
    run("partition", 300, 300)
    partition_names = [partition_consumer(entry, p).name for p in range(4)]
    assert set(partition_names) <= set(names(client, where))
    if kind == "elastic":
        assert not set(member_names) & set(names(client, where)), "overlapping consumers"
    run("member", 600, 300)
    assert not set(partition_names) & set(names(client, where)), "partition consumers left"
    assert_exactly_once(values, 900)


def test_member_layout_refused_while_a_partition_lags_behind(
    spark, client, nats_url, unique, tmp_path
):
    """Back to the member layout needs one start for all of a member's partitions: refused while
    one partition's consumer is behind another's (its unread messages would be skipped)."""
    stream, group = f"MB{unique}", "g"
    static_group(client, stream, group, ["m1"], partitions=2)
    publish(client, stream, 400)
    _, error = run_query(source(spark, nats_url, stream, group, ackWait="1s"), tmp_path / "a")
    assert error is None, error
    publish(client, stream, 100, start=400)
    # The query's pins time out (priority_timeout = ack wait).
    wait_until(lambda: unpinned(client, stream, group), 30, "the query's pins to go")
    entry = run_sync(load_group(client.target, stream, group))
    ahead = client.pull_consumer(stream, partition_consumer(entry, 0).name, group=PRIORITY_GROUP)
    result = run_sync(ahead.fetch(100, expires=1.0))
    assert result.messages, "partition 0 had nothing new"
    for msg in result.messages:
        run_sync(msg.ack())
    _, error = run_query(
        source(spark, nats_url, stream, group, consumerLayout="member"), tmp_path / "a"
    )
    assert error is not None and "partition 1 has not been read up to" in str(error), error
    assert "consumerLayout=partition" in str(error)
    assert f"{group}-m1" not in names(client, stream)


def test_static_partition_consumer_deleted_while_running_fails_clearly(
    spark, client, nats_url, unique, tmp_path
):
    stream, group = f"PD{unique}", "g"
    static_group(client, stream, group, ["m1"], partitions=2)
    publish(client, stream, 50)
    seen: list[int] = []

    def collect(batch: Any, batch_id: int) -> None:
        seen.extend(int(r.data.decode()) for r in batch.select("data").collect())

    query = foreach_batches(source(spark, nats_url, stream, group), collect, tmp_path / "cp")
    try:
        wait_until(lambda: len(seen) >= 50, 60, "50 rows")
        [first, _] = consumers_of(client, stream, group, "m1")
        run_sync(client.api.delete_consumer(first.stream, first.name))
        publish(client, stream, 10, start=50)
        wait_until(lambda: query.exception() is not None, 30, "the query to stop")
        assert f"partition consumer '{first.name}'" in str(query.exception())
    finally:
        query.stop()


def test_member_named_like_a_partition_consumer_is_refused(
    spark, client, nats_url, unique, tmp_path
):
    stream, group = f"PN{unique}", "g"
    static_group(client, stream, group, ["partition-1", "m2"], partitions=2)
    publish(client, stream, 10)
    _, error = run_query(source(spark, nats_url, stream, group), tmp_path)
    assert error is not None and "named like the partition layout" in str(error), error
    # The member layout reads it.
    _, error = run_query(
        source(spark, nats_url, stream, group, consumerLayout="member"), tmp_path / "m"
    )
    assert error is None, error
    assert len(payloads(spark, str(tmp_path / "m" / "out"))) == 10


class MemberRows(list[tuple[str, int]]):
    """foreachBatch target: (member, payload number) of every row, in the order read."""

    def __call__(self, batch: Any, batch_id: int) -> None:
        self.extend((r.member, int(r.data.decode())) for r in batch.collect())


def test_elastic_membership_change_keeps_partition_consumers(
    spark, client, nats_url, unique, tmp_path
):
    """Adding and dropping members moves partitions between owners, not between consumers: the
    partition consumers stay, the member column follows the new owner."""
    stream, group = f"EM{unique}", "g"
    elastic_group(client, stream, group, ["a"], partitions=4)
    publish(client, stream, 200)
    rows = MemberRows()

    def reloaded(owners: set[str]) -> None:
        """Until the idle query has reloaded the group: its partitions' owners are `owners` in
        progress (reported without data every trigger, see below). Before Spark 4.2 there is no
        such report: 1 s is five reloads (0.2 s triggers)."""
        if not REPORTS_LAG:
            time.sleep(1)
            return

        def owners_now() -> set[str]:
            progress = query.lastProgress
            report = json.loads(progress["sources"][0]["latestOffset"] or "{}") if progress else {}
            return {slot.get("member") for slot in report.get("members", {}).values()}

        wait_until(lambda: owners_now() == owners, 30, f"the owners {sorted(owners)} in progress")

    query = foreach_batches(
        source(spark, nats_url, stream, group), rows, tmp_path / "cp", report_idle=True
    )
    try:
        wait_until(lambda: len(rows) >= 200, 60, "200 rows")
        before = names(client, f"{stream}-{group}")
        run_sync(admin.add_members(client.target, stream, group, ["b"]))
        reloaded({"a", "b"})
        publish(client, stream, 200, start=200)
        wait_until(lambda: len(rows) >= 400, 60, "400 rows")
        run_sync(admin.drop_members(client.target, stream, group, ["a"]))
        reloaded({"b"})
        publish(client, stream, 200, start=400)
        wait_until(lambda: len(rows) >= 600, 60, "600 rows")
        assert names(client, f"{stream}-{group}") == before == [f"partition-{p}" for p in range(4)]
    finally:
        query.stop()
    assert_exactly_once([v for _, v in rows], 600)
    assert {m for m, v in rows if v < 200} == {"a"}
    assert {m for m, v in rows if v >= 400} == {"b"}


def test_elastic_group_losing_all_members_warns_then_reads_again(
    spark, client, nats_url, unique, tmp_path
):
    stream, group = f"EL{unique}", "g"
    elastic_group(client, stream, group, ["a"], partitions=2)
    publish(client, stream, 50)
    rows = MemberRows()

    df = source(spark, nats_url, stream, group)
    query = foreach_batches(df, rows, tmp_path / "cp", report_idle=True)
    try:
        wait_until(lambda: len(rows) >= 50, 60, "50 rows")
        run_sync(admin.drop_members(client.target, stream, group, ["a"]))
        dropped = datetime.now(UTC)
        # A trigger that planned while "a" was still a member may read what is published next,
        # as a Go member reads until it sees the change; publish once a trigger began after it.
        wait_for_triggers(query, 1, dropped, "after the drop")
        publish(client, stream, 50, start=50)
        published = datetime.now(UTC)

        def warned() -> bool:
            reports = [p["sources"][0].get("latestOffset") or "{}" for p in query.recentProgress]
            return any(
                "has no members to read" in json.loads(r).get("warning", "") for r in reports
            )

        if REPORTS_LAG:
            wait_until(warned, 30, "a warning in progress")
        wait_for_triggers(query, 5, published, "without members")
        assert len(rows) == 50, "read while the group had no members"
        run_sync(admin.add_members(client.target, stream, group, ["b"]))
        wait_until(lambda: len(rows) >= 100, 60, "the new member's rows")
        assert query.exception() is None
    finally:
        query.stop()
    assert_exactly_once([v for _, v in rows], 100)
    assert {m for m, v in rows if v >= 50} == {"b"}  # read once b was there, not before


def test_adopted_consumer_with_a_small_max_ack_pending_is_reported(
    spark, client, nats_url, unique, tmp_path
):
    """A consumer created by someone else (a Go member's MaxAckPending=1, say) caps every batch:
    the query reads on, a batch at a time, and says why in progress."""
    stream, group = f"MA{unique}", "g"
    static_group(client, stream, group, ["m1"], partitions=1)
    entry = run_sync(load_group(client.target, stream, group))
    run_sync(
        ensure_group_consumer(client.target, partition_consumer(entry, 0, {"max_ack_pending": 2}))
    )
    publish(client, stream, 6)
    query, error = run_query(source(spark, nats_url, stream, group), tmp_path)
    assert error is None, error
    assert_exactly_once(payloads(spark, str(tmp_path / "out")), 6)
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) == 3 and all(p["numInputRows"] == 2 for p in batches)
    if REPORTS_LAG:
        report = json.loads(batches[0]["sources"][0]["latestOffset"])
        assert "allows 2 unacked messages" in report["members"]["partition-0"]["warning"]


@pytest.mark.parametrize("layout", ["member", "partition"])
def test_adopted_consumer_with_max_deliver_is_refused_before_anything_is_taken(
    spark, client, nats_url, unique, tmp_path, layout
):
    """A Go member's consumer (or a partition consumer someone made) with MaxDeliver: a message
    delivered that many times leaves it for good, and the source's give-backs and dead attempts
    redeliver, so the query refuses it with the setting and its fix, and takes nothing."""
    stream, group = f"MX{unique}", "g"
    static_group(client, stream, group, ["m1"], partitions=1)
    entry = run_sync(load_group(client.target, stream, group))
    limited = {"max_deliver": 2}
    if layout == "member":
        consumer = member_consumer(entry, "m1", limited)
    else:
        consumer = partition_consumer(entry, 0, limited)
    run_sync(ensure_group_consumer(client.target, consumer))
    publish(client, stream, 5)
    _, error = run_query(source(spark, nats_url, stream, group, consumerLayout=layout), tmp_path)
    assert error is not None
    assert f"consumer '{consumer.name}' on stream '{stream}' has max_deliver=2" in str(
        error
    ) and f"nats consumer edit {stream} {consumer.name} --max-deliver=-1" in str(error), error
    state = run_sync(client.api.consumer_info(stream, consumer.name))
    assert state.delivered_seq == 0 and state.num_pending == 5, "a message was taken"


def test_static_member_consumer_created_again_while_stopped_is_refused_at_restart(
    spark, client, nats_url, unique, tmp_path
):
    """A static member consumer deleted and created again (DeliverAll, as a Go member heals
    itself) while no query runs would deliver the member's partitions again from the start: the
    restarted query knows the one it read from its ledger's pointer and stops with one line
    before emitting anything (its ledger, whose entries settled, no longer drops them); deleted
    again and restarted with the startingPosition it names, the query reads on, every message
    once."""
    stream, group, bucket = f"MR{unique}", "g", f"L{unique}"
    static_group(client, stream, group, ["m1"], partitions=2)
    publish(client, stream, 30)
    sink = Collector()
    df = source(spark, nats_url, stream, group, consumerLayout="member", ledgerBucket=bucket)
    query = foreach_batches(df, sink, tmp_path / "cp")

    def entries_settled() -> bool:
        keys = run_sync(client.api.kv_keys(bucket, ">"))
        return not [key for key in keys if not key.startswith("query.")]

    try:
        drained(query, client, stream, group, sink, 30)
        wait_until(entries_settled, 60, "the settled entries removed")
    finally:
        query.stop()
    [consumer] = consumers_of(client, stream, group, "m1")
    config = run_sync(client.api.consumer_info(stream, consumer.name)).config
    run_sync(client.api.delete_consumer(stream, consumer.name))
    run_sync(client.api.create_consumer(stream, consumer.name, config))
    query = foreach_batches(df, sink, tmp_path / "cp")
    try:
        stopped = lambda: query.exception() is not None or len(sink.values) > 30  # noqa: E731
        wait_until(stopped, 60, "the query to stop")
        error = str(query.exception())
    finally:
        query.stop()
    assert_exactly_once(sink.values, 30)
    assert (
        f"consumer '{consumer.name}' on stream '{stream}' was deleted and created again while "
        "the query was stopped"
    ) in error, error
    run_sync(client.api.delete_consumer(stream, consumer.name))
    publish(client, stream, 10, start=30)
    checkpoint = tmp_path / "cp"
    restarted_where_named(
        spark, client, nats_url, stream, group, bucket, error, sink, checkpoint, 40
    )


def restarted_where_named(
    spark: Any,
    client: Any,
    nats_url: str,
    stream: str,
    group: str,
    bucket: str,
    error: str,
    sink: Collector,
    checkpoint: Any,
    total: int,
) -> None:
    """The member-layout query on `checkpoint` restarted with the startingPosition its
    `error` names (right after the last ack the query saw; what it saw acked later is in its
    ledger) reads on: `total` rows, every message once."""
    start = re.search(r"restart the query with startingPosition=(sequence:\d+)", error)
    assert start is not None, error
    df = source(
        spark,
        nats_url,
        stream,
        group,
        consumerLayout="member",
        ledgerBucket=bucket,
        startingPosition=start.group(1),
    )
    query = foreach_batches(df, sink, checkpoint)
    try:
        drained(query, client, stream, group, sink, total)
    finally:
        query.stop()
    assert_exactly_once(sink.values, total)


def test_static_member_consumer_deleted_while_running_stops_and_resumes_exactly(
    spark, client, nats_url, unique, tmp_path
):
    """In the member layout a deleted static member consumer is not recreated from the start (it
    would read its partitions again): the query stops with one line naming where to start, and a
    restart with that startingPosition reads on, every message once."""
    stream, group = f"MD{unique}", "g"
    static_group(client, stream, group, ["m1"], partitions=2)
    publish(client, stream, 50)
    sink = Collector()
    df = source(spark, nats_url, stream, group, consumerLayout="member", ledgerBucket=f"L{unique}")
    query = foreach_batches(df, sink, tmp_path / "cp")
    try:
        drained(query, client, stream, group, sink, 50)
        [consumer] = consumers_of(client, stream, group, "m1")
        run_sync(client.api.delete_consumer(consumer.stream, consumer.name))
        publish(client, stream, 10, start=50)
        wait_until(lambda: query.exception() is not None, 30, "the query to stop")
        error = str(query.exception())
    finally:
        query.stop()
    assert (
        f"member consumer '{consumer.name}' of static group '{group}' on stream '{stream}' was "
        "deleted while the query ran; a new one would read the member's partitions again"
    ) in error, error
    assert_exactly_once(sink.values, 50)
    publish(client, stream, 10, start=60)
    bucket, checkpoint = f"L{unique}", tmp_path / "cp"
    restarted_where_named(
        spark, client, nats_url, stream, group, bucket, error, sink, checkpoint, 70
    )
