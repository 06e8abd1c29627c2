"""The nats-pcg source over one plain priority-group consumer (overflow, prioritized, pinned_client,
none), with a real Spark session and server, next to nats-py pullers on the same consumer."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql.functions import spark_partition_id
from spark_helpers import (
    assert_exactly_once,
    consumer_info,
    foreach_batches,
    in_background,
    make_consumer,
    make_stream,
    needs_server,
    publish,
    puller,
    source,
    wait_for_triggers,
    wait_until,
)

from nats_spark.client import NatsClient
from nats_spark.jetstream.acks import publish_acks
from nats_spark.jetstream.api import to_nanos
from nats_spark.jetstream.pull import PullConsumer, PullStatus
from nats_spark.loop import Blocking, run_sync
from nats_spark.spark.group_source.driver.consumer_checks import first_own_unread
from nats_spark.spark.group_source.ledger import Ledger, pointer_key, read_head, read_pointer
from nats_spark.spark.group_source.options import SourceOptions
from nats_spark.spark.group_source.slot_partition import UNBOUNDED

pytestmark = pytest.mark.spark

GROUP = "g"


class Sink:
    """foreachBatch target: payload numbers and Spark partition ids of every row, and the input
    partition count of every batch."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int]] = []
        self.partitions: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        rows = batch.select("data", spark_partition_id().alias("pid")).collect()
        with self.lock:
            self.partitions.append(batch.rdd.getNumPartitions())
            self.rows.extend((int(r.data.decode()), r.pid) for r in rows)

    @property
    def values(self) -> list[int]:
        with self.lock:
            return [v for v, _ in self.rows]


def drain(client: Blocking[NatsClient], pull: Blocking[PullConsumer]) -> list[int]:
    """Everything the threshold-less puller can get now, acked; returns the payloads."""
    taken: list[int] = []
    while True:
        result = pull.fetch(500, expires=0.5)
        run_sync(publish_acks(client.nc, [m.reply.encode() for m in result.messages]))
        taken += [int(m.data.decode()) for m in result.messages]
        if not result.messages:
            return taken


def acked(client: Blocking[NatsClient], stream: str, name: str) -> bool:
    state = consumer_info(client, stream, name)
    return state["num_ack_pending"] == 0 and state["num_pending"] == 0


def test_overflow_waits_for_min_pending_and_yields_to_plain_pullers(
    spark, client, nats_url, unique, tmp_path
):
    stream, name = f"O{unique}", "ovf"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "overflow", group=GROUP, ack_wait=to_nanos(20))
    config = consumer_info(client, stream, name)["config"]
    publish(client, stream, 500)
    sink = Sink()
    df = source(spark, nats_url, stream, consumer=name, minPending=1000, fetchTimeout="500ms")
    started = datetime.now(UTC)
    query = foreach_batches(df, sink, str(tmp_path / "cp"), report_idle=True)
    plain = puller(client, stream, name, GROUP)
    try:
        wait_for_triggers(query, 5, started, "with 500 pending, below minPending 1000")
        assert sink.values == [], "the query pulled below its minPending threshold"

        # A puller without threshold is served at once, while the query's pulls wait.
        first = plain.fetch(100, expires=3.0)
        assert first.status is PullStatus.BATCH_COMPLETE and len(first.messages) == 100
        run_sync(publish_acks(client.nc, [m.reply.encode() for m in first.messages]))
        first_taken = [int(m.data.decode()) for m in first.messages]
        assert sink.values == []

        # 1400 pending now: the query takes the overflow, down to its threshold.
        publish(client, stream, 1000, start=500)
        wait_until(
            lambda: consumer_info(client, stream, name)["num_pending"] < 1000, 60, "overflow read"
        )
        assert consumer_info(client, stream, name)["num_pending"] == 999
        wait_until(lambda: len(sink.values) >= 401, 30, "the overflow in the sink")
        assert len(sink.values) == 401  # 1400 - 999: served while pending >= minPending
        rest = drain(client, plain)
        wait_until(lambda: acked(client, stream, name), 30, "the query's rows acked")
        assert query.exception() is None
    finally:
        query.stop()
    taken = first_taken + rest
    assert not set(taken) & set(sink.values), "a message reached both the query and the puller"
    assert_exactly_once(sink.values + taken, 1500)
    assert consumer_info(client, stream, name)["config"] == config, (
        "the source changed the consumer"
    )


