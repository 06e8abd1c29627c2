"""The notebooks, executed headless with nbclient in a kernel of this interpreter."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from spark_helpers import (
    AUTO_REGISTER_PATH,
    REPO,
    REPORTS_LAG,
    assert_exactly_once,
    committed_rows,
    publish,
    row_payloads,
    settled,
    spark_env,
    static_group,
)

from nats_spark.client import open_blocking
from nats_spark.connection import ConnectionSettings, parse_servers
from nats_spark.loop import run_sync
from nats_spark.server import EmbeddedServer

pytestmark = pytest.mark.spark

NOTEBOOKS = REPO / "notebooks"
KERNEL = "nats-spark-venv"
# Variables the notebooks read; the test decides each of them.
NOTEBOOK_ENV = (
    "NATS_URL",
    "NATS_USER",
    "NATS_PASSWORD",
    "NATS_TOKEN",
    "DATABRICKS_RUNTIME_VERSION",
)


def kernel_name() -> str:
    """A kernelspec in this venv that runs this interpreter, installed on first use."""
    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL)
        if spec.argv[0] == sys.executable:
            return KERNEL
    except NoSuchKernel:
        pass
    subprocess.run(
        [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL],
        check=True,
        capture_output=True,
    )
    return KERNEL


def execute(name: str, kernel: str, cwd: Path, **env: str) -> Any:
    """Run every cell of notebooks/<name> (failing on the first error); the executed notebook.
    What the kernel and its Spark JVM write to stderr, up to the kernel's end (where
    `jupyter-execute` shows it to the user), goes to <cwd>/<name>.stderr."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    base = {k: v for k, v in spark_env().items() if k not in NOTEBOOK_ENV}
    client = nbclient.NotebookClient(
        notebook, kernel_name=kernel, timeout=240, resources={"metadata": {"path": str(cwd)}}
    )
    with open(cwd / f"{name}.stderr", "w") as stderr:
        return client.execute(env={**base, **env}, stderr=stderr)


def kernel_stderr(cwd: Path, name: str) -> str:
    return (cwd / f"{name}.stderr").read_text()


@dataclass
class Runs:
    quickstart: Future
    databricks: Future
    tmp: Path  # where the notebooks ran
    client: Any  # a blocking client of the databricks notebook's server
    password: str
    out: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[Runs]:
    """Both notebooks, executed at the same time: each spends most of its time starting Spark.

    The quickstart starts a server of its own. The databricks notebook reads a group on a server
    that wants a user and password, given to it the way it reads secrets outside Databricks.
    """
    tmp = tmp_path_factory.mktemp("notebooks")
    kernel = kernel_name()
    user, password = "spark", f"pw-{os.urandom(4).hex()}"
    config = tmp / "auth.conf"
    config.write_text(f'authorization {{\n  user: {user}\n  password: "{password}"\n}}\n')
    with EmbeddedServer(config_file=config) as server, ThreadPoolExecutor(2) as pool:
        client = open_blocking(
            ConnectionSettings(servers=parse_servers(server.url), user=user, password=password)
        )
        try:
            static_group(client, "DBX", "orders", ["a", "b"], partitions=4)
            publish(client, "DBX", 500)
            # No NATS_URL: the quickstart starts and stops an embedded server. It relies on the
            # auto-registered format.
            quickstart = pool.submit(
                execute, "quickstart.ipynb", kernel, tmp, PYTHONPATH=AUTO_REGISTER_PATH
            )
            databricks = pool.submit(
                execute,
                "databricks.ipynb",
                kernel,
                tmp,
                NATS_URL=server.url,
                NATS_USER=user,
                NATS_PASSWORD=password,
                NATS_SPARK_STREAM="DBX",
                NATS_SPARK_GROUP="orders",
                NATS_SPARK_OUTPUT=str(tmp / "orders"),
            )
            yield Runs(quickstart, databricks, tmp, client, password, tmp / "orders")
            wait([quickstart, databricks])  # before the server stops
        finally:
            run_sync(client.target.close())


def printed(notebook: Any) -> str:
    return "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.output_type == "stream"
    )


def images(notebook: Any) -> list[str]:
    """The PNG images the cells displayed (base64)."""
    return [
        output["data"]["image/png"]
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.output_type == "display_data" and "image/png" in output.get("data", {})
    ]


