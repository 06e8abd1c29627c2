"""One server with accounts: account B imports account A's JetStream API under the prefix
`JS.A.API` and reads A's streams by the option `apiPrefix`; user `etl` of account ETL may
subscribe only below `_INBOX_etl.>`, and reads and writes with `inboxPrefix=_INBOX_etl`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from bucket_contract import run_contract
from spark_helpers import (
    ACKS_LAST_BATCH,
    assert_exactly_once,
    opened,
    payloads,
    publish,
    run_query,
    source,
    static_group,
    unacked,
    wait_until,
    write_nats,
)
from topologies import accounts

from nats_spark.cli import main
from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConnectionFailed
from nats_spark.loop import Blocking, run_sync
from nats_spark.spark.group_source.ledger import Ledger

pytestmark = pytest.mark.spark

API_PREFIX, INBOX_PREFIX, B_INBOX = "JS.A.API", "_INBOX_etl", "_INBOX_B"
COPIES = "copies"  # subjects of A's stream that B's sink writes to
# B's imports: the API (pull responses are streams of messages), acks, for the key-value writes
# of group configs and the ack ledger A's `$KV.>` under the same prefix (as nats.go's KV writes
# through an API prefix), for listing a bucket's keys (a push consumer in A delivering to B's
# inbox) A's subjects below B's inbox prefix and the flow control replies, and for the sink the
# subjects of the stream it writes to.
CONFIG = f"""
accounts {{
  A: {{
    jetstream: enabled
    users: [ {{ user: a, password: a }} ]
    exports: [
      {{ service: "$JS.API.>", response_type: stream }}
      {{ service: "$JS.ACK.>" }}
      {{ service: "$KV.>" }}
      {{ stream: "{B_INBOX}.>" }}
      {{ service: "$JS.FC.>" }}
      {{ service: "{COPIES}.>" }}
    ]
  }}
  B: {{
    users: [ {{ user: b, password: b }} ]
    imports: [
      {{ service: {{ account: A, subject: "$JS.API.>" }}, to: "{API_PREFIX}.>" }}
      {{ service: {{ account: A, subject: "$JS.ACK.>" }} }}
      {{ service: {{ account: A, subject: "$KV.>" }}, to: "{API_PREFIX}.$KV.>" }}
      {{ stream: {{ account: A, subject: "{B_INBOX}.>" }} }}
      {{ service: {{ account: A, subject: "$JS.FC.>" }} }}
      {{ service: {{ account: A, subject: "{COPIES}.>" }} }}
    ]
  }}
  ETL: {{
    jetstream: enabled
    users: [
      {{ user: admin, password: admin }}
      {{
        user: etl, password: etl
        permissions: {{ subscribe: {{ allow: ["{INBOX_PREFIX}.>"] }} }}
      }}
    ]
  }}
}}
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[str]:
    with accounts(tmp_path_factory.mktemp("accounts"), CONFIG) as server:
        yield server.url


@pytest.fixture
def account_a(url) -> Iterator[Blocking[NatsClient]]:
    yield from opened(ConnectionSettings(servers=(url,), user="a", password="a"))


@pytest.fixture
def etl_admin(url) -> Iterator[Blocking[NatsClient]]:
    yield from opened(ConnectionSettings(servers=(url,), user="admin", password="admin"))


def read_all(spark: Any, url: str, stream: str, **options: str) -> list[int]:
    reader = spark.read.format("nats").option("servers", url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, value)
    return [int(r.data.decode()) for r in reader.load().select("data").collect()]


def error_line(call: Any, expected: str) -> str:
    with pytest.raises(Exception) as caught:  # noqa: B017 - Spark wraps it in its own types
        call()
    lines = [line for line in str(caught.value).splitlines() if expected in line]
    assert lines, str(caught.value)[:500]
    return lines[0]


