"""Shared fixtures: a real NATS server (embedded binary, `NATS_URL`, or a Docker container)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings, parse_servers
from nats_spark.loop import Blocking, run_sync
from nats_spark.server import EmbeddedServer

# Every JVM the suite starts (sessions, spark-submit and job drivers, a standalone cluster): the
# client JIT only and one GC thread. Tests run small batches on two shared cores, where C2's
# compiler threads cost more than they give back (a Spark test module ran 23% faster).
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# The fast lane (`make check` runs `pytest -m unit`): tests marked `unit` need neither a NATS server
# nor Spark. These fixtures bring one up, so a unit test that asks for them fails at setup.
SERVER_OR_SPARK_FIXTURES = frozenset({"nats_url", "settings", "client", "spark"})


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("unit") is None:
        return
    wanted = sorted(SERVER_OR_SPARK_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if wanted:
        pytest.fail(
            f"{item.nodeid} is marked unit (the fast lane, no server or Spark) but uses the "
            f"fixture {', '.join(wanted)}: drop the unit mark or the fixture",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _unit_tests_start_no_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """A unit test that starts an EmbeddedServer itself fails with a line saying so."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return

    def refuse(self: EmbeddedServer, timeout: float = 20.0) -> EmbeddedServer:
        pytest.fail(
            f"{request.node.nodeid} is marked unit (the fast lane) but starts a nats-server: "
            "drop the unit mark",
            pytrace=False,
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EmbeddedServer, "start", refuse)
        yield


def _docker_url() -> Iterator[str]:
    try:
        import docker

        docker.from_env().ping()
    except Exception as error:  # no engine reachable: the binary path is the default anyway
        pytest.skip(f"no Docker engine reachable ({type(error).__name__})")
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    container = DockerContainer("nats:2.12-alpine").with_command("-js").with_exposed_ports(4222)
    with container:
        wait_for_logs(container, "Server is ready", timeout=30)
        host = container.get_container_host_ip()
        yield f"nats://{host}:{container.get_exposed_port(4222)}"


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """The test server: `NATS_URL`, a container if NATS_SPARK_DOCKER=1, else the embedded binary."""
    if os.environ.get("NATS_URL"):
        yield os.environ["NATS_URL"]
    elif os.environ.get("NATS_SPARK_DOCKER") == "1":
        yield from _docker_url()
    else:
        with EmbeddedServer() as server:
            yield server.url


@pytest.fixture(scope="session")
def settings(nats_url: str) -> ConnectionSettings:
    return ConnectionSettings(servers=parse_servers(nats_url), name="nats-spark-tests")


@pytest.fixture
def client(settings: ConnectionSettings) -> Iterator[Blocking[NatsClient]]:
    """A blocking client, closed after the test."""
    blocking = open_blocking(settings)
    yield blocking
    run_sync(blocking.target.close())


@pytest.fixture
def unique() -> str:
    """A short unique token for stream and consumer names, so tests never collide."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One local Spark session per test module (`SPARK_MASTER` in the module overrides local[2])."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    master = getattr(request.module, "SPARK_MASTER", "local[2]")
    session = (
        SparkSession.builder.master(master)
        .appName(f"nats-spark-{request.module.__name__}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def published_acks(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The ack subjects the ledger's entries publish (tasks, the driver at stop), kept here
    instead of sent: for unit tests, which have no NATS connection."""
    from nats_spark.spark.group_source import slot_history

    published: list[bytes] = []

    async def send(nc: object, commands: list[bytes], count: int) -> int:
        lines = b"".join(commands).split(b"\r\n")  # `PUB <subject> 4`, then `+ACK`
        assert lines[1::2] == [b"+ACK"] * count, lines[1::2]
        published.extend(line.split(b" ")[1] for line in lines[0::2] if line)
        return count

    monkeypatch.setattr(slot_history, "send_acks", send)
    return published
