"""The source through Spark Connect: the server bundled with pyspark runs the source's Python on
its side; a client session (in its own process: it cannot share one with a classic session) reads
a group with the auto-registered format, another after `spark.dataSource.register`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from spark_helpers import (
    AUTO_REGISTER_PATH,
    assert_exactly_once,
    committed_rows,
    launch,
    publish,
    row_payloads,
    settled,
    spark_bin,
    spark_env,
    static_group,
    wait_for_log,
)

from chaos.proxy import free_port

pytestmark = pytest.mark.spark

CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"

CLIENT = """
import json
import sys

from pyspark.sql import SparkSession

from nats_spark.spark.group_source.source import NatsPcgDataSource

remote, url, auto_stream, registered_stream, out = sys.argv[1:]


def query(spark, stream):
    df = (
        spark.readStream.format("nats-pcg")
        .option("servers", url)
        .option("stream", stream)
        .option("group", "g")
        .load()
    )
    return df.writeStream.trigger(availableNow=True)


auto = SparkSession.builder.remote(remote).getOrCreate()
registered = SparkSession.builder.remote(remote).create()  # a second server-side session
registered.dataSource.register(NatsPcgDataSource)
queries = [
    query(auto, auto_stream).format("memory").queryName("auto_rows").start(),
    query(registered, registered_stream)
    .format("parquet")
    .option("checkpointLocation", out + "/checkpoint")
    .start(out + "/data"),
]
for q in queries:
    q.awaitTermination()
    assert q.exception() is None, q.exception()
rows = auto.sql("SELECT CAST(data AS STRING) AS n, member FROM auto_rows").collect()
print("RESULT " + json.dumps({
    "session": type(auto).__module__,
    "auto": [[int(r.n), r.member] for r in rows],
    "lag": json.loads(queries[0].lastProgress["sources"][0]["latestOffset"]),
}), flush=True)
# Stopped explicitly: left to `__del__` at interpreter exit, closing the gRPC channel hangs.
registered.stop()
auto.stop()
"""


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory) -> Iterator[str]:
    """A Spark Connect server (local[2]) on a free loopback port."""
    tmp = tmp_path_factory.mktemp("connect")
    port = free_port()
    server = launch(
        "connect-server",
        [
            spark_bin("spark-submit"),
            "--class",
            CONNECT_SERVER,
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
        ],
        tmp,
        spark_env(PYTHONPATH=AUTO_REGISTER_PATH),
    )
    try:
        wait_for_log(server, "Spark Connect server started", timeout=90)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.stop()


def test_connect_session_reads_groups_exactly_once(
    connect_url: str, client, nats_url: str, unique: str, tmp_path: Path
) -> None:
    auto_stream, registered_stream = f"CA{unique}", f"CR{unique}"
    for stream, count in ((auto_stream, 300), (registered_stream, 200)):
        static_group(client, stream, "g", ["m1", "m2"], partitions=4)
        publish(client, stream, count)
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    out = tmp_path / "out"
    args = [sys.executable, str(script), connect_url, nats_url, auto_stream, registered_stream]
    done = subprocess.run(
        [*args, str(out)],
        capture_output=True,
        text=True,
        env=spark_env(),
        cwd=tmp_path,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["session"] == "pyspark.sql.connect.session"  # not a classic session
    assert_exactly_once([n for n, _ in result["auto"]], 300)
    assert {member for _, member in result["auto"]} == {"m1", "m2"}
    lag = result["lag"]["members"]  # per input partition: one per group partition
    assert set(lag) == {f"partition-{p}" for p in range(4)}
    assert {state["member"] for state in lag.values()} == {"m1", "m2"}
    rows = committed_rows(out / "data")
    assert_exactly_once(row_payloads(rows), 200)
    assert {row["member"] for row in rows} == {"m1", "m2"}
    for stream in (auto_stream, registered_stream):
        assert settled(client, stream, "g")