@pytest.mark.parametrize(("query_priority", "rival_priority"), [(0, 5), (9, 0)])
def test_prioritized_lower_number_served_first(
    spark, client, nats_url, unique, tmp_path, query_priority, rival_priority
):
    needs_server(client, (2, 12, 0), "the prioritized policy")
    stream, name = f"P{unique}", "pri"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "prioritized", group=GROUP, ack_wait=to_nanos(30))
    publish(client, stream, 50)
    # A holder takes all 50 unacked: the query plans a batch for their redelivery and waits in a
    # long pull; the NAKs below release all of them while both competitors are waiting.
    held = puller(client, stream, name, GROUP).fetch(50, expires=1.0)
    assert len(held.messages) == 50
    sink = Sink()
    df = source(spark, nats_url, stream, consumer=name, priority=query_priority, fetchTimeout="5s")
    query = foreach_batches(df, sink, str(tmp_path / "cp"))
    try:
        # Catch the start of one of the query's long pulls, so it is far from expiring.
        wait_until(
            lambda: consumer_info(client, stream, name)["num_waiting"] == 0, 60, "no pull waiting"
        )
        wait_until(
            lambda: consumer_info(client, stream, name)["num_waiting"] == 1, 60, "the query's pull"
        )
        rival = in_background(
            puller(client, stream, name, GROUP), 50, expires=3.0, priority=rival_priority
        )
        wait_until(
            lambda: consumer_info(client, stream, name)["num_waiting"] == 2, 5, "the rival's pull"
        )
        for msg in held.messages:
            run_sync(msg.nak())
        got = rival.result(10)
        if query_priority < rival_priority:
            assert (got.status, got.messages) == (PullStatus.TIMEOUT, [])
            wait_until(lambda: len(sink.values) >= 50, 30, "50 rows in the query")
        else:
            assert got.status is PullStatus.BATCH_COMPLETE and len(got.messages) == 50
            run_sync(publish_acks(client.nc, [m.reply.encode() for m in got.messages]))
        wait_until(lambda: acked(client, stream, name), 30, "everything acked")
        assert query.exception() is None
    finally:
        query.stop()
    if query_priority < rival_priority:
        assert_exactly_once(sink.values, 50)
    else:
        assert sink.values == []


