"""The formats register and read however the package is installed: from the wheel `make wheel`
builds (what a cluster or a Databricks Volume gets), and from the default `pip install -e .`, with
Spark and its Python workers started from a directory far from the checkout; each install reads a
static group's stream through `format("nats")` and `format("nats-pcg")`. Spark finds data sources
by listing the top-level `pyspark_*` modules on sys.path, so an install that only adds an import
hook (setuptools' default editable mode for some layouts) would leave both formats unknown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import publish, static_group

from nats_spark.client import NatsClient
from nats_spark.loop import Blocking, run_sync
from nats_spark.pcg import admin

pytestmark = pytest.mark.spark

PROJECT = Path(__file__).resolve().parent.parent
COUNT = 25
GROUP = "g"

# Runs in the fresh environment, from an empty directory: where nats_spark was imported from, and
# what both formats read in a real Spark session (one JVM for both).
PROBE = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    import nats_spark
    url, stream, group = sys.argv[1:4]
    spark = (
        SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    )
    whole = spark.read.format("nats").option("servers", url).option("stream", stream).load()
    query = (
        spark.readStream.format("nats-pcg")
        .option("servers", url).option("stream", stream).option("group", group).load()
        .writeStream.format("memory").queryName("pcg").trigger(availableNow=True).start()
    )
    query.awaitTermination(120)
    print(json.dumps({
        "module": nats_spark.__file__,
        "version": nats_spark.__version__,
        "nats": sorted(int(row.data) for row in whole.collect()),
        "nats-pcg": sorted(int(row.data) for row in spark.table("pcg").collect()),
    }))
    spark.stop()
    """
)


def _environment(root: Path) -> Path:
    """A new virtual environment that sees this one's dependencies (pyspark, nats-py, …) but
    not its install of nats-spark: their site-packages is a plain path entry, so the .pth files
    in it (this checkout's editable install) are not run. Without a pip of its own (`_pip` runs
    this one's into it): ensurepip would cost more than the install."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "outer_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", *args],
        check=True,
        cwd=python.parent,
    )


def _probe(python: Path, workdir: Path, url: str, stream: str) -> dict[str, Any]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
    }
    env |= {"PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    done = subprocess.run(
        [str(python), "-c", PROBE, url, stream, GROUP],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def stream(client: Blocking[NatsClient]) -> Iterator[str]:
    """A static group's stream holding messages 0 ... COUNT-1."""
    name = f"install_{uuid.uuid4().hex[:8]}"
    static_group(client, name, GROUP, ["m1", "m2"], partitions=2)
    publish(client, name, COUNT)
    yield name
    run_sync(admin.delete_static(client.target, name, GROUP))
    run_sync(client.target.api.delete_stream(name))


def _check(found: dict[str, Any], home: Path) -> None:
    from nats_spark import __version__

    assert Path(str(found["module"])).resolve().is_relative_to(home.resolve()), found
    assert found["version"] == __version__
    assert found["nats"] == list(range(COUNT)), found
    assert found["nats-pcg"] == list(range(COUNT)), found


def test_wheel_install_registers_both_formats(tmp_path, nats_url, stream):
    # The documented route: `make wheel`, run with this interpreter (BIN), into a folder of its own.
    subprocess.run(
        ["make", "-s", "wheel", f"BIN={Path(sys.executable).parent}", f"DIST={tmp_path / 'dist'}"],
        cwd=PROJECT,
        check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("nats_spark-*-py3-none-any.whl")
    python = _environment(tmp_path / "venv")
    _pip(python, str(wheel))
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    _check(_probe(python, workdir, nats_url, stream), tmp_path / "venv")


def test_default_editable_install_registers_both_formats(tmp_path, nats_url, stream):
    python = _environment(tmp_path / "venv")
    _pip(python, "-e", str(PROJECT))
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    _check(_probe(python, workdir, nats_url, stream), PROJECT)
