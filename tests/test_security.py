"""Security: TLS and mutual TLS, every way to authenticate, a least-privilege user, and secrets
that never reach logs, exceptions, checkpoints, the ack ledger or Spark's progress."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
import pytest
from certs import Pki, creds_file, make_pki, new_nkey, operator_setup, public, tls_config
from nats.js.errors import KeyNotFoundError
from spark_helpers import (
    assert_exactly_once,
    assert_works,
    member_states,
    payloads,
    publish,
    refusal,
    run_query,
    settled,
    source,
    static_group,
    wait_until,
)

from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConfigurationError, NotFound, PermissionDenied
from nats_spark.jetstream.acks import publish_acks
from nats_spark.loop import Blocking, run_sync
from nats_spark.permissions import publish_allowed
from nats_spark.server import EmbeddedServer
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator
from nats_spark.spark.group_source.driver.consumer_listing import LIST_FROM
from nats_spark.spark.group_source.ledger import LedgerBucket, decode_chunk
from nats_spark.spark.group_source.options import parse_options

# Unique secrets, so that finding one anywhere can only mean a leak.
ADMIN_PASSWORD = f"pw-{uuid.uuid4().hex}"
TOKEN = f"tok-{uuid.uuid4().hex}"
TAG = uuid.uuid4().hex[:6]
LEAN_STREAM, NOACK_STREAM, NOAPI_STREAM = f"LEAN{TAG}", f"NOACK{TAG}", f"NOAPI{TAG}"
NOPURGE_STREAM, NOLIST_STREAM = f"NOPURGE{TAG}", f"NOLIST{TAG}"
LEDGER = "nats-spark-ledger"


def connector_permissions(stream: str, leave_out: str = "") -> dict[str, Any]:
    """The least a user needs to read a static group on `stream` (`nats_spark.permissions`, the
    list docs/security.md shows), except the subjects starting with `leave_out`."""
    allow = [subject for subject, _ in publish_allowed(stream, LEDGER)]
    if leave_out:
        allow = [subject for subject in allow if not subject.startswith(leave_out)]
    return {"publish": {"allow": allow}, "subscribe": {"allow": ["_INBOX.>"]}}


def start_server(directory: Path, config: dict[str, Any] | str, *args: str) -> EmbeddedServer:
    """A server with `config` (JSON is valid nats-server config) and extra arguments."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "server.conf"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return EmbeddedServer(config_file=path, extra_args=list(args)).start()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    server = start_server(tmp_path_factory.mktemp("tls"), tls_config(pki, verify=False))
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def mtls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    server = start_server(tmp_path_factory.mktemp("mtls"), tls_config(pki, verify=True))
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def nkey_user() -> nkeys.KeyPair:
    return new_nkey(nkeys.PREFIX_BYTE_USER)


@pytest.fixture(scope="module")
def auth_server(
    tmp_path_factory: pytest.TempPathFactory, nkey_user: nkeys.KeyPair
) -> Iterator[EmbeddedServer]:
    users = [
        {"user": "admin", "password": ADMIN_PASSWORD},
        {"user": "lean", "password": "lean-pw", "permissions": connector_permissions(LEAN_STREAM)},
        {
            "user": "noack",
            "password": "noack-pw",
            "permissions": connector_permissions(NOACK_STREAM, leave_out="$JS.ACK."),
        },
        {
            "user": "noapi",
            "password": "noapi-pw",
            "permissions": connector_permissions(
                NOAPI_STREAM, leave_out=f"$JS.API.CONSUMER.CREATE.{NOAPI_STREAM}."
            ),
        },
        {
            "user": "nopurge",
            "password": "nopurge-pw",
            "permissions": connector_permissions(NOPURGE_STREAM, leave_out="$JS.API.STREAM.PURGE."),
        },
        {
            "user": "nolist",
            "password": "nolist-pw",
            "permissions": connector_permissions(NOLIST_STREAM, leave_out="$JS.API.CONSUMER.LIST."),
        },
        {"nkey": public(nkey_user)},
    ]
    server = start_server(tmp_path_factory.mktemp("auth"), {"authorization": {"users": users}})
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    server = start_server(tmp_path_factory.mktemp("token"), "", "--auth", TOKEN)
    yield server
    server.cleanup()


