"""Every page's Python as written: the ```python blocks of README.md and docs/*.md, taken from the
pages themselves, run in order (one namespace per page) against the test server, with only the
server URL, stream names (made unique) and work directories replaced, so the docs cannot drift
from the code. The blocks' `getOrCreate()` finds this module's Spark session."""

from __future__ import annotations

import contextlib
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types
from spark_helpers import ACKS_LAST_BATCH, REPO, SPARK_VERSION, wait_until

import pyspark_nats
import pyspark_nats_pcg
from nats_spark.cli import main as cli_main
from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings, parse_servers
from nats_spark.errors import ConfigurationError, NotFound
from nats_spark.loop import Blocking, run_sync
from nats_spark.pcg import partition_for
from nats_spark.server import find_server_binary
from nats_spark.spark.registration import register_formats

pytestmark = pytest.mark.spark

PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
# The names a page's blocks assign that the test decides: the server, streams, directories.
LOCAL_NAME = re.compile(r"^(NATS_URL|WORK_DIR|[A-Z_]*STREAM) = .*$", re.MULTILINE)
PAYMENTS = 30  # messages of the re-key example's existing header-keyed stream
CUSTOMERS = 5


def python_blocks(page: Path) -> list[str]:
    """The page's ```python blocks, in order."""
    text = page.read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def localized(code: str, values: dict[str, str]) -> str:
    """`code` with each assignment LOCAL_NAME matches set to its value in `values`."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"{name} = {values[name]!r}"

    return LOCAL_NAME.sub(value, code)


class Page:
    """A page's blocks run in one namespace; `names` holds the values given to LOCAL_NAME."""

    def __init__(self, page: Path, nats_url: str, unique: str, work_dir: Path) -> None:
        self.page = page
        self.blocks = python_blocks(page)
        self.names: dict[str, str] = {"NATS_URL": nats_url, "WORK_DIR": str(work_dir)}
        for block in self.blocks:
            for match in re.finditer(r'^([A-Z_]*STREAM) = "([^"]+)"', block, re.MULTILINE):
                self.names[match.group(1)] = f"{match.group(2)}_{unique}"
        self.namespace: dict[str, Any] = {"__name__": "__main__"}

    def run(self) -> None:
        for block in self.blocks:
            exec(compile(localized(block, self.names), str(self.page), "exec"), self.namespace)

    def streams(self) -> list[str]:
        return [value for name, value in self.names.items() if name.endswith("STREAM")]


@pytest.fixture
def page_runner(nats_url: str, unique: str, tmp_path: Path, client: Blocking[NatsClient]):
    """Makes a `Page`; deletes every stream its names give (and elastic groups' work queues)."""
    made: list[Page] = []

    def make(relative: str) -> Page:
        made.append(Page(REPO / relative, nats_url, unique, tmp_path))
        return made[-1]

    yield make
    for page in made:
        for stream in page.streams():
            with contextlib.suppress(NotFound):
                run_sync(client.target.api.delete_stream(stream))


@pytest.mark.unit
def test_every_page_with_python_is_run_here() -> None:
    with_python = {str(page.relative_to(REPO)) for page in PAGES if python_blocks(page)}
    assert with_python == {"README.md", "docs/groups-api.md", "docs/stream-reads.md"}, (
        "add a test for the new page"
    )


@pytest.mark.unit
def test_local_names_are_replaced_and_nothing_else() -> None:
    code = 'NATS_URL = "nats://h:4222"  # yours\nKEYED_STREAM = "K"\nGROUP = "g"\n'
    values = {"NATS_URL": "nats://127.0.0.1:9", "KEYED_STREAM": "K_1"}
    assert localized(code, values) == (
        "NATS_URL = 'nats://127.0.0.1:9'\nKEYED_STREAM = 'K_1'\nGROUP = \"g\"\n"
    )


