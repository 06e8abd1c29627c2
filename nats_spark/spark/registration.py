"""Registering the formats by hand (Spark Connect, or where Spark's own lookup did not find them),
with a check that Spark's Python workers can load them.

Spark looks up `pyspark_*` modules, and later unpickles a registered data source, in its Python
workers, which run `PYSPARK_PYTHON` (else `python3` from PATH), not necessarily the driver's
interpreter: a worker without nats-spark installed makes `format("nats-pcg")` unknown, and a
registered source fail on load() with a worker traceback ending in "No module named 'nats_spark'".
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from typing import Any

from nats_spark.errors import ConfigurationError

# The last `SomeError: text` line of a worker's traceback: what went wrong in the worker.
_WORKER_ERROR = re.compile(r"^(\w+(?:Error|Exception): .+)$", re.MULTILINE)


def register_source(spark: Any, source: type) -> None:
    """Register `source` with `spark`; a source registered already is fine (Spark 4.0/4.1 refuse
    to register a name twice, later versions replace it)."""
    try:
        spark.dataSource.register(source)
    except Exception as error:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(error):
            raise


def register_formats(spark: Any) -> None:
    """Register `nats-pcg` and `nats` with `spark` and check that its Python workers can load
    them; if they cannot, a one-line `ConfigurationError` names the interpreter they run and
    PYSPARK_PYTHON."""
    from nats_spark.spark.group_source.source import NatsPcgDataSource
    from nats_spark.spark.nats_format import NatsDataSource

    for source in (NatsPcgDataSource, NatsDataSource):
        register_source(spark, source)
    try:
        # Options that parse, for a source that is never started: load() makes the source in a
        # worker (no connection yet), `.schema` makes Spark Connect do so too.
        reader = spark.readStream.format(NatsPcgDataSource.name())
        _ = reader.options(servers="nats://127.0.0.1:4222", stream="S", group="G").load().schema
    except Exception as error:
        raise ConfigurationError(_unloadable(spark, str(error))) from None


def worker_python(spark: Any) -> str:
    """The interpreter Spark's Python workers run, as this session knows it."""
    try:
        return str(spark.sparkContext.pythonExec)
    except Exception:  # Spark Connect: the server decides; its default is the same
        return os.environ.get("PYSPARK_PYTHON", "python3")


def _unloadable(spark: Any, error: str) -> str:
    found = _WORKER_ERROR.findall(error)
    cause = found[-1] if found else error.strip().splitlines()[0]
    python = worker_python(spark)
    if os.sep not in python:
        python = f"{python!r} from PATH ({shutil.which(python) or 'not found here'})"
    return (
        f"Spark's Python workers cannot load nats-spark ({cause}): they run {python}; set "
        f"PYSPARK_PYTHON to a Python with nats-spark installed (this one is {sys.executable}) "
        "before the Spark session starts, or install nats-spark there"
    )