def assert_quiet(notebook: Any) -> None:
    """No console progress bar over the cells' output, and no Java trace (ipykernel shows what
    the JVM writes to its stderr in the cell that runs)."""
    text = printed(notebook)
    assert "[Stage " not in text, text
    assert "\tat " not in text and "Exception" not in text, text


def line_json(text: str, label: str) -> Any:
    match = re.search(rf"^{re.escape(label)}: (.*)$", text, re.MULTILINE)
    assert match, f"no '{label}:' line in the output:\n{text}"
    return json.loads(match.group(1))


@pytest.mark.unit
@pytest.mark.parametrize("name", ["quickstart.ipynb", "databricks.ipynb"])
def test_committed_without_outputs(name: str) -> None:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"clear the outputs of {name}"


@pytest.mark.compat
def test_quickstart_with_its_own_server(runs: Runs) -> None:
    notebook = runs.quickstart.result(300)
    text = printed(notebook)
    assert_quiet(notebook)
    assert len(images(notebook)) == 1 and line_json(text, "plotted batches") >= 1
    per_member = line_json(text, "rows per member")
    assert set(per_member) == {"m1", "m2"} and all(per_member.values())
    assert sum(per_member.values()) == 1000
    assert "distinct messages: 1000" in text
    assert "copied: 1000" in text  # the sink cell
    partitions = [f"partition-{p}" for p in range(4)]
    assert line_json(text, "server") == {p: {"pending": 0, "ackPending": 0} for p in partitions}
    assert line_json(text, "server lag") == {"pending": 0, "ackPending": 0}
    if REPORTS_LAG:  # the query's own view in progress, from Spark 4.2 on
        lag = line_json(text, "lag")
        assert set(lag) == set(partitions)
        assert {state["member"] for state in lag.values()} == {"m1", "m2"}
        assert all({"pending", "ackPending", "status"} <= set(state) for state in lag.values())
        # One batch took all 1,000; the last progress is the next batch's, whose tasks acked
        # them: delivered and unacked when it was planned, none pending or behind.
        total = {"pending": 0, "ackPending": 1000, "behindLatest": 0}
        assert line_json(text, "total lag") == total
    else:
        assert "total lag:" not in text
    assert line_json(text, "paced batches") == [400, 400, 200]
    port = int(re.search(r"NATS server: nats://127\.0\.0\.1:(\d+)", text).group(1))
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass  # the last cell stopped the server
    # No Java trace in what the kernel's JVM wrote: the last cell ended the JVM, which removed
    # its temporary folders before the kernel stopped (killed amid that by the kernel's
    # shutdown, it printed 'Cannot run program "rm"'); the queries were stopped between batches
    # (a stop amid a batch's checkpoint write interrupted Hadoop's `readlink`: 'Interrupted
    # while joining', with Spark 4.1).
    stderr = kernel_stderr(runs.tmp, "quickstart.ipynb")
    assert "Cannot run program" not in stderr, stderr
    assert "\tat " not in stderr, stderr


@pytest.mark.compat
def test_databricks_notebook_outside_databricks_with_auth(runs: Runs) -> None:
    notebook = runs.databricks.result(300)
    assert_quiet(notebook)
    assert len(images(notebook)) == 1
    install = next(c for c in notebook.cells if c.cell_type == "code" and "%pip" in c.source)
    assert install.execution_count is None and not install.outputs  # skipped outside Databricks
    text = printed(notebook)
    assert "authenticating with password, user" in text
    assert runs.password not in json.dumps(notebook)  # secrets never reach the outputs
    per_member = line_json(text, "rows per member")
    assert per_member.keys() == {"a", "b"} and sum(per_member.values()) == 500
    zero = {"pending": 0, "ackPending": 0}
    lag = line_json(text, "server lag")  # read and acked, on every Spark version
    assert lag == {"total": zero, "byMember": {"a": zero, "b": zero}}, lag
    assert re.search(r"\|member *\|pending *\|ackPending *\|", text)  # shown as a table
    assert ("query lag:" in text) == REPORTS_LAG
    assert_exactly_once(row_payloads(committed_rows(runs.out / "data")), 500)
    assert settled(runs.client, "DBX", "orders")
