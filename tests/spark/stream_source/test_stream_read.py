"""Reads of a whole stream with format `nats`: batch ranges and streaming by stream sequence,
through batch direct get and through an ephemeral consumer, with nothing acked or left behind."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import functions as F
from spark_helpers import SPARK_VERSION, check_trigger_pacing

from chaos.proxy import free_port
from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.jetstream.pull import header_values
from nats_spark.loop import Blocking, run_sync
from nats_spark.spark.failure_lines import SparkFailed, one_line_failures
from nats_spark.spark.shared.schema import SCHEMA_DDL

pytestmark = pytest.mark.spark

COUNT = 120
READ_PATH: dict[str, str] = {}  # stream: the readPath its reads use (see the `stream` fixture)


def create(client: Blocking[NatsClient], name: str, direct: bool) -> str:
    run_sync(
        client.api.create_stream({"name": name, "subjects": [f"{name}.>"], "allow_direct": direct})
    )
    return name


def publish_mixed(client: Blocking[NatsClient], stream: str, count: int, start: int = 0) -> None:
    """Like spark_helpers.publish, on three keys `<stream>.k<i % 3>`; odd messages carry
    headers (one repeated), even ones none."""

    async def send() -> None:
        for i in range(start, start + count):
            headers = {"n": str(i), "kind": "odd"} if i % 2 else None
            await client.target.js.publish(f"{stream}.k{i % 3}", str(i).encode(), headers=headers)

    run_sync(send())


def stored(client: Blocking[NatsClient], stream: str) -> dict[int, Any]:
    """Every message the stream holds, by sequence (deleted ones left out)."""
    state = run_sync(client.api.stream_info(stream))["state"]
    found = {}
    for seq in range(state["first_seq"], state["last_seq"] + 1):
        try:
            found[seq] = run_sync(client.api.get_message(stream, seq))
        except Exception:
            continue
    return found


def read(spark: Any, url: str, stream: str, **options: Any) -> list[Any]:
    reader = spark.read.format("nats").option("servers", url).option("stream", stream)
    for key, value in {"readPath": READ_PATH.get(stream, "auto"), **options}.items():
        reader = reader.option(key, str(value))
    return sorted(reader.load().collect(), key=lambda row: row.stream_seq)


def seqs(rows: list[Any]) -> list[int]:
    return [row.stream_seq for row in rows]


def micros(stamp: str) -> dt.datetime:
    """A stored message's RFC 3339 time (nanoseconds) truncated to microseconds, as Spark has."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(f"{head}.{(fraction + '000000')[:6]}")


@pytest.fixture(scope="module")
def admin(settings: ConnectionSettings) -> Iterator[Blocking[NatsClient]]:
    blocking = open_blocking(settings)
    yield blocking
    run_sync(blocking.target.close())


@pytest.fixture(scope="module", params=["direct", "consumer"])
def stream(request: pytest.FixtureRequest, admin: Blocking[NatsClient]) -> str:
    """A stream of COUNT messages, read by batch direct get (allow_direct) or by the default
    ephemeral consumer (a stream without allow_direct); message 40 is deleted."""
    direct = request.param == "direct"
    name = create(admin, f"R{request.param[0]}{uuid.uuid4().hex[:8]}", direct)
    READ_PATH[name] = request.param
    publish_mixed(admin, name, COUNT)
    run_sync(admin.api.request(f"STREAM.MSG.DELETE.{name}", {"seq": 40}))
    return name


@pytest.mark.parametrize("partitions", [1, 4])
def test_full_read_is_what_the_stream_holds(spark, nats_url, admin, stream, partitions):
    rows = read(spark, nats_url, stream, numPartitions=partitions)
    expected = stored(admin, stream)
    assert len(expected) == COUNT - 1 and 40 not in expected
    assert seqs(rows) == sorted(expected)
    for row in rows:
        message = expected[row.stream_seq]
        assert row.subject == message.subject and row.data == message.data
        assert sorted(row.headers.items()) == sorted(
            (key, list(values)) for key, values in header_values(message.headers)
        )
        assert row.timestamp == micros(message.time)
        assert (row.stream, row.partition, row.member, row.delivered) == (stream, None, None, 1)
    assert rows[1].headers == {"n": ["1"], "kind": ["odd"]} and rows[0].headers == {}