def close(client: Blocking[NatsClient]) -> None:
    run_sync(client.target.close())


def source_settings(**options: str) -> ConnectionSettings:
    """Connection settings as the source maps its options (proves the option names work)."""
    return parse_options({"stream": "S", "group": "g", **options}).connection


# TLS


@pytest.mark.parametrize(
    "url", ["nats://127.0.0.1:{port}", "tls://127.0.0.1:{port}", "tls://localhost:{port}"]
)
def test_tls_verifies_the_server_with_the_test_ca(
    tls_server: EmbeddedServer, pki: Pki, url: str
) -> None:
    servers = url.format(port=tls_server.port)
    assert_works(source_settings(servers=servers, tlsCaCert=str(pki.ca_cert)))


@pytest.mark.parametrize(
    "url, ca",
    [
        ("tls://127.0.0.1:{port}", None),  # system CAs only
        ("nats://127.0.0.1:{port}", None),  # the server asks for TLS, the client trusts none
        ("nats://127.0.0.1:{port}", "other"),  # a CA that did not sign the server's certificate
    ],
    ids=["system-cas", "no-ca", "other-ca"],
)
def test_tls_refuses_a_server_the_ca_did_not_sign(
    tls_server: EmbeddedServer, pki: Pki, url: str, ca: str | None
) -> None:
    options = {"servers": url.format(port=tls_server.port)}
    if ca:
        options["tlsCaCert"] = str(pki.other_ca_cert)
    message = refusal(source_settings(**options))
    assert "TLS failed" in message and "certificate verify failed" in message, message
    assert "tlsCaCert" in message


@pytest.mark.parametrize(
    "scheme, with_ca", [("tls", False), ("tls", True), ("nats", True)], ids=["url", "url-ca", "ca"]
)
def test_tls_never_downgrades_to_plaintext(
    pki: Pki, settings: ConnectionSettings, scheme: str, with_ca: bool
) -> None:
    """A tls:// URL or a TLS option against a server without TLS: refused, not plaintext."""
    plain = settings.servers[0].removeprefix("nats://")
    options = {"servers": f"{scheme}://{plain}"}
    if with_ca:
        options["tlsCaCert"] = str(pki.ca_cert)
    message = refusal(source_settings(**options))
    assert "TLS was asked for" in message and "offers no TLS" in message, message


def test_tls_files_that_are_not_pem_name_the_option(pki: Pki, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match=r"^tlsCaCert file .* holds no usable CA"):
        source_settings(servers="tls://127.0.0.1:1", tlsCaCert=str(junk))
    with pytest.raises(ConfigurationError, match=r"^tlsCert .* and tlsKey .* are not a PEM"):
        source_settings(
            servers="tls://127.0.0.1:1",
            tlsCaCert=str(pki.ca_cert),
            tlsCert=str(junk),
            tlsKey=str(pki.client_key),
        )


def test_mutual_tls(mtls_server: EmbeddedServer, pki: Pki) -> None:
    ca, cert, key = str(pki.ca_cert), str(pki.client_cert), str(pki.client_key)
    assert_works(source_settings(servers=mtls_server.url, tlsCaCert=ca, tlsCert=cert, tlsKey=key))
    message = refusal(source_settings(servers=mtls_server.url, tlsCaCert=ca))
    assert "TLS failed" in message and "requires a client certificate" in message, message
    assert "set tlsCert and tlsKey" in message


@pytest.mark.spark
def test_source_reads_static_group_through_mutual_tls(
    spark: Any, mtls_server: EmbeddedServer, pki: Pki, tmp_path: Path
) -> None:
    tls = {"tlsCaCert": str(pki.ca_cert), "tlsCert": str(pki.client_cert)}
    tls["tlsKey"] = str(pki.client_key)
    admin = open_blocking(source_settings(servers=mtls_server.url, **tls))
    try:
        stream = f"TLS{TAG}"
        static_group(admin, stream, "g", ["m1", "m2"], partitions=4)
        publish(admin, stream, 300)
        _, error = run_query(source(spark, mtls_server.url, stream, "g", **tls), tmp_path)
        assert error is None
        assert_exactly_once(payloads(spark, str(tmp_path / "out")), 300)
        assert settled(admin, stream)
    finally:
        close(admin)


