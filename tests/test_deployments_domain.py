"""A hub in JetStream domain `hub` and a leaf node in its own domain; the client connects to the
leaf and reaches the hub's streams, groups, KV buckets and ack ledger by the option `domain`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from bucket_contract import run_contract
from spark_helpers import (
    ACKS_LAST_BATCH,
    assert_exactly_once,
    batches_logged,
    elastic_group,
    kill_group,
    opened,
    payloads,
    publish,
    run_query,
    source,
    start_job,
    static_group,
    unacked,
    wait_until,
    write_nats,
)
from topologies import HUB_DOMAIN, hub_and_leaf

from nats_spark.cli import main
from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NotFound
from nats_spark.loop import Blocking, run_sync
from nats_spark.server import EmbeddedServer
from nats_spark.spark.group_source.ledger import Ledger

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def topology(tmp_path_factory) -> Iterator[tuple[EmbeddedServer, EmbeddedServer]]:
    with hub_and_leaf(tmp_path_factory.mktemp("domains")) as servers:
        yield servers


@pytest.fixture(scope="module")
def leaf_url(topology) -> str:
    return topology[1].url


@pytest.fixture
def client(leaf_url) -> Iterator[Blocking[NatsClient]]:
    """Connected to the leaf, working in the hub's domain."""
    yield from opened(ConnectionSettings(servers=(leaf_url,), domain=HUB_DOMAIN))


@pytest.fixture
def on_hub(topology) -> Iterator[Blocking[NatsClient]]:
    """Connected to the hub itself, no domain: to check where things landed."""
    yield from opened(ConnectionSettings(servers=(topology[0].url,)))


@pytest.fixture
def on_leaf(leaf_url) -> Iterator[Blocking[NatsClient]]:
    """Connected to the leaf in its own domain."""
    yield from opened(ConnectionSettings(servers=(leaf_url,)))


def only_in_the_hub(on_hub: Blocking[NatsClient], on_leaf: Blocking[NatsClient], stream: str):
    assert run_sync(on_hub.api.stream_info(stream)).config["name"] == stream
    with pytest.raises(NotFound):
        run_sync(on_leaf.api.stream_info(stream))


def test_ack_ledger_bucket_through_the_leaf(client, on_hub, on_leaf, unique) -> None:
    """The ledger's gets and compare-and-set writes reach the hub's bucket through the leaf:
    gets on `$JS.hub.API`, writes to `$JS.hub.API.$KV.<bucket>.<key>`."""
    run_contract(client.target, f"L{unique}")
    kv = run_sync(Ledger.bucket(client.target, f"L{unique}", create=True))
    try:
        revision = run_sync(kv.put("a.1", b"x"))
        only_in_the_hub(on_hub, on_leaf, f"KV_L{unique}")
        assert run_sync(on_hub.api.stream_info(f"KV_L{unique}")).last_seq == revision
    finally:
        run_sync(client.js.delete_key_value(f"L{unique}"))


@pytest.mark.timeout(420)  # one job driver: a JVM
@pytest.mark.parametrize("make_group", [static_group, elastic_group], ids=["static", "elastic"])
def test_group_read_through_the_leaf_exactly_once_across_a_driver_kill(
    spark, client, on_hub, on_leaf, leaf_url, make_group, unique, tmp_path
) -> None:
    stream = f"D{unique}"
    make_group(client, stream, "g", ["m1", "m2"], partitions=4)
    only_in_the_hub(on_hub, on_leaf, stream)
    publish(client, stream, 450)
    out, log = tmp_path / "out", tmp_path / "job.log"
    job = start_job(leaf_url, stream, out, tmp_path / "cp", log, f"domain={HUB_DOMAIN}")
    try:
        wait_until(lambda: batches_logged(log) >= 2, 240, f"two batches ({log})")
    finally:
        kill_group(job)
    publish(client, stream, 150, start=450)
    # The same query restarted from the job's checkpoint, in this test's session.
    rows = source(
        spark, leaf_url, stream, "g", domain=HUB_DOMAIN, maxMessagesPerTrigger=150, ackWait="5s"
    )
    query, error = run_query(rows, tmp_path)
    assert error is None, error
    assert_exactly_once(payloads(spark, str(out)), 600)
    if ACKS_LAST_BATCH:
        wait_until(lambda: unacked(client, stream, "g") == 0, 30, "every message acked")


def test_batch_read_and_sink_through_the_leaf(
    spark: Any, client, on_hub, on_leaf, leaf_url, unique
) -> None:
    source, target = f"R{unique}", f"W{unique}"
    for name in (source, target):
        run_sync(client.api.create_stream({"name": name, "subjects": [f"{name}.*"]}))
    only_in_the_hub(on_hub, on_leaf, target)
    publish(client, source, 120)
    rows = (
        spark.read.format("nats")
        .option("servers", leaf_url)
        .option("domain", HUB_DOMAIN)
        .option("stream", source)
        .load()
    )
    assert_exactly_once([int(r.data.decode()) for r in rows.select("data").collect()], 120)

    copies = rows.selectExpr(
        f"concat('{target}.', substring(subject, {len(source) + 2})) as subject", "data"
    )
    write_nats(copies, leaf_url, target, domain=HUB_DOMAIN)
    stored = [run_sync(on_hub.api.get_message(target, seq)) for seq in range(1, 121)]
    assert run_sync(on_hub.api.stream_info(target)).last_seq == 120
    assert_exactly_once([int(m.data) for m in stored], 120)


def test_cli_status_through_the_leaf(client, leaf_url, unique, capsys) -> None:
    stream = f"C{unique}"
    static_group(client, stream, "g", ["m1"], partitions=2)
    flags = ["--server", leaf_url, "--js-domain", HUB_DOMAIN]
    assert main([*flags, "status", stream, "g"]) == 0
    assert f"static group g on {stream}" in capsys.readouterr().out


def test_a_wrong_domain_fails_fast_naming_the_option(spark: Any, leaf_url, capsys) -> None:
    expected = "JetStream domain 'nowhere' not reachable"
    started = time.monotonic()
    with pytest.raises(Exception) as caught:  # noqa: B017 - Spark wraps it in its own types
        spark.read.format("nats").option("servers", leaf_url).option("domain", "nowhere").option(
            "stream", "S"
        ).load().collect()
    lines = [line for line in str(caught.value).splitlines() if expected in line]
    assert lines and "fix the option domain" in lines[0], str(caught.value)[:500]
    assert time.monotonic() - started < 30  # not retried as if JetStream had no leader
    assert main(["--server", leaf_url, "--js-domain", "nowhere", "static", "ls", "S"]) != 0
    assert expected in capsys.readouterr().err
