"""Shared fixtures: a real NATS server (embedded binary, `NATS_URL`, or a Docker container)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings, parse_servers
from nats_spark.loop import Blocking, run_sync
from nats_spark.server import EmbeddedServer

# Every JVM the suite starts (sessions, spark-submit and job drivers, a standalone cluster): the
# client JIT only and one GC thread. Tests run small batches on two shared cores, where C2's
# compiler threads cost more than they give back (a Spark test module ran 23% faster).
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CLASS_ARCHIVE_SCRIPT = Path(__file__).parent / "spark_class_archive.py"
_QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"  # a JVM of other classes says so on stdout


def pytest_configure(config: pytest.Config) -> None:
    """Set the JVMs' options once, before xdist's workers start (they inherit them): with a
    class archive of Spark's classes when one can be made (`spark_class_archive.py`), which
    cuts a third of every JVM start's CPU. Not for the unit lane, which starts no JVM."""
    if "JDK_JAVA_OPTIONS" in os.environ:  # the caller's, or set by the controller for a worker
        return
    options = JVM_OPTIONS
    if config.getoption("markexpr") != "unit":
        archive = spark_class_archive()
        if archive is not None:
            options += f" -XX:SharedArchiveFile={archive} {_QUIET_CDS}"
    os.environ["JDK_JAVA_OPTIONS"] = options


def spark_class_archive() -> Path | None:
    """The class archive of this virtualenv's pyspark, made on first use (about 30 CPU-s);
    None when it cannot be. A JVM falls back to loading classes when the archive does not match
    it; a partly written one would crash it, so one is published only once written whole."""
    import pyspark
    from spark_helpers import spark_bin, spark_env

    archive = Path(sys.prefix) / f"spark-classes-{pyspark.__version__}.jsa"
    if archive.exists():
        return archive
    if " " in str(archive):  # JDK_JAVA_OPTIONS splits on spaces
        return None
    part = archive.with_name(f"{archive.name}.{os.getpid()}.part")
    env = spark_env(JDK_JAVA_OPTIONS=JVM_OPTIONS)
    command = [spark_bin("spark-submit"), "--master", "local[2]"]
    command += ["--driver-java-options", f"-XX:ArchiveClassesAtExit={part} {_QUIET_CDS}"]
    try:
        made = subprocess.run(
            [*command, str(CLASS_ARCHIVE_SCRIPT)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=300,
        )
        if made.returncode == 0 and part.stat().st_size > 0:
            os.replace(part, archive)
            return archive
    except (OSError, subprocess.TimeoutExpired):
        pass
    part.unlink(missing_ok=True)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    longest_modules_first(items)
    only_on_the_sparks_named(config, items)


# The modules that take longest in the two-worker lanes (make test), longest first (by the
# slowest tests of recent runs): xdist gives a worker a whole module at a time, in collection
# order with the Makefile's --no-loadscope-reorder (by default it orders them by their number of
# tests, which put these few-but-long ones last, where one ran alone while the other worker
# idled). A worker whose module has at most two tests left takes the next one as well: the
# driver kills (one or two tests) take the third module at the start, the sink's (one test in
# the 4.0 lane, where test_faults.py is the other worker's). The rest follow in their own order.
LONGEST_MODULES = (
    "tests/spark/group_source/test_driver_kills.py",
    "tests/spark/group_source/test_faults.py",
    "tests/spark/sink/test_sink.py",
    "tests/test_chaos.py",
    "tests/test_job.py",
    "tests/spark/group_source/test_available_now.py",
    "tests/test_readme.py",
    "tests/simulation/test_exploration.py",
    "tests/spark/group_source/test_source_groups.py",
    "tests/spark/group_source/test_source_recovery.py",
    "tests/test_deployments_domain.py",
    "tests/test_install.py",
    "tests/test_demo.py",
    "tests/test_security.py",
    "tests/test_notebooks.py",
    "tests/spark/group_source/test_source_consumers.py",
    "tests/spark/group_source/test_source_acks.py",
    "tests/test_connect.py",
    "tests/test_cluster.py",
)


def longest_modules_first(items: list[pytest.Item]) -> None:
    rank = {module: place for place, module in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def only_on_the_sparks_named(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`compat("4.0")`: on the older Sparks, only on those named. Where two of them run the same
    code of ours and Spark's (4.0 and 4.1 share the call order, the reader API and the planning
    runner; the sink's writer and the notebooks differ), the second run adds time, not a case."""
    import pyspark

    running = ".".join(pyspark.__version__.split(".")[:2])
    if running not in OLDER_SPARKS:
        return
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("compat")
        only = marker.args if marker is not None else ()
        (dropped if only and running not in only else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


OLDER_SPARKS = ("4.0", "4.1")  # the Makefile's COMPAT_SPARKS


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
def short_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process, a task attempt that finds another's open entry stands by for a tenth of
    a second of standing still (not `HOLD_QUIET`) before it takes the entry over."""
    from nats_spark.spark.group_source import ledger_protocol

    monkeypatch.setattr(ledger_protocol, "HOLD_QUIET", 0.1)
    monkeypatch.setattr(ledger_protocol, "HOLD_RENEWAL", 0.03)
    monkeypatch.setattr(ledger_protocol, "HOLD_POLL", (0.01, 0.02))


@pytest.fixture
def unique() -> str:
    """A short unique token for stream and consumer names, so tests never collide."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One local Spark session per test module (`SPARK_MASTER` in the module overrides local[2])."""
    from nats_spark.spark.local_session import local_session

    master = getattr(request.module, "SPARK_MASTER", "local[2]")
    session = local_session(f"nats-spark-{request.module.__name__}", master)
    yield session
    session.stop()


@pytest.fixture
def published_acks(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The ack subjects the ledger's entries publish (tasks, the driver at stop), kept here
    instead of sent: for unit tests, which have no NATS connection."""
    from nats_spark.spark.group_source import ledger_protocol

    published: list[bytes] = []

    async def send(nc: object, commands: list[bytes], count: int) -> int:
        lines = b"".join(commands).split(b"\r\n")  # `PUB <subject> 4`, then `+ACK`
        assert lines[1::2] == [b"+ACK"] * count, lines[1::2]
        published.extend(line.split(b" ")[1] for line in lines[0::2] if line)
        return count

    monkeypatch.setattr(ledger_protocol, "send_acks", send)
    return published