class Standby:
    """A nats-py client of the same consumer pulling in a loop (as a context), without a pin id
    until it is pinned, then with its id, which keeps the pin; acks what it gets at once."""

    def __init__(self, client: Blocking[NatsClient], stream: str, consumer: str) -> None:
        self.client = client
        self.pull = puller(client, stream, consumer, GROUP)
        self.got: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            messages = self.pull.fetch(10, expires=0.5).messages
            run_sync(publish_acks(self.client.nc, [m.reply.encode() for m in messages]))
            self.got += [int(m.data.decode()) for m in messages]

    def halt(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(5)

    def __enter__(self) -> Standby:
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt()


def pinned(client: Blocking[NatsClient], stream: str, name: str) -> str | None:
    return consumer_info(client, stream, name)["priority_groups"][0].get("pinned_client_id")


def test_pinned_client_one_receiver_at_a_time_and_handover(
    spark, client, nats_url, unique, tmp_path
):
    stream, name = f"N{unique}", "pin"
    make_stream(client, stream, storage="memory")
    make_consumer(
        client,
        stream,
        name,
        "pinned_client",
        group=GROUP,
        priority_timeout=to_nanos(3),
        ack_wait=to_nanos(20),
    )
    publish(client, stream, 30)
    sink = Sink()
    df = source(
        spark, nats_url, stream, consumer=name, maxMessagesPerTrigger=10, fetchTimeout="500ms"
    )
    checkpoint = str(tmp_path / "cp")
    with Standby(client, stream, name) as standby:
        query = foreach_batches(df, sink, checkpoint)
        try:
            wait_until(lambda: sink.values, 60, "the query's first rows")
            query_pin = pinned(client, stream, name)
            assert query_pin
            standby.thread.start()  # pulls without id all the while the query reads
            wait_until(lambda: len(sink.values) >= 30, 60, "30 rows in the query")
            assert standby.got == [], "the standby received messages while the query was pinned"
            wait_until(lambda: acked(client, stream, name), 30, "the query's rows acked")
            assert query.exception() is None
        finally:
            query.stop()

        # The query no longer pulls: its pin times out and the waiting standby is pinned.
        publish(client, stream, 20, start=30)
        wait_until(lambda: len(standby.got) >= 20, 15, "the standby to take over")
        standby_pin = pinned(client, stream, name)
        assert standby_pin and standby_pin != query_pin and standby.pull.pin_id == standby_pin

        # Restarted while the standby holds the pin, the query stands by ...
        query = foreach_batches(df, sink, checkpoint)
        try:
            publish(client, stream, 20, start=50)
            wait_until(lambda: len(standby.got) >= 40, 15, "the standby to read on")
            assert len(sink.values) == 30, "the query read while the standby held the pin"
            # ... and takes over once the standby is gone and the server drops its pin.
            standby.halt()
            publish(client, stream, 20, start=70)
            wait_until(lambda: len(sink.values) >= 50, 30, "the query to take over")
            assert pinned(client, stream, name) not in (None, standby_pin)
            wait_until(lambda: acked(client, stream, name), 30, "the query's rows acked")
            assert query.exception() is None
        finally:
            query.stop()
    assert sorted(standby.got) == list(range(30, 70))
    assert_exactly_once([v for v in sink.values if v < 30] + standby.got, 70)
    assert sorted(v for v in sink.values if v >= 30) == list(range(70, 90))


@pytest.mark.parametrize("policy", ["overflow", None])
def test_num_partitions_pull_in_parallel_exactly_once(
    spark, client, nats_url, unique, tmp_path, policy
):
    stream, name = f"M{unique}", "many"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, policy, group=GROUP, ack_wait=to_nanos(20))
    publish(client, stream, 300)
    sink = Sink()
    query = foreach_batches(
        source(spark, nats_url, stream, consumer=name, numPartitions=3), sink, str(tmp_path / "cp")
    )
    try:
        wait_until(lambda: len(sink.values) >= 300, 60, "300 rows")
        wait_until(lambda: acked(client, stream, name), 30, "everything acked")
        assert query.exception() is None
    finally:
        query.stop()
    assert_exactly_once(sink.values, 300)
    assert sink.partitions[0] == 3
    assert Counter(pid for _, pid in sink.rows) == {0: 100, 1: 100, 2: 100}


# (policy, extra consumer config, source options, error text); policy "missing" makes no consumer.
QUERY_ERRORS = [
    ("missing", {}, {}, "does not exist on stream"),
    (None, {"deliver_subject": "push.here"}, {}, "is a push consumer"),
    ("pinned_client", {}, {"numPartitions": 2}, "numPartitions must be 1"),
    ("pinned_client", {}, {"minPending": 10}, "minPending/minAckPending need an overflow"),
    ("overflow", {}, {"priority": 1}, "priority needs a prioritized consumer"),
    ("overflow", {}, {"priorityGroup": "other"}, "priority group 'other' is not one of"),
    (None, {}, {"priorityGroup": GROUP}, "has no priority groups"),
    ("overflow", {"priority_groups": ["a", "b"]}, {}, "set the priorityGroup option"),
    ("overflow", {"ack_policy": "all"}, {}, "needs explicit acks"),
    ("overflow", {"ack_policy": "none"}, {}, "needs explicit acks"),
    ("overflow", {"max_deliver": 2}, {}, "has max_deliver=2: .* --max-deliver=-1"),
    ("pinned_client", {"headers_only": True}, {}, "has headers_only: .* --no-headers-only"),
]


