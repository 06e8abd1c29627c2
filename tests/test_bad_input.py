"""Bad input: wrong options, a malformed group config, extreme messages, streams without partition
tokens and servers too old. Each error is one line naming the problem and the fix, and is raised
before the source takes any message."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.aio.client import ServerVersion
from spark_helpers import publish, run_query, source, static_group

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ServerTooOld
from nats_spark.loop import Blocking, run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.consumers import ensure_group_consumer, member_consumer
from nats_spark.pcg.store import GroupKind, load_group
from nats_spark.server import check_server_version

BASE = {"servers": "nats://127.0.0.1:1", "stream": "S", "group": "g"}


# Through Spark: what the user sees at load() and when the query starts.


def load_error(spark: Any, options: dict[str, str]) -> str:
    """The message Spark raises from `load()` with `options`."""
    reader = spark.readStream.format("nats-pcg")
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception) as caught:  # noqa: B017 - Spark wraps it in its own types
        reader.load()
    return str(caught.value)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"fetchBatchSize": "0"}, "option fetchBatchSize=0 is out of range; use a number from 1"),
        ({"ackWait": "soon"}, "option ackWait='soon' is not a duration; use e.g. 500ms"),
        ({"consumer": "c"}, "set exactly one of the options group"),
        ({"colour": "blue"}, "unknown option 'colour'"),
        # Spark passes option names in lower case; the hint gives the name's own spelling.
        ({"maxAckPendng": "9"}, "unknown option 'maxackpendng'; did you mean maxAckPending?"),
    ],
)
def test_bad_option_fails_load_with_the_one_line_message(
    spark: Any, overrides: dict[str, str], expected: str
) -> None:
    message = load_error(spark, {**BASE, **overrides})
    # The connector's line comes whole on the first line, after Spark's prefix.
    first = message.splitlines()[0]
    assert "nats_spark.errors.ConfigurationError: " in first and expected in first, message


def consumer_states(client: Blocking[NatsClient], stream: str) -> dict[str, tuple[int, int, int]]:
    """(num_pending, num_ack_pending, delivered stream seq) of every consumer on `stream`."""
    api = Blocking(client.api)
    states = {}
    for name in api.consumer_names(stream):
        info = api.consumer_info(stream, name)
        states[name] = (
            info["num_pending"],
            info["num_ack_pending"],
            info["delivered"]["stream_seq"],
        )
    return states


def ours(error: BaseException) -> str:
    """The connector's own line in a Spark error: on the first line, not after a traceback."""
    first = str(error).splitlines()[0]
    assert "nats_spark." in first and "Traceback" not in first, str(error)
    return first[first.index("nats_spark.") :]


def load_refusal(load: Callable[[], Any]) -> str:
    """The connector's line of the error `load()` raises (it checks the target on the server):
    at most two lines, ours on the first."""
    with pytest.raises(Exception) as caught:  # noqa: B017 - Spark wraps it in its own types
        load()
    assert len(str(caught.value).splitlines()) <= 2, str(caught.value)
    return ours(caught.value)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("garbage", "expected"),
    [
        (b"{not json", "is not valid JSON"),
        (b'{"max_members": "four", "members": ["m1"]}', "is JSON of the wrong shape"),
        (b'{"max_members": 0, "members": ["m1"]}', "max_members is 0"),
        (b"\xff\xfe", "is not valid JSON"),
    ],
)
def test_malformed_group_config_fails_before_taking_messages(
    spark: Any,
    client: Blocking[NatsClient],
    nats_url: str,
    unique: str,
    garbage: bytes,
    expected: str,
) -> None:
    stream = f"BAD{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    entry = run_sync(load_group(client.target, stream, "g"))
    for member in ("m1", "m2"):  # consumers with work waiting: the failure must leave it there
        run_sync(ensure_group_consumer(client.target, member_consumer(entry, member)))
    publish(client, stream, 40)
    before = consumer_states(client, stream)
    kv = run_sync(client.target.js.key_value(GroupKind.STATIC.bucket))
    run_sync(kv.put(f"{stream}.g", garbage))

    message = load_refusal(lambda: source(spark, nats_url, stream, "g"))
    assert f"static-consumer-groups/{stream}.g" in message and expected in message, message
    assert message.count("group config") == 1, message  # named once, where it is stored
    assert consumer_states(client, stream) == before
    assert sum(pending for pending, _, _ in before.values()) == 40


# Extreme messages


