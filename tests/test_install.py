"""The formats register however the package is installed: from a wheel, and from the default
`pip install -e .`, with Spark and its Python workers started from a directory far from the
checkout. Spark finds data sources by listing the top-level `pyspark_*` modules on sys.path, so an
install that only adds an import hook (setuptools' default editable mode for some layouts) would
leave both formats unknown."""

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

import pytest

from nats_spark.client import NatsClient
from nats_spark.loop import Blocking, run_sync

pytestmark = pytest.mark.spark

PROJECT = Path(__file__).resolve().parent.parent
COUNT = 25

# Runs in the fresh environment, from an empty directory: where nats_spark was imported from, and
# what both formats do in a real Spark session.
PROBE = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    import nats_spark
    url, stream = sys.argv[1], sys.argv[2]
    spark = (
        SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    )
    rows = spark.read.format("nats").option("servers", url).option("stream", stream).load()
    try:
        spark.readStream.format("nats-pcg").load()
        pcg = "loaded without options"
    except Exception as error:
        pcg = str(error)
    print(json.dumps({
        "module": nats_spark.__file__,
        "version": nats_spark.__version__,
        "rows": rows.count(),
        "pcg": pcg,
    }))
    spark.stop()
    """
)


def _environment(root: Path) -> Path:
    """A new virtual environment that sees this one's dependencies (pyspark, nats-py, …) but
    not its install of nats-spark: their site-packages is a plain path entry, so the .pth files
    in it (this checkout's editable install) are not run."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
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
        [str(python), "-m", "pip", "install", "-q", "--no-deps", *args],
        check=True,
        cwd=python.parent,
    )


def _probe(python: Path, workdir: Path, url: str, stream: str) -> dict[str, object]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
    }
    env |= {"PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    done = subprocess.run(
        [str(python), "-c", PROBE, url, stream],
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
    name = f"install_{uuid.uuid4().hex[:8]}"

    async def fill() -> None:
        await client.target.api.create_stream({"name": name, "subjects": [f"{name}.>"]})
        for n in range(COUNT):
            await client.target.js.publish(f"{name}.k{n % 5}", str(n).encode())

    run_sync(fill())
    yield name
    run_sync(client.target.api.delete_stream(name))


def _check(found: dict[str, object], home: Path) -> None:
    from nats_spark import __version__

    assert Path(str(found["module"])).resolve().is_relative_to(home.resolve()), found
    assert found["version"] == __version__
    assert found["rows"] == COUNT
    # nats-pcg is registered too: its own option check answers, not Spark's "not found"
    assert "ConfigurationError: option servers is required" in str(found["pcg"]), found["pcg"]


def test_wheel_install_registers_both_formats(tmp_path, nats_url, stream):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(tmp_path / "dist"),
            str(PROJECT),
        ],
        check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("nats_spark-*.whl")
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
