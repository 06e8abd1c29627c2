"""Pins: the query stands by while another instance holds a member's pin, then takes over."""

from __future__ import annotations

import json

import pytest
from spark_helpers import (
    REPORTS_LAG,
    OtherInstance,
    assert_exactly_once,
    foreach_batches,
    publish,
    source,
    static_group,
    wait_until,
)

from nats_spark.loop import run_sync
from nats_spark.pcg.consumers import (
    ensure_group_consumer,
    member_consumer,
    partition_consumer,
)
from nats_spark.pcg.store import load_group

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("layout", ["member", "partition"])
def test_query_stands_by_while_another_instance_is_pinned(
    spark, client, settings, nats_url, unique, tmp_path, layout
):
    """Member layout: another instance of m1 (a Go member) is pinned, so `auto` reads the
    member layout and stands by. Partition layout: another query's reader of the one partition
    is pinned."""
    stream = f"P{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2 if layout == "member" else 1)
    entry = run_sync(load_group(client.target, stream, "g"))
    template = {"ack_wait": 2_000_000_000}
    if layout == "member":
        consumer, slot = member_consumer(entry, "m1", template), "m1"
    else:
        consumer, slot = partition_consumer(entry, 0, template), "partition-0"
    run_sync(ensure_group_consumer(client.target, consumer))
    other = OtherInstance(settings, stream, consumer.name)
    other.thread.start()
    publish(client, stream, 100)
    wait_until(lambda: len(other.received) >= 100, 30, "the other instance to be served")

    seen: list[int] = []
    progress: list[dict] = []

    def collect(batch, batch_id):
        seen.extend(int(r.data.decode()) for r in batch.select("data").collect())

    df = source(spark, nats_url, stream, "g", ackWait="2s")
    query = foreach_batches(df, collect, tmp_path / "cp", "300 milliseconds")
    try:
        publish(client, stream, 100, start=100)

        def standing_by() -> bool:
            for p in query.recentProgress:
                report = json.loads(p["sources"][0].get("latestOffset") or "{}")
                progress.append(report)
                if report.get("members", {}).get(slot, {}).get("status") == "standby":
                    return True
            return False

        if REPORTS_LAG:
            wait_until(standing_by, 30, "the query to report standby")
        else:
            wait_until(lambda: len(query.recentProgress) >= 3, 30, "batches while standing by")
        wait_until(lambda: len(other.received) >= 200, 30, "the pinned instance to keep reading")
        assert seen == [], "the query read while another instance held the pin"
        other.stop()  # its pin times out after priority_timeout (2 s)
        publish(client, stream, 100, start=200)
        wait_until(lambda: len(seen) >= 100, 60, "the query to take over")
        assert query.exception() is None
    finally:
        query.stop()
        if other.running:
            other.stop()
    assert_exactly_once(other.received + seen, 300)