def test_read_by_api_prefix(spark: Any, url, account_a, unique, capsys, tmp_path) -> None:
    stream = f"P{unique}"
    static_group(account_a, stream, "g", ["m1", "m2"], partitions=2)  # as account A sees it
    publish(account_a, stream, 80)
    as_b = {"user": "b", "password": "b"}
    assert_exactly_once(read_all(spark, url, stream, apiPrefix=API_PREFIX, **as_b), 80)
    rows = source(spark, url, stream, "g", apiPrefix=API_PREFIX, inboxPrefix=B_INBOX, **as_b)
    query, error = run_query(rows, tmp_path)
    assert error is None, error
    assert_exactly_once(payloads(spark, str(tmp_path / "out")), 80)
    copy = f"C{unique}"
    run_sync(account_a.api.create_stream({"name": copy, "subjects": [f"{COPIES}.{unique}.*"]}))
    written = spark.read.parquet(str(tmp_path / "out")).selectExpr(
        f"concat('{COPIES}.{unique}.', cast(stream_seq as string)) as subject", "data"
    )
    write_nats(written, url, copy, apiPrefix=API_PREFIX, **as_b)
    assert_exactly_once(read_all(spark, url, copy, user="a", password="a"), 80)
    if ACKS_LAST_BATCH:
        wait_until(lambda: unacked(account_a, stream, "g") == 0, 30, "every message acked")
    flags = ["--server", url, "--user", "b", "--password", "b", "--js-api-prefix", API_PREFIX]
    assert main([*flags, "static", "info", stream, "g"]) == 0
    assert "m1" in capsys.readouterr().out

    started = time.monotonic()
    line = error_line(
        lambda: read_all(spark, url, stream, apiPrefix="JS.X.API", **as_b),
        "no JetStream API answers under the prefix 'JS.X.API'",
    )
    assert "fix the option apiPrefix" in line and time.monotonic() - started < 30


def test_ack_ledger_bucket_by_api_prefix(url, account_a, unique) -> None:
    """The ledger's gets and compare-and-set writes reach A's bucket from B: gets under the API
    prefix, writes to `<prefix>.$KV.<bucket>.<key>`."""
    settings = ConnectionSettings(servers=(url,), user="b", password="b", api_prefix=API_PREFIX)
    for as_b in opened(settings):
        run_contract(as_b.target, f"L{unique}")
        kv = run_sync(Ledger.bucket(as_b.target, f"L{unique}", create=True))
        revision = run_sync(kv.put("a.1", b"x"))
        assert run_sync(account_a.api.stream_info(f"KV_L{unique}")).last_seq == revision
        run_sync(as_b.js.delete_key_value(f"L{unique}"))


def test_locked_down_user_needs_the_inbox_prefix(spark: Any, url, etl_admin, unique, tmp_path):
    stream, copy = f"E{unique}", f"F{unique}"
    static_group(etl_admin, stream, "g", ["m1", "m2"], partitions=2)
    run_sync(etl_admin.api.create_stream({"name": copy, "subjects": [f"{copy}.*"]}))
    publish(etl_admin, stream, 90)
    as_etl = {"user": "etl", "password": "etl"}

    expected = "set the option inboxPrefix (--inbox-prefix)"
    with pytest.raises(ConnectionFailed, match=r"may not subscribe to reply inboxes below _INBOX"):
        open_blocking(ConnectionSettings(servers=(url,), user="etl", password="etl"))
    assert "may not subscribe" in error_line(
        lambda: read_all(spark, url, stream, **as_etl), expected
    )

    rows = source(spark, url, stream, "g", inboxPrefix=INBOX_PREFIX, **as_etl)
    query, error = run_query(rows, tmp_path)
    assert error is None, error
    assert_exactly_once(payloads(spark, str(tmp_path / "out")), 90)
    if ACKS_LAST_BATCH:
        wait_until(lambda: unacked(etl_admin, stream, "g") == 0, 30, "every message acked")

    read = spark.read.format("nats").option("servers", url).option("stream", stream)
    written = (
        read.options(inboxPrefix=INBOX_PREFIX, **as_etl)
        .load()
        .selectExpr(f"concat('{copy}.', cast(stream_seq as string)) as subject", "data")
    )
    write_nats(written, url, copy, inboxPrefix=INBOX_PREFIX, **as_etl)
    assert_exactly_once(read_all(spark, url, copy, user="admin", password="admin"), 90)