@pytest.mark.parametrize(("policy", "extra", "options", "error"), QUERY_ERRORS)
def test_misfit_consumer_fails_the_query_before_taking_anything(
    spark, client, nats_url, unique, tmp_path, policy, extra, options, error
):
    stream, name = f"X{unique}", "bad"
    make_stream(client, stream, storage="memory")
    if policy != "missing":
        make_consumer(client, stream, name, policy, group=GROUP, **extra)
    publish(client, stream, 5)
    with pytest.raises(Exception, match=error):  # at load(), where the driver checks it
        source(spark, nats_url, stream, consumer=name, **options)
    if policy != "missing":
        state = consumer_info(client, stream, name)
        assert state["delivered"]["stream_seq"] == 0 and state["num_pending"] == 5


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"consumer": "c", "priority": 10}, "option priority=10 is out of range"),
        ({"consumer": "c", "numPartitions": 0}, "option numPartitions=0 is out of range"),
        ({"consumer": "c", "minPending": "many"}, "option minPending='many' is not a whole"),
        ({"consumer": "c", "group": "g"}, "set exactly one of the options group"),
        ({"group": "g", "minPending": 5}, "option minPending does not apply"),
    ],
)
def test_bad_consumer_options_fail_at_load(spark, nats_url, options, error):
    reader = spark.readStream.format("nats-pcg").option("servers", nats_url).option("stream", "S")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    with pytest.raises(Exception, match=error):
        reader.load()


def test_num_partitions_readers_hold_what_they_took(spark, client, nats_url, unique, tmp_path):
    """Readers sharing one consumer, in batches longer than its ack wait: what they took does not
    come back (to them, to each other or to another client) before its batch commits, and every
    message is emitted once."""
    stream, name = f"D{unique}", "redo"
    make_stream(client, stream, storage="memory")
    # 2 s: the keeper restarts a wait when a third of it is left, and on a CI machine running
    # two Spark sessions on two cores a look came more than 1 s late under a 1 s ack wait.
    ack_wait = 2.0
    make_consumer(client, stream, name, None, group=GROUP, ack_wait=to_nanos(ack_wait))
    messages = 2000
    publish(client, stream, messages)
    redelivered: list[int] = []
    other = puller(client, stream, name, None)
    waited: list[int] = []  # the batch that waited past the ack wait in its sink
    got: list[int] = []  # what `other` pulled meanwhile

    class Probe(Sink):
        def __call__(self, batch: Any, batch_id: int) -> None:
            super().__call__(batch, batch_id)
            if not waited and consumer_info(client, stream, name)["num_pending"] == 0:
                # Everything is delivered, so a pull gets only what came back: wait out the ack
                # wait in this batch's sink (the machine's speed decides how long reading takes),
                # then pull as another client would.
                time.sleep(ack_wait * 1.5)
                waited.append(batch_id)
                got.extend(int(m.data.decode()) for m in other.fetch(10, expires=0.5).messages)
            redelivered.append(consumer_info(client, stream, name)["num_redelivered"])

    sink = Probe()
    # Pulls of 1, each recorded in the ledger, so both readers pull while the other holds.
    df = source(spark, nats_url, stream, consumer=name, numPartitions=2, fetchBatchSize=1)
    query = foreach_batches(df, sink, str(tmp_path / "cp"))
    try:
        wait_until(lambda: len(set(sink.values)) >= messages, 120, f"{messages} distinct rows")
        wait_until(lambda: acked(client, stream, name), 60, "everything acked")
        assert query.exception() is None
    finally:
        query.stop()
    assert waited, "no batch took the last messages"
    assert got == [], f"another client got {got} before their batch committed"
    assert max(redelivered) == 0, f"{max(redelivered)} messages came back before their commit"
    assert_exactly_once(sink.values, messages)


