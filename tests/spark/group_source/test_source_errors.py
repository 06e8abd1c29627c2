"""Clear, one-line errors before any message is taken."""

from __future__ import annotations

import re

import pytest
from spark_helpers import elastic_group, publish, source, static_group, wait_until

from nats_spark.loop import run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.store import load_group, update_group
from nats_spark.server import EmbeddedServer

pytestmark = pytest.mark.spark


def failure(query) -> str:
    """The first line a user sees when the query dies: Spark's wrapper, then our line (not a
    traceback that ends with it)."""
    with pytest.raises(Exception) as caught:
        query.awaitTermination(60)
    first = str(caught.value).splitlines()[0]
    assert "nats_spark." in first and "Traceback" not in first, str(caught.value)
    return first


def load_failure(load) -> str:
    """What `load()` raises for a target it checked on the server: at most two lines (Spark's
    SQLSTATE on the second), its first ending in the connector's line, which names the fix."""
    with pytest.raises(Exception) as caught:
        load()
    message = str(caught.value)
    lines = message.splitlines()
    assert len(lines) <= 2 and "nats_spark." in lines[0] and "Traceback" not in message, message
    return lines[0]


def start(df, tmp_path):
    return (
        df.writeStream.format("memory")
        .queryName(f"q{abs(hash(str(tmp_path))) % 10**8}")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"stream": ""}, "option stream is required"),
        ({"group": "g", "consumer": "c"}, "set exactly one of the options group"),
        ({"fetchBatchSize": "many"}, "fetchBatchSize='many' is not a whole number"),
        ({"ackWait": "soon"}, "ackWait='soon' is not a duration"),
        ({"includeHeaders": "maybe"}, "includeHeaders='maybe' is not a boolean"),
        ({"colour": "blue"}, "unknown option 'colour'; known options: servers"),
        ({"groupType": "dynamic"}, "groupType='dynamic' is not valid"),
    ],
)
def test_bad_options_fail_at_load(spark, nats_url, options, message):
    reader = spark.readStream.format("nats-pcg").option("servers", nats_url)
    for key, value in {"stream": "S", "group": "g", **options}.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception, match=re.escape(message)):
        reader.load()


# A wrong server, stream, group or consumer fails at load(), which checks the target on the
# server (reading only), before a query starts.


def test_missing_stream(spark, nats_url, unique):
    text = load_failure(lambda: source(spark, nats_url, f"NO{unique}", "g"))
    assert f"stream 'NO{unique}' does not exist" in text and "fix the stream option" in text


def test_missing_group_takes_nothing_and_lists_the_groups(spark, client, nats_url, unique):
    stream = f"G{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2)
    run_sync(admin.create_static(client.target, stream, "h", 2, members=["m1"]))
    publish(client, stream, 10)
    text = load_failure(lambda: source(spark, nats_url, stream, "other"))
    assert "consumer group 'other' on stream" in text and "not found" in text
    assert text.endswith(f"(groups on '{stream}': g (static), h (static))"), text
    assert run_sync(client.api.stream_info(stream))["state"]["messages"] == 10
    consumers = run_sync(client.api.consumer_names(stream))
    assert consumers == [], consumers  # nothing created, nothing pulled


def test_missing_group_on_a_stream_without_groups(spark, client, nats_url, unique):
    stream = f"NG{unique}"
    run_sync(client.api.create_stream({"name": stream, "subjects": [f"{stream}.*"]}))
    text = load_failure(lambda: source(spark, nats_url, stream, "g"))
    assert text.endswith(f"('{stream}' has no groups)"), text


def test_missing_consumer(spark, client, nats_url, unique):
    stream = f"NC{unique}"
    run_sync(client.api.create_stream({"name": stream, "subjects": [f"{stream}.*"]}))
    text = load_failure(lambda: source(spark, nats_url, stream, consumer="c"))
    assert f"consumer 'c' does not exist on stream '{stream}'; create it first" in text, text


def test_members_not_in_group(spark, client, nats_url, unique):
    stream = f"M{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2)
    text = load_failure(lambda: source(spark, nats_url, stream, "g", members="m1,m9"))
    assert "members m9 are not in group 'g'" in text and "fix the members option" in text