def test_sequence_positions_are_inclusive(spark, nats_url, stream):
    rows = read(
        spark, nats_url, stream, startingPosition="sequence:30", endingPosition="sequence:50"
    )
    assert seqs(rows) == [s for s in range(30, 51) if s != 40]
    assert [int(r.data) for r in rows] == [s - 1 for s in range(30, 51) if s != 40]
    rows = read(
        spark,
        nats_url,
        stream,
        startingPosition="sequence:7",
        endingPosition="sequence:7",
        numPartitions=3,
    )
    assert seqs(rows) == [7]


def test_time_positions_are_inclusive(spark, nats_url, admin, stream):
    messages = stored(admin, stream)
    start, end = messages[20].time, messages[90].time
    rows = read(
        spark, nats_url, stream, startingPosition=f"time:{start}", endingPosition=f"time:{end}"
    )
    # Messages stored within one microsecond share a time at this precision: compare by time.
    first, last = micros(start), micros(end)
    wanted = [s for s, m in sorted(messages.items()) if first <= micros(m.time) <= last]
    assert seqs(rows) == wanted and wanted[0] <= 20 and wanted[-1] >= 90


def test_subject_filters(spark, nats_url, stream):
    rows = read(spark, nats_url, stream, subjects=f"{stream}.k1", numPartitions=2)
    assert {r.subject for r in rows} == {f"{stream}.k1"}
    assert seqs(rows) == [s for s in range(1, COUNT + 1) if (s - 1) % 3 == 1 and s != 40]
    # A direct get takes one filter subject: more go through a consumer (readPath=auto).
    both = f"{stream}.k0,{stream}.k2"
    rows = read(
        spark, nats_url, stream, subjects=both, endingPosition="sequence:12", readPath="auto"
    )
    assert seqs(rows) == [1, 3, 4, 6, 7, 9, 10, 12]


def test_empty_ranges(spark, nats_url, stream):
    assert read(spark, nats_url, stream, startingPosition="latest") == []
    assert read(spark, nats_url, stream, startingPosition=f"sequence:{COUNT + 50}") == []
    assert (
        read(spark, nats_url, stream, startingPosition="sequence:40", endingPosition="sequence:40")
        == []
    )
    assert read(spark, nats_url, stream, subjects=f"{stream}.nothing") == []


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "consumer"])
def test_reads_leave_no_consumer_and_ack_nothing(spark, nats_url, admin, unique, direct):
    name = create(admin, f"N{unique}{int(direct)}", direct)
    publish_mixed(admin, name, 30)
    durable = {"durable_name": "watch", "ack_policy": "explicit", "deliver_policy": "all"}
    run_sync(admin.api.create_consumer(name, "watch", durable))
    before = run_sync(admin.api.consumer_info(name, "watch"))
    assert len(read(spark, nats_url, name, numPartitions=3)) == 30
    assert len(read(spark, nats_url, name, subjects=f"{name}.k1,{name}.k2")) == 20
    assert run_sync(admin.api.consumer_names(name)) == ["watch"]
    after = run_sync(admin.api.consumer_info(name, "watch"))
    for key in ("num_pending", "num_ack_pending", "ack_floor", "delivered"):
        assert after[key] == before[key], key
    if not direct:  # the path that makes consumers: none reached the server's list either
        assert run_sync(admin.api.stream_info(name))["state"]["consumer_count"] == 1


def test_read_paths_on_request(spark, nats_url, admin, unique):
    name = create(admin, f"P{unique}", False)
    publish_mixed(admin, name, 10)
    assert len(read(spark, nats_url, name, readPath="consumer")) == 10
    with pytest.raises(Exception, match="readPath=direct cannot read stream .*: allow_direct is"):
        read(spark, nats_url, name, readPath="direct")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "NoSuchStream"}, "stream 'NoSuchStream' does not exist on "),
        ({"stream": "S", "startingPosition": "sequence:0"}, "startingPosition='sequence:0' is"),
        ({"stream": "S", "endingPosition": "time:noon"}, "endingPosition='time:noon' is not valid"),
        (
            {"stream": "S", "startingPosition": "sequence:9", "endingPosition": "sequence:3"},
            "endingPosition='sequence:3' is before startingPosition='sequence:9'",
        ),
        ({"stream": "S", "consumer": "c"}, "unknown option 'consumer'"),
    ],
)
def test_bad_options_fail_with_one_line(spark, nats_url, options, message):
    reader = spark.read.format("nats").option("servers", nats_url)
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception) as error:  # noqa: B017 - Spark wraps it in its own types
        reader.load().collect()
    lines = [line for line in str(error.value).splitlines() if message in line]
    assert lines, f"{message!r} not in {str(error.value)[:500]}"