def edit_while_running(
    spark: Any, client: Any, nats_url: str, unique: str, tmp_path: Any, edit: Any
) -> tuple[str, list[int]]:
    """A query over a plain consumer reads 30 messages; `edit(stream, name)` changes the consumer
    between triggers and 10 more are published: the query's error and what it emitted."""
    stream, name = f"E{unique}", "c"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "pinned_client", group=GROUP)
    publish(client, stream, 30)
    sink = Sink()
    df = source(spark, nats_url, stream, consumer=name)
    query = foreach_batches(df, sink, tmp_path / "cp", report_idle=True)
    try:
        wait_until(lambda: len(sink.values) >= 30 or query.exception(), 60, "30 rows")
        wait_until(lambda: acked(client, stream, name), 30, "the batch acked")
        wait_for_triggers(query, 2, datetime.now(UTC), "to see the acks")
        edit(stream, name)
        publish(client, stream, 10, start=30)
        wait_until(lambda: query.exception() is not None, 30, "the query to stop")
        return str(query.exception()), sink.values
    finally:
        query.stop()


def test_the_first_unread_message_of_a_partition_is_asked_of_the_server(client, unique):
    """`first_own_unread` against nats-server (`STREAM.MSG.GET` with `next_by_subj`): of the
    sequences a partition's consumer created again skips that the query did not commit, the
    first its filter matches; other partitions' are passed over (5 of partition 0, past 1, 2
    and 4 of partition 1, and 3 of partition 0, committed); none of it: `UNBOUNDED`."""
    stream = make_stream(client, f"F{unique}", [f"F{unique}.>"])
    for partition in (1, 1, 0, 1, 0):
        run_sync(client.target.js.publish(f"{stream}.p{partition}.k", b""))
    own = [f"{stream}.p0.>"]
    assert run_sync(first_own_unread(client.api, stream, own, [1, 2, 4, 5])) == 5
    assert run_sync(first_own_unread(client.api, stream, own, [1, 2, 4])) == UNBOUNDED
    both = [f"{stream}.p2.>", f"{stream}.p0.>"]
    assert run_sync(first_own_unread(client.api, stream, both, [3])) == 3


def test_max_deliver_set_while_running_stops_the_next_batch(
    spark, client, nats_url, unique, tmp_path
):
    def set_max_deliver(stream: str, name: str) -> None:
        config = consumer_info(client, stream, name)["config"]
        run_sync(client.api.create_consumer(stream, name, {**config, "max_deliver": 2}, "update"))

    error, values = edit_while_running(spark, client, nats_url, unique, tmp_path, set_max_deliver)
    assert "consumer 'c' on stream" in error and "has max_deliver=2" in error, error
    assert_exactly_once(values, 30)


