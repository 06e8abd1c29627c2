"""`one_line_failures` around a user's own load() in a Spark whose Python workers lack
nats-spark: Spark's DATA_SOURCE_NOT_FOUND (a Py4JJavaError of some 190 lines) becomes one line
naming the Python Spark looked the formats up with and what to set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from spark_helpers import spark_env

pytestmark = pytest.mark.spark

# A user's notebook or script: the format is not registered by hand, Spark looks it up.
USERS_LOAD = """
import sys

from pyspark.sql import SparkSession

from nats_spark.spark.failure_lines import one_line_failures

spark = SparkSession.builder.master("local[1]").getOrCreate()
try:
    with one_line_failures(spark):
        spark.readStream.format("nats-pcg").option("servers", sys.argv[1]).load()
except Exception as error:
    print(f"RAISED {type(error).__name__}: {error}", flush=True)
spark.stop()
"""


def test_a_users_load_on_workers_without_the_package_is_one_line(
    tmp_path: Path, nats_url: str
) -> None:
    """PYSPARK_PYTHON is a Python without site-packages (so without nats-spark), as `python3`
    from PATH is outside a virtualenv; PYSPARK_DRIVER_PYTHON unset, as by a user (Spark looks
    formats up with it first)."""
    bare = tmp_path / "python-without-nats-spark"
    bare.write_text(f'#!/bin/sh\nPYTHONSAFEPATH=1 exec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    env = {k: v for k, v in spark_env().items() if k not in ("PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, "-c", USERS_LOAD, nats_url],
        capture_output=True,
        text=True,
        env={**env, "PYSPARK_PYTHON": str(bare)},
        cwd=tmp_path,
        timeout=240,
    )
    raised = [line for line in done.stdout.splitlines() if line.startswith("RAISED ")]
    assert len(raised) == 1, (done.stdout, done.stderr[-3000:])
    line = raised[0]
    assert line.startswith("RAISED SparkFailed: Spark's Python workers cannot load nats-spark ("), (
        line
    )
    assert "DATA_SOURCE_NOT_FOUND" in line and f"they run {bare}; set PYSPARK_PYTHON" in line, line
    assert sys.executable in line, line