def _stored_payments(client: Blocking[NatsClient], stream: str) -> Iterator[tuple[str, bytes]]:
    """(subject, data) of every message of `stream`, in stream order."""
    info = run_sync(client.target.api.stream_info(stream))
    for seq in range(1, info["state"]["last_seq"] + 1):
        message = run_sync(client.target.js.get_msg(stream, seq))
        yield message.subject, message.data


def test_readme_runs_as_written(
    spark: Any, client: Blocking[NatsClient], page_runner: Any, capsys: Any
) -> None:
    readme = page_runner("README.md")
    readme.run()
    readme.run()  # a second run of the quick start starts over, as the README says
    shown = capsys.readouterr().out
    ns = readme.namespace
    assert ns["spark"] is spark  # the blocks' getOrCreate() found the session

    # Read a group: the quick start's 100 messages, over the three members.
    rows = ns["rows"].select("data", "member").collect()
    assert sorted(int(row.data.decode().split()[1]) for row in rows) == list(range(100))
    assert {row.member for row in rows} == {"m1", "m2", "m3"}
    assert "|partition|member|count|" in shown, shown
    # Guarantees and offsets: the server's lag after the run.
    assert ns["lag"]["total"]["pending"] == 0
    if ACKS_LAST_BATCH:
        assert ns["lag"]["total"] == {"pending": 0, "ackPending": 0}
    # Read a whole stream: sequences 1 to 50; Write: the rows back into the stream.
    assert ns["first_fifty"].count() == 50
    orders = run_sync(client.target.api.stream_info(ns["STREAM"]))
    assert orders["state"]["messages"] == 200


def test_rekey_example_runs_as_written(
    spark: Any, client: Blocking[NatsClient], page_runner: Any
) -> None:
    page = page_runner("docs/stream-reads.md")
    payments = page.names["PAYMENTS_STREAM"]  # the existing stream the example starts from
    run_sync(client.target.api.create_stream({"name": payments, "subjects": ["payments.*"]}))
    for n in range(PAYMENTS):
        customer = f"c{n % CUSTOMERS}"
        headers = {"Customer-Id": customer}
        run_sync(
            client.target.js.publish("payments.eu", f"{customer}:{n}".encode(), headers=headers)
        )

    page.run()
    assert page.namespace["spark"] is spark
    # Each customer's messages in its partition, in order.
    keyed = list(_stored_payments(client, page.names["KEYED_STREAM"]))
    assert len(keyed) == PAYMENTS
    for subject, data in keyed:
        partition, _, customer = subject.split(".")
        assert data.decode().startswith(f"{customer}:")
        assert int(partition) == partition_for(customer, 8), subject
    assert [data for _, data in keyed] == [
        f"c{n % CUSTOMERS}:{n}".encode() for n in range(PAYMENTS)
    ]


def test_groups_api_example_runs_as_written(spark: Any, page_runner: Any) -> None:
    page = page_runner("docs/groups-api.md")
    page.run()
    ns = page.namespace
    served = ns["served"]
    assert len(served) == len(ns["mine"]) > 0
    assert {message.partition for message in served} <= {0, 1}
    by_spark = spark.table("shipments_spark").select("data", "partition", "member").collect()
    assert {row.partition for row in by_spark} <= {2, 3}
    assert {row.member for row in by_spark} == {"spark"}
    everything = sorted([m.data for m in served] + [bytes(row.data) for row in by_spark])
    assert everything == sorted(f"shipment {n}".encode() for n in range(40))