@pytest.mark.parametrize("streaming", [False, True], ids=["read", "readStream"])
def test_a_wrong_server_stream_or_option_fails_at_load(spark, nats_url, unique, streaming):
    """load() checks the options, connects and looks the stream up (as format nats-pcg does):
    a mistake fails there in at most two lines (Spark's SQLSTATE on the second), the first
    ending in the connector's line naming the fix, before an action or a query."""
    port = free_port()  # nobody listens on it
    cases = [
        ({"stream": f"NO{unique}"}, f"stream 'NO{unique}' does not exist on {nats_url}"),
        ({"servers": f"nats://127.0.0.1:{port}", "stream": "S"}, "no server answered"),
        ({"stream": "S", "startingPosition": "soon"}, "option startingPosition='soon' is not"),
    ]
    for options, message in cases:
        reader = (spark.readStream if streaming else spark.read).format("nats")
        for key, value in {"servers": nats_url, **options}.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception) as caught:  # noqa: B017 - Spark wraps it in its own types
            reader.load()
        text = str(caught.value)
        lines = text.splitlines()
        assert len(lines) <= 2 and "nats_spark." in lines[0] and message in lines[0], text


def test_a_query_failure_is_the_connectors_line_first(spark, nats_url, admin, unique, tmp_path):
    """What only the running query meets (here its stream, deleted after load()) fails it with
    Spark's prefixes before the connector's line; `one_line_failures` raises that line alone,
    from awaitTermination() and from query.exception() alike."""
    name = create(admin, f"GONE{unique}", False)
    df = spark.readStream.format("nats").option("servers", nats_url).option("stream", name).load()
    run_sync(admin.api.delete_stream(name))
    cp = str(tmp_path / "cp")
    query = df.writeStream.format("noop").option("checkpointLocation", cp).start()
    line = f"stream {name!r} does not exist on {nats_url}; create it or fix the stream option"
    with pytest.raises(SparkFailed) as awaited, one_line_failures(spark):
        query.awaitTermination(120)
    assert str(awaited.value) == line
    spark_says = str(awaited.value.spark_error)
    assert "STREAM_FAILED" in spark_says and not spark_says.startswith(line), spark_says
    with pytest.raises(SparkFailed) as returned, one_line_failures(spark):
        raise query.exception()
    assert str(returned.value) == line