def test_unreachable_server(spark):
    with EmbeddedServer() as server:
        url = server.url
    text = load_failure(lambda: source(spark, url, "S", "g"))
    assert "cannot connect to NATS at" in text and "check the URL" in text


def test_wrong_credentials(spark):
    with EmbeddedServer(extra_args=["--user", "app", "--pass", "right-secret-123"]) as server:
        text = load_failure(
            lambda: source(spark, server.url, "S", "g", user="app", password="wrong-secret-456")
        )
    assert "refused the credentials" in text
    assert "wrong-secret-456" not in text and "right-secret-123" not in text


def test_spark_intervals_are_durations(spark, client, nats_url, unique, tmp_path):
    """The README writes Spark intervals as "5 seconds": so may the options."""
    stream = f"IV{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2)
    df = source(spark, nats_url, stream, "g", ackWait="45 seconds", fetchTimeout="500 milliseconds")
    query = start(df, tmp_path)
    query.awaitTermination(60)
    assert query.exception() is None
    infos = [
        run_sync(client.api.consumer_info(stream, c))
        for c in run_sync(client.api.consumer_names(stream))
    ]
    assert infos and {info.ack_wait for info in infos} == {45.0}, infos


def running_query(spark, url, stream, tmp_path):
    return (
        source(spark, url, stream, "g")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def test_deleted_group_fails_the_query(spark, client, nats_url, unique, tmp_path):
    stream = f"X{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2)
    query = running_query(spark, nats_url, stream, tmp_path)
    wait_until(lambda: len(query.recentProgress) >= 2, 30, "the query to run")
    run_sync(admin.delete_static(client.target, stream, "g"))
    text = failure(query)
    assert "consumer group 'g' on stream" in text and "not found" in text


def test_changed_static_group_fails_the_query(spark, client, nats_url, unique, tmp_path):
    stream = f"C{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2)
    query = running_query(spark, nats_url, stream, tmp_path)
    wait_until(lambda: len(query.recentProgress) >= 2, 30, "the query to run")
    entry = run_sync(load_group(client.target, stream, "g"))
    run_sync(update_group(client.target, entry, entry.config.with_members_added(["m2"])))
    assert "static groups are immutable" in failure(query)


def test_user_schema_fails_before_anything_is_taken(spark, client, nats_url, unique, tmp_path):
    stream = f"US{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2)
    publish(client, stream, 31)
    reader = spark.readStream.format("nats-pcg").schema("value STRING")
    for key, value in {"servers": nats_url, "stream": stream, "group": "g"}.items():
        reader = reader.option(key, value)
    text = failure(start(reader.load(), tmp_path))
    assert "nats-pcg has a fixed schema" in text and "drop .schema(...)" in text, text
    assert run_sync(client.api.consumer_names(stream)) == []  # nothing created, nothing pulled
    assert run_sync(client.api.stream_info(stream))["state"]["messages"] == 31


@pytest.mark.parametrize("kind", ["static", "elastic"])
def test_group_without_members_fails_at_start(spark, client, nats_url, unique, tmp_path, kind):
    stream = f"EG{unique}"
    if kind == "static":
        static_group(client, stream, "g", [], partitions=2)
        fix = "nats-pcg static create"
    else:
        elastic_group(client, stream, "g", [], partitions=2)
        fix = f"nats-pcg elastic add {stream} g <member>"
    text = failure(start(source(spark, nats_url, stream, "g"), tmp_path))
    assert f"{kind} group 'g' on stream '{stream}' has no members to read" in text, text
    assert fix in text, text


def test_stream_deleted_while_running_fails_with_one_line(
    spark, client, nats_url, unique, tmp_path
):
    stream = f"SD{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2)
    publish(client, stream, 10)
    seen: list[int] = []
    query = (
        source(spark, nats_url, stream, "g")
        .writeStream.foreachBatch(lambda batch, _: seen.extend(range(batch.count())))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: len(seen) >= 10, 60, "10 rows")
        run_sync(client.api.delete_stream(stream))
        text = failure(query)
    finally:
        query.stop()
    assert f"stream '{stream}'" in text and "recreate it" in text, text
    assert "error code 10059" not in text, text