async def raw_publish(port: int, subject: str, header_lines: bytes, payload: bytes) -> None:
    """Publish with header bytes exactly as given (nats-py would encode them as UTF-8) and wait
    for JetStream's ack."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await reader.readline()  # INFO
        headers = b"NATS/1.0\r\n" + header_lines + b"\r\n"
        writer.write(
            b'CONNECT {"verbose":false,"headers":true,"protocol":1}\r\nSUB raw.ack 1\r\n'
            + f"HPUB {subject} raw.ack {len(headers)} {len(headers) + len(payload)}\r\n".encode()
            + headers
            + payload
            + b"\r\n"
        )
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
        assert line.startswith(b"MSG raw.ack"), line
        ack = json.loads(await reader.readline())
        assert "seq" in ack, ack
    finally:
        writer.close()


@pytest.mark.spark
def test_huge_empty_and_binary_messages_flow_through_exactly(
    spark: Any, client: Blocking[NatsClient], nats_url: str, unique: str, tmp_path: Path
) -> None:
    stream = f"BIG{unique}"
    static_group(client, stream, "g", ["m1"], partitions=1)
    huge = os.urandom(1_000_000)
    every_byte = bytes(range(256))
    js = Blocking(client.js)
    js.publish(f"{stream}.huge", huge)
    js.publish(f"{stream}.empty", b"")
    js.publish(f"{stream}.bytes", every_byte, headers={"kind": "all bytes"})
    port = int(nats_url.rsplit(":", 1)[1])
    binary = b"X-Bin: ok\xff\xfe\x80end\r\nX-Multi: a\r\nX-Multi: b\r\n"
    run_sync(raw_publish(port, f"{stream}.hdr", binary, b"with binary headers"))

    _, error = run_query(source(spark, nats_url, stream, "g"), tmp_path)
    assert error is None, error
    rows = {r.subject: r for r in spark.read.parquet(str(tmp_path / "out")).collect()}
    assert sorted(rows) == sorted(f"{stream}.{s}" for s in ("huge", "empty", "bytes", "hdr"))
    assert rows[f"{stream}.huge"].data == huge
    assert rows[f"{stream}.empty"].data == b""
    assert rows[f"{stream}.bytes"].data == every_byte
    assert rows[f"{stream}.bytes"].headers == {"kind": ["all bytes"]}
    headers = rows[f"{stream}.hdr"].headers
    # Header values are strings: bytes that are not UTF-8 become U+FFFD, the rest stays.
    assert headers["X-Bin"] == ["ok\ufffd\ufffd\ufffdend"]
    assert headers["X-Multi"] == ["a", "b"], headers


# Streams whose subjects carry no partition number


@pytest.mark.spark
def test_static_group_over_stream_without_partition_tokens(
    spark: Any, client: Blocking[NatsClient], nats_url: str, unique: str
) -> None:
    stream = f"NOP{unique}"
    run_sync(client.api.create_stream({"name": stream, "subjects": [f"{stream}.*"]}))
    run_sync(admin.create_static(client.target, stream, "g", 2, members=["m1", "m2"]))
    publish(client, stream, 20)
    # Member filters `0.>` and `1.>` can match none of the stream's `<stream>.*` subjects: the
    # source must say so (at load()) instead of reading nothing without a word.
    message = load_refusal(lambda: source(spark, nats_url, stream, "g"))
    states = consumer_states(client, stream)
    assert Blocking(client.api).stream_info(stream)["state"]["messages"] == 20
    assert "partition" in message and stream in message, message
    assert all(delivered == 0 for _, _, delivered in states.values())


# Servers too old for priority groups


@pytest.mark.unit
def test_check_server_version_names_version_and_fix() -> None:
    check_server_version((2, 11, 0))
    with pytest.raises(ServerTooOld) as caught:
        check_server_version((2, 10, 22), "NATS server nats://h:1")
    assert str(caught.value) == (
        "NATS server nats://h:1 is version 2.10.22, but priority groups need 2.11 or newer; "
        "upgrade the NATS server"
    )


def test_open_refuses_a_server_reporting_an_old_version(
    settings: ConnectionSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        NATS, "connected_server_version", property(lambda _: ServerVersion("2.10.7"))
    )
    with pytest.raises(ServerTooOld) as caught:
        run_sync(NatsClient.open(settings))
    message = str(caught.value)
    assert "\n" not in message
    assert f"NATS server {settings.described()} is version 2.10.7" in message
    assert "upgrade the NATS server" in message


@pytest.fixture
def old_server() -> Iterator[str]:
    """A fake NATS server on a free port that introduces itself as version 2.10.7."""
    info = {"server_id": "OLD", "version": "2.10.7", "proto": 1, "headers": True}
    info |= {"max_payload": 1048576, "jetstream": True}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"INFO {json.dumps(info)}\r\n".encode())
        while line := await reader.readline():
            if line.startswith(b"PING"):
                writer.write(b"PONG\r\n")
        writer.close()

    async def stop() -> None:  # on the loop: asyncio servers are not thread-safe
        server.close()

    server = run_sync(asyncio.start_server(serve, "127.0.0.1", 0))
    yield f"nats://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    run_sync(stop())


@pytest.mark.spark
def test_query_against_an_old_server_fails_with_one_line(spark: Any, old_server: str) -> None:
    message = load_refusal(lambda: source(spark, old_server, "S", "g"))
    assert message == (
        f"nats_spark.errors.ServerTooOld: NATS server {old_server} is version 2.10.7, but "
        "priority groups need 2.11 or newer; upgrade the NATS server"
    )


@pytest.mark.spark
def test_a_missing_stream_is_one_line_in_every_format(spark: Any, nats_url: str):
    """Batch and streaming reads of both formats and the sink word it the same."""
    stream = f"NOSUCH{os.getpid()}"
    expected = (
        f"nats_spark.errors.ConfigurationError: stream '{stream}' does not exist on {nats_url}; "
        "create it or fix the stream option"
    )

    def nats(reader: Any) -> Any:
        return reader.format("nats").option("servers", nats_url).option("stream", stream)

    lines = {
        "nats-pcg readStream": load_refusal(lambda: source(spark, nats_url, stream, "g")),
        "nats readStream": load_refusal(lambda: nats(spark.readStream).load()),
    }
    with pytest.raises(Exception) as read:  # noqa: B017 - Spark wraps it in its own types
        nats(spark.read).load().collect()
    lines["nats read"] = ours(read.value)
    with pytest.raises(Exception) as write:  # noqa: B017
        data = spark.createDataFrame([("x",)], "data STRING")
        nats(data.write.mode("append")).option("subject", "a").save()
    lines["nats write"] = ours(write.value)
    assert lines == dict.fromkeys(lines, expected)


@pytest.mark.parametrize(
    ("fake_pyspark", "found"),
    [
        ('__version__ = "3.5.2"', "found 3.5.2"),  # e.g. Databricks Runtime 16.4
        ('raise ImportError("No module named pyspark")', "which this Python lacks"),
    ],
)
def test_a_python_without_spark_4_is_named_on_import(tmp_path, fake_pyspark, found):
    """PySpark is not a dependency (a Spark runtime brings its own): the formats say what they
    need instead of failing on a missing pyspark.sql.datasource."""
    (tmp_path / "pyspark").mkdir()
    (tmp_path / "pyspark" / "__init__.py").write_text(fake_pyspark + "\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", "import pyspark_nats_pcg"], env=env, capture_output=True, text=True
    )
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and last == (
        f"ImportError: nats-spark's Spark formats need PySpark 4.0 or newer, {found}; on a plain "
        "machine install nats-spark with its spark extra (or pyspark>=4), on Databricks use "
        "Runtime 17.3 LTS or newer"
    )


# A streaming write whose tasks are not told their query and batch


class _TaskWithoutQuery:
    """A task context whose local properties lack the streaming query and batch ids."""

    @staticmethod
    def get() -> _TaskWithoutQuery:
        return _TaskWithoutQuery()

    def getLocalProperty(self, key: str) -> None:  # noqa: N802 - pyspark's name
        return None

    def partitionId(self) -> int:  # noqa: N802 - pyspark's name
        return 0


@pytest.mark.unit
def test_sink_without_query_ids_names_the_runtime_and_the_way_around(monkeypatch) -> None:
    from pyspark import __version__

    from nats_spark.errors import ConfigurationError
    from nats_spark.spark.sink import publisher

    monkeypatch.setattr(publisher, "TaskContext", _TaskWithoutQuery)
    assert publisher.task_id_prefix("write1") == "write1.0"  # batch writes bring their own id
    with pytest.raises(ConfigurationError) as caught:
        publisher.task_id_prefix(None)
    message = str(caught.value)
    assert "\n" not in message and "Spark 4.0 or newer" not in message
    assert message.startswith(f"Spark {__version__} gave this streaming write's task no query")
    assert "foreachBatch with df.write.format('nats')" in message