# Authentication: user/password and token are covered in test_connection.py; nkeys and creds here.


def test_nkey_seed_file(auth_server: EmbeddedServer, nkey_user: nkeys.KeyPair, tmp_path: Path):
    seed = tmp_path / "user.nk"
    seed.write_bytes(nkey_user.seed)
    assert_works(source_settings(servers=auth_server.url, nkeySeed=str(seed)))
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(new_nkey(nkeys.PREFIX_BYTE_USER).seed)
    message = refusal(source_settings(servers=auth_server.url, nkeySeed=str(stranger)))
    assert "refused the credentials" in message
    assert nkey_user.seed.decode() not in message


def test_creds_file_in_operator_mode(tmp_path: Path) -> None:
    setup = operator_setup(tmp_path)
    server = start_server(tmp_path / "server", setup.config)
    try:
        assert_works(source_settings(servers=server.url, creds=str(setup.creds)))
        # A user signed by an account the server does not know.
        unknown = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
        other = creds_file(tmp_path / "other.creds", unknown, new_nkey(nkeys.PREFIX_BYTE_USER))
        message = refusal(source_settings(servers=server.url, creds=str(other)))
        assert "refused the credentials" in message
    finally:
        server.cleanup()


# Permissions


def violations(server: EmbeddedServer, user: str) -> list[str]:
    """Permission violations the server logged for `user` (nats-server 2.11 names the user as
    `User "name"`, later ones in the client's `.../user:name"`)."""
    lines = server.log_file.read_text(errors="replace").splitlines()
    named = (f'/user:{user}"', f'User "{user}"')
    return [line for line in lines if "Violation" in line and any(n in line for n in named)]


@pytest.mark.spark
def test_least_privilege_user_reads_end_to_end(
    spark: Any, auth_server: EmbeddedServer, tmp_path: Path
) -> None:
    admin = open_blocking(ConnectionSettings((auth_server.url,), "admin", ADMIN_PASSWORD))
    try:
        # 8 partitions: planning lists the consumers (`CONSUMER.LIST`), which the list allows
        static_group(admin, LEAN_STREAM, "g", ["m1", "m2"], partitions=LIST_FROM)
        publish(admin, LEAN_STREAM, 200)
        df = source(spark, auth_server.url, LEAN_STREAM, "g", user="lean", password="lean-pw")
        assert run_query(df, tmp_path)[1] is None
        publish(admin, LEAN_STREAM, 100, start=200)
        assert run_query(df, tmp_path)[1] is None  # a restart: reads the ledger and pointer
        assert_exactly_once(payloads(spark, str(tmp_path / "out")), 300)
        assert settled(admin, LEAN_STREAM)
    finally:
        close(admin)
    assert violations(auth_server, "lean") == []