def run_available_now(spark: Any, url: str, stream: str, directory: Any, **options: Any) -> Any:
    reader = spark.readStream.format("nats").option("servers", url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(directory / "out"))
        .option("checkpointLocation", str(directory / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the query did not finish"
    assert query.exception() is None, query.exception()
    return query


def test_streaming_reads_each_message_once_across_runs(spark, nats_url, admin, unique, tmp_path):
    name = create(admin, f"S{unique}", True)
    publish_mixed(admin, name, 50)
    run_available_now(spark, nats_url, name, tmp_path)
    first = spark.read.parquet(str(tmp_path / "out")).select("data", "stream_seq").collect()
    assert sorted(int(r.data) for r in first) == list(range(50))
    publish_mixed(admin, name, 30, start=50)
    query = run_available_now(spark, nats_url, name, tmp_path)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 30  # only the new ones
    rows = spark.read.parquet(str(tmp_path / "out")).select("data", "stream_seq").collect()
    assert sorted(int(r.data) for r in rows) == list(range(80))  # each exactly once
    assert sorted(r.stream_seq for r in rows) == list(range(1, 81))
    assert run_sync(admin.api.consumer_names(name)) == []


def test_streaming_caps_batches_and_starts_where_told(spark, nats_url, admin, unique, tmp_path):
    name = create(admin, f"M{unique}", False)
    publish_mixed(admin, name, 100)
    query = run_available_now(
        spark, nats_url, name, tmp_path, maxMessagesPerTrigger=30, startingPosition="sequence:11"
    )
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [30, 30, 30]
    reports = [json.loads(p["sources"][0]["latestOffset"]) for p in batches]
    assert [r["lag"]["total"]["behindLatest"] for r in reports] == [60, 30, 0]
    assert {r["seq"] for r in reports} == {101}  # the stream's end
    rows = spark.read.parquet(str(tmp_path / "out")).select("stream_seq").collect()
    assert sorted(r.stream_seq for r in rows) == list(range(11, 101))


@pytest.mark.compat
def test_streaming_trigger_pacing(spark, nats_url, admin, unique, tmp_path):
    name = create(admin, f"P{unique}", False)
    publish_mixed(admin, name, 5)
    reader = spark.readStream.format("nats").option("servers", nats_url).option("stream", name)
    df = reader.option("minMessagesPerTrigger", "20").option("maxTriggerDelay", "5s").load()
    check_trigger_pacing(
        df, lambda start, count: publish_mixed(admin, name, count, start=start), tmp_path
    )


PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
# Subjects for pushdown: five keys, tokens that only look like wildcards, a deeper subject and
# subjects that share a key's prefix inside a token.
ODD_SUBJECTS = ("a*b", ">x", "k1.deep", "k10", "k1x.y")


@pytest.fixture(scope="module")
def filtered(admin: Blocking[NatsClient]) -> str:
    """A stream (allow_direct) of 50 `.k<i % 5>` messages, then one of each ODD_SUBJECTS;
    message 20 is deleted."""
    name = create(admin, f"F{uuid.uuid4().hex[:8]}", True)

    async def send() -> None:
        for i, key in enumerate([f"k{i % 5}" for i in range(50)] + list(ODD_SUBJECTS)):
            await admin.target.js.publish(f"{name}.{key}", str(i).encode())

    run_sync(send())
    run_sync(admin.api.request(f"STREAM.MSG.DELETE.{name}", {"seq": 20}))
    return name


def read_where(
    spark: Any, url: str, stream: str, where: Any, pushdown: bool, **options: Any
) -> tuple[list[Any], str]:
    """Rows of a filtered read, sorted, and the plan Spark explains."""
    spark.conf.set(PUSHDOWN, str(pushdown).lower())
    try:
        reader = spark.read.format("nats").option("servers", url).option("stream", stream)
        for key, value in options.items():
            reader = reader.option(key, str(value))
        df = reader.load().where(where)
        plan = io.StringIO()
        with contextlib.redirect_stdout(plan):
            df.explain(mode="formatted")
        return sorted(df.collect(), key=lambda row: row.stream_seq), plan.getvalue()
    finally:
        spark.conf.unset(PUSHDOWN)


def pushed_filters(plan: str) -> str:
    """What the scan took over, as explain shows it (no line when it took nothing)."""
    lines = [line for line in plan.splitlines() if line.startswith("PushedFilters:")]
    return lines[0] if lines else "PushedFilters: []"


Case = tuple[Any, dict[str, str], str, int | None]


def pushdown_cases(name: str, when: dict[int, dt.datetime]) -> list[Case]:
    """Filters on `filtered` (stream `name`, stored times `when` by sequence): where, options,
    what explain shows as pushed, how many rows (None: some)."""
    s, col = f"{name}.", F.col
    many = ", ".join(f"'{s}k{i}'" for i in range(70))
    return [
        (f"subject = '{s}k1'", {}, f"EqualTo(subject,{s}k1)", 10),
        (f"subject IN ('{s}k1', '{s}k3', '{s}none')", {}, "In(subject", 20),
        (f"subject IN ({many})", {}, "[]", 50),  # a covering `<stream>.*`, Spark filters too
        (f"subject LIKE '{s}k1.%'", {}, "StringStartsWith(subject", 1),
        (f"startswith(subject, '{s}k1')", {}, "[]", 13),  # `<stream>.>`, Spark filters too
        (f"subject IN ('{s}a*b', '{s}>x')", {}, "In(subject", 2),
        (f"subject = '{s}*'", {}, "[]", 0),  # a wildcard: Spark alone
        (f"subject = '{s}k1' AND subject LIKE 'other.%'", {}, "EqualTo(subject", 0),
        (f"subject IN ('{s}k2', '{s}k3')", {"subjects": f"{s}k1,{s}k2,{s}a*b"}, "In(subject", 10),
        ("stream_seq >= 1 AND stream_seq <= 55", {}, "GreaterThanOrEqual(stream_seq,1)", 54),
        ("stream_seq > 54", {}, "GreaterThan(stream_seq,54)", 1),
        ("stream_seq IN (20, 21)", {}, "[]", 1),  # 20 is deleted
        ("stream_seq > 55", {}, "GreaterThan(stream_seq,55)", 0),
        ("stream_seq < 1", {}, "LessThan(stream_seq,1)", 0),
        (
            col("subject").isin(f"{s}k1", f"{s}k2")
            & col("stream_seq").between(10, 30)
            & (col("timestamp") >= when[15]),
            {"startingPosition": "sequence:12"},
            "In(subject",
            None,
        ),
        (col("timestamp") == when[30], {}, "[]", None),
        (col("timestamp") > when[55], {}, "[]", 0),
        ((col("timestamp") <= when[2]) | (col("timestamp") < when[1]), {}, "[]", None),
        ((col("timestamp") > when[5]) & (col("timestamp") < when[9]), {}, "[]", None),
        # Times nats-server cannot look up (int64 nanoseconds): everything, then nothing.
        ("timestamp >= '1000-01-01' AND timestamp < '2300-01-01'", {}, "[]", 54),
        ("timestamp > '2300-01-01'", {}, "[]", 0),
        # A direct get takes one filter subject: IN stays with Spark there.
        (f"subject = '{s}k4'", {"readPath": "direct"}, f"EqualTo(subject,{s}k4)", 9),
        (f"subject IN ('{s}k2', '{s}k4')", {"readPath": "direct"}, "[]", 19),
    ]


PUSHDOWN_CASES = 23  # len(pushdown_cases(...)): a test each


@pytest.fixture(scope="module")
def unpushed(spark: Any, nats_url: str, filtered: str) -> Any:
    """Every row of `filtered`, read without pushdown, as a DataFrame Spark filters itself."""
    everything, _ = read_where(spark, nats_url, filtered, "true", pushdown=False)
    assert len(everything) == 54 and 20 not in seqs(everything)
    return spark.createDataFrame(everything, SCHEMA_DDL)


@pytest.mark.skipif(SPARK_VERSION < (4, 1), reason="filter pushdown needs pyspark 4.1+")
@pytest.mark.parametrize("case", range(PUSHDOWN_CASES))
def test_pushed_filters_give_the_rows_spark_gives(spark, nats_url, admin, filtered, unpushed, case):
    name = filtered
    when = {seq: micros(m.time).replace(tzinfo=dt.UTC) for seq, m in stored(admin, name).items()}
    cases = pushdown_cases(name, when)
    assert len(cases) == PUSHDOWN_CASES, "PUSHDOWN_CASES must count every case"
    where, options, shown, count = cases[case]
    wanted = sorted(unpushed.where(where).collect(), key=lambda row: row.stream_seq)
    first = int(options.get("startingPosition", "sequence:1").split(":")[1])
    wanted = [row for row in wanted if row.stream_seq >= first]
    if "subjects" in options:
        wanted = [row for row in wanted if row.subject in options["subjects"].split(",")]
    rows, plan = read_where(spark, nats_url, name, where, pushdown=True, **options)
    assert rows == wanted, where
    assert len(rows) == count if count is not None else rows, (where, len(rows))
    assert shown in pushed_filters(plan), (where, pushed_filters(plan))


def test_filters_without_pushdown_stay_with_spark(spark, nats_url, filtered):
    rows, plan = read_where(spark, nats_url, filtered, "stream_seq > 50", pushdown=False)
    assert seqs(rows) == [51, 52, 53, 54, 55]
    assert pushed_filters(plan) == "PushedFilters: []"