@pytest.mark.skipif(
    SPARK_VERSION < (4, 2), reason="Spark 4.0/4.1 keep a session's first registration of a name"
)
def test_register_formats_names_the_python_of_workers_that_cannot_load_it(spark, tmp_path) -> None:
    # A Python without site-packages (so without nats-spark) and without the working directory
    # on sys.path (so not the checkout), as `python3` from PATH is outside the virtualenv.
    bare = tmp_path / "python-without-nats-spark"
    bare.write_text(f'#!/bin/sh\nPYTHONSAFEPATH=1 exec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    context = spark.sparkContext
    usual = context.pythonExec  # what registrations made from now on run their workers with
    context.pythonExec = str(bare)
    try:
        with pytest.raises(ConfigurationError) as refused:
            register_formats(spark)
    finally:
        context.pythonExec = usual
        register_formats(spark)  # the formats as before, for the rest of the session
    message = str(refused.value)
    assert "\n" not in message
    assert "No module named 'nats_spark'" in message, message
    assert f"they run {bare}" in message and "set PYSPARK_PYTHON" in message, message
    assert sys.executable in message, message


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.unit
@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_links_between_pages_resolve(page: Path) -> None:
    text = re.sub(r"^```.*?^```$", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # not a page of the repository
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to {target}: no such file"
        if fragment and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", linked.read_text(encoding="utf-8"), re.MULTILINE)
            anchors = {anchor(heading) for heading in headings}
            assert fragment in anchors, f"{page.name} links to {target}: no such heading"


# The README's schema table's types, as Spark's types.
SCHEMA_TYPES = {
    "string": types.StringType(),
    "binary": types.BinaryType(),
    "int": types.IntegerType(),
    "long": types.LongType(),
    "timestamp": types.TimestampType(),
    "map<string, array<string>>": types.MapType(
        types.StringType(), types.ArrayType(types.StringType())
    ),
}


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in `text` but header and rule rows."""
    rows = [
        line.strip().strip("|").split("|") for line in text.splitlines() if line.startswith("| ")
    ]
    return [
        [cell.strip() for cell in row]
        for row in rows
        if row[0].strip() not in ("option", "column", "")
    ]


def section(page: Path, heading: str) -> str:
    """The text of `page` from the heading that starts with `heading` to the next of its level."""
    text = page.read_text(encoding="utf-8")
    start = re.search(rf"^(#+) {re.escape(heading)}.*$", text, re.MULTILINE)
    assert start, f"{page.name} has no heading {heading!r}"
    level = start.group(1)
    end = re.compile(rf"^{level} ", re.MULTILINE).search(text, start.end())
    return text[start.end() : end.start() if end else len(text)]


def documented(text: str, connection: set[str]) -> dict[str, str]:
    """Option name -> default cell of the option tables in `text`; a row naming the connection
    options stands for all of them."""
    found: dict[str, str] = {}
    for option, default, *_ in table_rows(text):
        if option.startswith("[connection options]"):
            found.update(dict.fromkeys(connection, ""))
        for name in re.findall(r"`(\w+)`", option):
            found[name] = default
    return found


def known_options(make: Any) -> set[str]:
    """The options a format knows, as its error for an unknown one lists them."""
    with pytest.raises(ConfigurationError) as refused:
        make({"notAnOptionAnywhere": "1"})
    message = str(refused.value)
    assert "known options: " in message, message
    return set(message.split("known options: ")[1].split(", "))


def readme_schema() -> types.StructType:
    rows = table_rows(section(REPO / "README.md", "Schema"))
    return types.StructType(
        [types.StructField(name.strip("`"), SCHEMA_TYPES[kind]) for name, kind, *_ in rows]
    )


@pytest.mark.unit
def test_options_page_lists_every_option_of_every_format() -> None:
    """docs/options.md names every option each format knows (through the entry points Spark
    loads) and no other; the README's schema table is the schema the formats accept."""
    options_page = REPO / "docs" / "options.md"
    connection = set(documented(section(options_page, "Connection"), set()))
    knows = {
        "`nats-pcg`": known_options(pyspark_nats_pcg.DefaultSource),
        "`nats` reads": known_options(
            lambda raw: pyspark_nats.DefaultSource(raw).reader(readme_schema())
        ),
        "`nats` writes": known_options(
            lambda raw: pyspark_nats.DefaultSource(raw).writer(readme_schema(), False)
        ),
    }
    assert connection <= knows["`nats` writes"], "the connection options are every format's"
    for heading, known in knows.items():
        listed = set(documented(section(options_page, heading), connection))
        if heading == "`nats-pcg`":
            listed |= connection
        assert listed == known, (
            f"docs/options.md {heading}: not known {sorted(listed - known)}, "
            f"missing {sorted(known - listed)}"
        )


@pytest.mark.unit
def test_readme_options_agree_with_the_options_page() -> None:
    """The README's options are `nats-pcg` options, with the defaults docs/options.md gives."""
    options_page = REPO / "docs" / "options.md"
    connection = documented(section(options_page, "Connection"), set())
    group_source = {**connection, **documented(section(options_page, "`nats-pcg`"), set())}
    for option, default, *_ in table_rows(section(REPO / "README.md", "Options")):
        names = re.findall(r"`(\w+)`", option)
        assert names and set(names) <= set(group_source), f"README option row {option}"
        if len(names) == 1:
            assert default == group_source[names[0]], f"README's default of {names[0]}: {default}"


def shell_lines(page: Path, program: str) -> list[list[str]]:
    """The lines of the page's plain ``` blocks that run `program`, split as a shell would."""
    lines, fence = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:]
        elif fence == "":
            lines.append(line.split("  #")[0])
    return [shlex.split(line) for line in lines if Path(line.split(" ")[0]).name == program]


def test_readme_server_command_starts_a_jetstream_server(tmp_path: Path) -> None:
    """The quick start's `nats-server` line, on a free loopback port and a temporary store."""
    (command,) = shell_lines(REPO / "README.md", "nats-server")
    program, *args = command
    assert program == ".venv/bin/nats-server" and "-js" in args, command
    args[args.index("-sd") + 1] = str(tmp_path / "store")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [find_server_binary(), *args, "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        settings = ConnectionSettings(servers=parse_servers(f"nats://127.0.0.1:{port}"))

        async def jetstream_enabled() -> bool:
            client = await NatsClient.open(settings)
            try:
                return bool(await client.js.account_info())
            finally:
                await client.close()

        wait_until(lambda: _answers(jetstream_enabled), timeout=20)
    finally:
        server.terminate()
        server.wait(10)


def _answers(check: Any) -> bool:
    try:
        return bool(run_sync(check()))
    except Exception:  # noqa: BLE001 - not up yet
        return False


def test_readme_cli_commands_run_as_written(
    nats_url: str, client: Blocking[NatsClient], unique: str, capsys: Any
) -> None:
    """The README's `nats-pcg` lines against the test server, on streams of their shapes: ORDERS
    as the quick start makes it (6 partitions of `orders.<customer>`), EVENTS over `events.*`."""
    orders, events = f"ORDERS_{unique}", f"EVENTS_{unique}"
    run_sync(
        client.target.api.create_stream(
            {
                "name": orders,
                "subjects": [f"orders{unique}.*"],
                "subject_transform": {
                    "src": f"orders{unique}.*",
                    "dest": f"{{{{partition(6,1)}}}}.orders{unique}.{{{{wildcard(1)}}}}",
                },
            }
        )
    )
    events_subjects = f"events{unique}.*"
    run_sync(client.target.api.create_stream({"name": events, "subjects": [events_subjects]}))
    names = {"ORDERS": orders, "EVENTS": events, "events.*": events_subjects}
    try:
        lines = shell_lines(REPO / "README.md", "nats-pcg")
        assert lines, "the README shows nats-pcg commands"
        for program, *args in lines:
            code = cli_main(["--server", nats_url, *(names.get(arg, arg) for arg in args)])
            out, err = capsys.readouterr()
            assert (code, err) == (0, ""), f"{program} {' '.join(args)}: {err}"
        assert "orders-etl" in out and "m1" in out, out  # the last line: the group's status
    finally:
        for stream in (orders, f"{events}-events-etl", events):
            with contextlib.suppress(NotFound):
                run_sync(client.target.api.delete_stream(stream))