def test_a_user_who_may_not_list_consumers_plans_with_a_request_each(
    auth_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Permissions granted before planning listed consumers: the listing is refused once, said
    in a warning naming the subject, and planning asks each consumer from then on."""
    admin = open_blocking(ConnectionSettings((auth_server.url,), "admin", ADMIN_PASSWORD))
    options = {"servers": auth_server.url, "stream": NOLIST_STREAM, "group": "g"}
    reader = BatchCoordinator(parse_options({**options, "user": "nolist", "password": "nolist-pw"}))
    try:
        static_group(admin, NOLIST_STREAM, "g", ["m1", "m2"], partitions=LIST_FROM)
        publish(admin, NOLIST_STREAM, 80)
        with caplog.at_level(logging.WARNING):
            start = run_sync(reader.initial_offset())
            began = time.monotonic()
            end = run_sync(reader.latest_offset(start, None))
            assert time.monotonic() - began < 4  # the refused listing not waited for
            assert sum(plan.limit for plan in end.slots.values()) == 80
            wait_until(lambda: NOLIST_STREAM in reader.listing.allowed, 30, "the refusal")
            assert reader.listing.allowed == {NOLIST_STREAM: False}
            run_sync(reader.latest_offset(end, None))  # planned again: not listed again
    finally:
        run_sync(reader.close())
        close(admin)
    listing = f"$JS.API.CONSUMER.LIST.{NOLIST_STREAM}"
    warned = [r.getMessage() for r in caplog.records if listing in r.getMessage()]
    assert len(warned) == 1 and f"allow {listing}" in warned[0], warned
    assert [line for line in violations(auth_server, "nolist") if listing in line] != []
    assert all(listing in line for line in violations(auth_server, "nolist"))


def test_a_refused_request_fails_as_soon_as_the_server_refuses_it(
    auth_server: EmbeddedServer,
) -> None:
    """nats-server answers a request the user may not publish with an asynchronous permission
    violation only: the request fails with it, naming the subject and the fix, instead of
    waiting out its 5 s timeout (a planning that met one stood still that long)."""
    nolist = open_blocking(ConnectionSettings((auth_server.url,), "nolist", "nolist-pw"))
    try:
        began = time.monotonic()
        with pytest.raises(PermissionDenied) as refused:
            Blocking(nolist.api).consumer_infos(NOLIST_STREAM)
        took = time.monotonic() - began
        with contextlib.suppress(NotFound):  # an allowed request still answers
            Blocking(nolist.api).stream_info(NOLIST_STREAM)
    finally:
        close(nolist)
    assert took < 1, took
    listing = f"$JS.API.CONSUMER.LIST.{NOLIST_STREAM}"
    assert str(refused.value).startswith(f"permission denied to publish {listing}; allow")


def test_a_refused_ledger_write_fails_as_soon_as_the_server_refuses_it(
    auth_server: EmbeddedServer,
) -> None:
    """The ledger's KV calls are plain requests of their own (`RoutedRequests`): one the user
    may not publish fails with the refusal, naming the subject and the fix, instead of waiting
    out its timeout and then a minute of retries; an allowed one on the same connection still
    answers."""
    nolist = open_blocking(ConnectionSettings((auth_server.url,), "nolist", "nolist-pw"))
    refused_bucket = LedgerBucket(nolist.target, f"NOTGRANTED{TAG}")
    try:
        began = time.monotonic()
        with pytest.raises(PermissionDenied) as refused:
            run_sync(refused_bucket.put("k", b"v"))
        took = time.monotonic() - began
        with pytest.raises(PermissionDenied):
            run_sync(refused_bucket.get("k"))
        with contextlib.suppress(KeyNotFoundError):  # the granted bucket answers
            run_sync(LedgerBucket(nolist.target, LEDGER).get(f"none{TAG}"))
    finally:
        close(nolist)
    assert took < 1, took
    subject = f"$KV.NOTGRANTED{TAG}.k"
    assert str(refused.value).startswith(f"permission denied to publish {subject}; allow")


def test_refused_acks_are_known_when_publish_acks_returns(auth_server: EmbeddedServer) -> None:
    """The commit path decides from `denied` right after `publish_acks`: every refusal must be
    in by then (nats-py's own flush can overtake queued publishes)."""
    noack = open_blocking(ConnectionSettings((auth_server.url,), "noack", "noack-pw"))
    try:
        for round_ in range(20):
            replies = [f"$JS.ACK.{NOACK_STREAM}.g-m1.1.{n}.{n}.1.0".encode() for n in range(1, 51)]
            before = len(noack.denied)
            assert run_sync(publish_acks(noack.nc, replies)) == 50
            refused = len(noack.denied) - before
            assert refused == 50, f"round {round_}: {refused} of 50 refusals seen on return"
    finally:
        close(noack)


@pytest.mark.spark
def test_user_without_ack_permission(
    spark: Any, auth_server: EmbeddedServer, tmp_path: Path
) -> None:
    admin = open_blocking(ConnectionSettings((auth_server.url,), "admin", ADMIN_PASSWORD))
    try:
        static_group(admin, NOACK_STREAM, "g", ["m1"], partitions=2)
        publish(admin, NOACK_STREAM, 50)
        df = source(spark, auth_server.url, NOACK_STREAM, "g", user="noack", password="noack-pw")
        earlier = len(violations(auth_server, "noack"))  # other tests' refusals of this user
        _, error = run_query(df, tmp_path)
        states = member_states(admin, NOACK_STREAM, "g")
    finally:
        close(admin)
    denied = violations(auth_server, "noack")[earlier:]  # the query's own acks, refused
    assert denied and all(f'"$JS.ACK.{NOACK_STREAM}.g-' in line for line in denied), denied
    # Each row was emitted, but the server dropped every ack: the query must say so rather than
    # count the batch as acked with its messages pending for good.
    assert error is not None, f"denied acks went unnoticed: {states}"
    message = str(error)
    assert f"allow the user to publish to $JS.ACK.{NOACK_STREAM}.>" in message, message
    assert "python -m nats_spark.permissions <stream>" in message, message


@pytest.mark.spark
def test_user_without_consumer_create_permission(
    spark: Any, auth_server: EmbeddedServer, tmp_path: Path
) -> None:
    admin = open_blocking(ConnectionSettings((auth_server.url,), "admin", ADMIN_PASSWORD))
    try:
        static_group(admin, NOAPI_STREAM, "g", ["m1"], partitions=2)
        publish(admin, NOAPI_STREAM, 10)
        message = failure_text(
            lambda: source(
                spark, auth_server.url, NOAPI_STREAM, "g", user="noapi", password="noapi-pw"
            ),
            tmp_path,
        )
        assert Blocking(admin.api).consumer_names(NOAPI_STREAM) == []
    finally:
        close(admin)
    line = message.splitlines()[0]  # the connector's line comes first
    assert "nats_spark." in line, message
    create = f"$JS.API.CONSUMER.CREATE.{NOAPI_STREAM}.g-partition-0"
    assert f"permission denied to publish {create}; allow the user to publish to it" in line, line
    assert "python -m nats_spark.permissions <stream>" in line, line


@pytest.mark.spark
def test_user_without_ledger_purge_permission(
    spark: Any, auth_server: EmbeddedServer, tmp_path: Path
) -> None:
    """Settled ledger entries are removed by a stream purge: a user who may not purge the ledger
    bucket's stream hears so in one line when the query starts, before anything is taken."""
    admin = open_blocking(ConnectionSettings((auth_server.url,), "admin", ADMIN_PASSWORD))
    try:
        static_group(admin, NOPURGE_STREAM, "g", ["m1"], partitions=2)
        publish(admin, NOPURGE_STREAM, 10)
        message = failure_text(
            lambda: source(
                spark, auth_server.url, NOPURGE_STREAM, "g", user="nopurge", password="nopurge-pw"
            ),
            tmp_path,
        )
        assert Blocking(admin.api).consumer_names(NOPURGE_STREAM) == []
    finally:
        close(admin)
    line = message.splitlines()[0]
    assert f"$JS.API.STREAM.PURGE.KV_{LEDGER}" in line and "permission" in line, line


def test_user_who_may_not_remove_the_ledgers_max_age(tmp_path: Path) -> None:
    """A ledger bucket made with a max age (by the previous release: 7 days) loses it when a
    driver opens it; a user without `$JS.API.STREAM.UPDATE.KV_<bucket>` (docs/security.md's
    list) is refused in one line naming the bucket, its max age and the fix, before any
    consumer is made or message taken."""
    stream = f"AGED{TAG}"
    users = [
        {"user": "admin", "password": ADMIN_PASSWORD},
        {"user": "lean", "password": "lean-pw", "permissions": connector_permissions(stream)},
    ]
    server = start_server(tmp_path / "server", {"authorization": {"users": users}})
    admin = open_blocking(ConnectionSettings((server.url,), "admin", ADMIN_PASSWORD))
    options = {"servers": server.url, "stream": stream, "group": "g"}
    reader = BatchCoordinator(parse_options({**options, "user": "lean", "password": "lean-pw"}))
    try:
        static_group(admin, stream, "g", ["m1"], partitions=2)
        publish(admin, stream, 10)
        run_sync(admin.js.create_key_value(bucket=LEDGER, history=1, ttl=7 * 24 * 3600))
        with pytest.raises(ConfigurationError) as refused:
            run_sync(reader.initial_offset())
        assert Blocking(admin.api).consumer_names(stream) == []
        assert run_sync(admin.api.stream_info(f"KV_{LEDGER}")).max_age == 7 * 24 * 3600
    finally:
        run_sync(reader.close())
        close(admin)
        server.cleanup()
    line = str(refused.value)
    assert "\n" not in line
    assert f"bucket '{LEDGER}' has a max age of 604800 s" in line, line
    assert f"$JS.API.STREAM.UPDATE.KV_{LEDGER}" in line, line
    assert line.endswith(f"nats stream edit KV_{LEDGER} --max-age=0"), line


# Secrets


WRONG_SECRET = f"wrong-{uuid.uuid4().hex}"

# Imported by every Python process of the job (driver, source runner, executors) through
# PYTHONPATH: their connector and nats-py logs, at DEBUG, each into a file of its own.
SITE_CUSTOMIZE = """
import logging, os
_path = os.path.join(os.environ["NATS_SPARK_TEST_LOGS"], f"{os.getpid()}.log")
_handler = logging.FileHandler(_path)
_handler.setFormatter(logging.Formatter("%(process)d %(levelname)s %(name)s: %(message)s"))
for _name in ("nats_spark", "nats"):
    logging.getLogger(_name).setLevel(logging.DEBUG)
    logging.getLogger(_name).addHandler(_handler)
"""


def start_job(url: str, stream: str, auth: dict[str, str], directory: Path) -> subprocess.Popen:
    """`python -m nats_spark.job` (availableNow) with DEBUG logs of all its Python processes."""
    logs, site = directory / "logs", directory / "site"
    logs.mkdir(parents=True)
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE_CUSTOMIZE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "NATS_SPARK_TEST_LOGS": str(logs),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    args = [sys.executable, "-m", "nats_spark.job", "--servers", url, "--stream", stream]
    args += ["--group", "g", "--output", str(directory / "out")]
    args += ["--checkpoint", str(directory / "cp"), "--trigger", "availableNow"]
    args += ["--master", "local[2]"]
    for name, value in auth.items():
        args += ["--option", f"{name}={value}"]
    with (directory / "job.out").open("wb") as output:  # in a session of its own: see kill_job
        return subprocess.Popen(
            args, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def kill_job(job: subprocess.Popen) -> None:
    """SIGKILL the job's process group: the job and the JVM it started."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)


def files_text(directory: Path) -> str:
    """Every file under `directory`, decoded leniently (checkpoint files are mostly text)."""
    return "\n".join(
        f"{path}: {path.read_bytes().decode(errors='replace')}"
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    )


def record_ledger_writes(client: Blocking[NatsClient]) -> list[tuple[str, bytes]]:
    """Every write to the ledger bucket from now on, as (key, value): entries settle and are
    purged once their batch commits, so the bucket itself may be empty when a query ends."""
    writes: list[tuple[str, bytes]] = []

    async def record(msg: Any) -> None:
        writes.append((msg.subject.removeprefix(f"$KV.{LEDGER}."), msg.data))

    run_sync(client.target.nc.subscribe(f"$KV.{LEDGER}.>", cb=record))
    return writes


def ledger_text(client: Blocking[NatsClient], writes: list[tuple[str, bytes]]) -> str:
    """The recorded ledger writes, with chunks decompressed (numbers only: the heads hold the
    ack subjects' prefix)."""
    run_sync(client.target.nc.flush())
    lines = []
    for key, value in writes:
        chunk = len(key.split(".")) == 5 and value  # <lineage>.<gen>.<slot>.<attempt>.<n>
        lines.append(f"{key}={decode_chunk(value, b'') if chunk else value.decode()}")
    return "\n".join(lines)


def failure_text(load: Callable[[], Any], directory: Path) -> str:
    """Everything the failure of loading and running `load()`'s rows says: message and stack
    trace (load() checks the target on the server: what it can check fails there)."""
    try:
        df = load()
    except Exception as refused:
        error: Any = refused
    else:
        _, error = run_query(df, directory)
        assert error is not None, "the query did not fail"
    return f"{error}\n{getattr(error, '_stackTrace', '')}"


@dataclass
class SecretJob:
    """A kind of secret's job (`start_job`) on its server, with the ledger's writes there
    recorded from before it started."""

    server: EmbeddedServer
    secret: str
    auth: dict[str, str]
    admin: Blocking[NatsClient]
    writes: list[tuple[str, bytes]]
    process: subprocess.Popen
    directory: Path


@pytest.fixture(scope="module")
def secret_jobs(
    auth_server: EmbeddedServer,
    token_server: EmbeddedServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, SecretJob]]:
    """Both kinds' jobs, started together: each is a JVM start and a batch (~40 s), so the
    second kind's test finds its job done while the first waited for its own."""
    kinds = {
        "password": (auth_server, ADMIN_PASSWORD, {"user": "admin", "password": ADMIN_PASSWORD}),
        "token": (token_server, TOKEN, {"token": TOKEN}),
    }
    jobs: dict[str, SecretJob] = {}
    try:
        for kind, (server, secret, auth) in kinds.items():
            admin = open_blocking(source_settings(servers=server.url, **auth))
            for name in (f"SEC{kind[0]}{TAG}", f"JOB{kind[0]}{TAG}"):
                static_group(admin, name, "g", ["m1", "m2"], partitions=4)
                publish(admin, name, 100)
            writes = record_ledger_writes(admin)
            directory = tmp_path_factory.mktemp(f"job-{kind}")
            process = start_job(server.url, f"JOB{kind[0]}{TAG}", auth, directory)
            jobs[kind] = SecretJob(server, secret, auth, admin, writes, process, directory)
        yield jobs
    finally:
        for job in jobs.values():
            kill_job(job.process)
            close(job.admin)


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["password", "token"])
def test_secrets_never_leak(
    kind: str,
    spark: Any,
    secret_jobs: dict[str, SecretJob],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = secret_jobs[kind]
    server, secret, auth = job.server, job.secret, job.auth
    wrong = {**auth, kind: WRONG_SECRET}
    caplog.set_level(logging.DEBUG, logger="nats_spark")
    stream = f"SEC{kind[0]}{TAG}"
    admin = open_blocking(source_settings(servers=server.url, **auth))  # a connect under caplog
    try:
        refused = refusal(source_settings(servers=server.url, **wrong))
        assert "refused the credentials" in refused
        failed = failure_text(
            lambda: source(spark, server.url, stream, "g", **wrong), tmp_path / "bad"
        )
        assert "refused the credentials" in failed

        query, error = run_query(source(spark, server.url, stream, "g", **auth), tmp_path)
        assert error is None
        progress = json.dumps([query.lastProgress, *query.recentProgress], default=str)
        query.explain(extended=True)
        try:
            assert job.process.wait(180) == 0, (job.directory / "job.out").read_text()
        finally:
            kill_job(job.process)
        assert_exactly_once(payloads(spark, str(tmp_path / "out")), 100)
        assert_exactly_once(payloads(spark, str(job.directory / "out")), 100)
        ledger = ledger_text(job.admin, job.writes)
    finally:
        close(admin)
    job_logs = {path.name: path.read_text() for path in (job.directory / "logs").iterdir()}
    # The capture works: connector records from the job's driver and from its Spark workers.
    assert sum(1 for text in job_logs.values() if " nats_spark." in text) >= 2, job_logs
    places = {
        "connect error": refused,
        "query failure": failed,
        "caplog": caplog.text,
        "progress": progress,
        "explain": capsys.readouterr().out,
        "ledger": ledger,
        "checkpoints": files_text(tmp_path / "cp") + files_text(job.directory / "cp"),
        "job output": (job.directory / "job.out").read_text(errors="replace"),
        "job logs": "\n".join(job_logs.values()),
    }
    assert places["ledger"] and places["checkpoints"] and places["progress"]
    leaks = [where for where, text in places.items() if secret in text or WRONG_SECRET in text]
    assert leaks == [], f"{kind} found in {leaks}"