def test_consumer_created_again_between_triggers_is_not_read_again(
    spark, client, nats_url, unique, tmp_path
):
    """Someone deletes the consumer and creates it again from the start (DeliverAll) between two
    triggers: the query stops with where to start it instead of emitting the 30 again. Created
    again there (`--deliver 31`), the query restarted on its checkpoint reads the 10 published
    since, once; created again before it, the restart is refused with the same fix. Before, the
    pointer kept the floor of the last batch planned (0: the acks came at idle triggers), and
    any consumer created again was refused, advising --deliver 1."""

    def recreate(stream: str, name: str, **start: Any) -> None:
        run_sync(client.api.delete_consumer(stream, name))
        make_consumer(client, stream, name, "pinned_client", group=GROUP, **start)

    error, values = edit_while_running(spark, client, nats_url, unique, tmp_path, recreate)
    # Seen gone (planning between the two calls) or seen anew: either way it says where to start.
    assert "consumer 'c' on stream" in error, error
    assert "was deleted" in error and "--deliver 31" in error, error
    assert_exactly_once(values, 30)

    stream, name = f"E{unique}", "c"
    recreate(stream, name, deliver_policy="by_start_sequence", opt_start_seq=30)
    sink = Sink()
    query = foreach_batches(source(spark, nats_url, stream, consumer=name), sink, tmp_path / "cp")
    try:
        wait_until(lambda: query.exception() is not None, 60, "the query to stop")
    finally:
        query.stop()
    [line] = [line for line in str(query.exception()).splitlines() if "created again" in line]
    assert "created again while the query was stopped" in line, line
    assert "delivers again what the query already committed" in line, line
    assert "nats consumer add " + stream + " c --deliver 31 " in line, line
    assert sink.values == []

    recreate(stream, name, deliver_policy="by_start_sequence", opt_start_seq=31)
    query = foreach_batches(source(spark, nats_url, stream, consumer=name), sink, tmp_path / "cp")
    try:
        wait_until(lambda: len(sink.values) >= 10 or query.exception(), 60, "10 rows")
        wait_until(lambda: acked(client, stream, name), 30, "the batch acked")
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted(sink.values) == list(range(30, 40)), sink.values
    assert consumer_info(client, stream, name)["ack_floor"]["stream_seq"] == 40


def settled(client: Blocking[NatsClient], stream: str, name: str) -> bool:
    """The ledger keeps no message of the query's committed batches: nothing dedupes their
    redeliveries any more (the driver removes an entry once the ack floor held past it)."""
    kv = run_sync(Ledger.bucket(client.target, SourceOptions.ledger_bucket, create=False))
    pointer = run_sync(read_pointer(kv, pointer_key(stream, name)))
    if pointer is None:
        return False
    ledger = Ledger(kv, pointer.lineage)
    heads = [run_sync(read_head(ledger, gen, slot)) for gen, slot in run_sync(ledger.heads())]
    return all(found is None or found[0].count == 0 for found in heads)


def test_consumer_created_again_while_a_batch_reads_it_is_not_read_again(
    spark, client, nats_url, unique, tmp_path
):
    """Someone deletes the consumer and creates it again from the start (DeliverAll) after a
    batch was planned and before its task pulls (the foreachBatch function does it before it
    reads the batch): the task stops at the first message the new consumer delivers again, so
    the batch emits none of the 30 committed and settled before, acks nothing, and the query
    stops with where to start. Before, the batch emitted them again, and only the next planning
    stopped the query."""
    stream, name = f"F{unique}", "c"
    make_stream(client, stream, storage="memory")
    make_consumer(client, stream, name, "pinned_client", group=GROUP)
    publish(client, stream, 30)
    armed, recreated = threading.Event(), threading.Event()

    class RecreatingSink(Sink):
        def __call__(self, batch: Any, batch_id: int) -> None:
            if armed.is_set() and not recreated.is_set():  # planned, not read yet
                run_sync(client.api.delete_consumer(stream, name))
                make_consumer(client, stream, name, "pinned_client", group=GROUP)
                recreated.set()
            super().__call__(batch, batch_id)

    sink = RecreatingSink()
    query = foreach_batches(source(spark, nats_url, stream, consumer=name), sink, tmp_path / "cp")
    try:
        wait_until(lambda: len(sink.values) >= 30 or query.exception(), 60, "30 rows")
        wait_until(lambda: settled(client, stream, name), 60, "the 30 settled")
        armed.set()
        publish(client, stream, 10, start=30)
        wait_until(lambda: query.exception() is not None, 60, "the query to stop")
        error = str(query.exception())
    finally:
        query.stop()
    assert recreated.is_set()
    assert_exactly_once(sink.values, 30)
    assert "was deleted and created again while a batch read it" in error, error
    assert "--deliver 31" in error, error
    assert consumer_info(client, stream, name)["ack_floor"]["stream_seq"] == 0  # nothing acked
