"""Registering the formats by hand (Spark Connect, or where Spark's own lookup did not find them),
with a check that Spark's Python workers can load them.

Spark looks up `pyspark_*` modules, and later unpickles a registered data source, in its Python
workers, which run `PYSPARK_PYTHON` (else `python3` from PATH), not necessarily the driver's
interpreter: a worker without nats-spark installed makes `format("nats-pcg")` unknown, and a
registered source fail on load() with a worker traceback ending in "No module named 'nats_spark'".
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nats_spark.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSource

# What a worker that loaded nats-spark answers to a source without options.
_LOADED_REFUSAL = "option servers is required"
# What a worker without nats-spark says: of a registered format, of a format looked up.
_NOT_IMPORTED = "No module named 'nats_spark'"
_NOT_FOUND = "DATA_SOURCE_NOT_FOUND"
_FORMATS = ("nats-pcg", "nats")
# The last `SomeError: text` line of a worker's traceback: what went wrong in the worker.
_WORKER_ERROR = re.compile(r"^(\w+(?:Error|Exception): .+)$", re.MULTILINE)


# Logs a warning when a registration replaces the format Spark found by itself (4.2+), which
# is what registering by hand is for.
_DATA_SOURCE_MANAGER = "org.apache.spark.sql.execution.datasources.DataSourceManager"


@contextlib.contextmanager
def _no_replacement_warning(spark: Any) -> Iterator[None]:
    """Spark's warning of a replaced format held back while registering (a classic session's
    log; Spark Connect logs it on its server, if at all)."""
    try:
        log4j = spark.sparkContext._jvm.org.apache.logging.log4j
        context = log4j.LogManager.getContext(False)
        configured = context.getConfiguration().getLoggers().containsKey(_DATA_SOURCE_MANAGER)
        before = log4j.LogManager.getLogger(_DATA_SOURCE_MANAGER).getLevel()
        log4j.core.config.Configurator.setLevel(_DATA_SOURCE_MANAGER, log4j.Level.ERROR)
    except Exception:
        yield
        return
    try:
        yield
    finally:
        if configured:
            log4j.core.config.Configurator.setLevel(_DATA_SOURCE_MANAGER, before)
        else:  # back to the level it inherits
            context.getConfiguration().removeLogger(_DATA_SOURCE_MANAGER)
            context.updateLoggers()


def register_source(spark: Any, source: type) -> None:
    """Register `source` with `spark`; a source registered already is fine (Spark 4.0/4.1 refuse
    to register a name twice, later versions replace it)."""
    try:
        with _no_replacement_warning(spark):
            spark.dataSource.register(source)
    except Exception as error:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(error):
            raise


def ensure_registered(spark: Any, source: type[DataSource]) -> None:
    """Register `source` unless the session resolves its name already (Spark found it by itself):
    a session started for a query copies its registrations, and Spark warns of each one that
    replaces a format it found (4.2+), at every query start."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        known = bool(manager.dataSourceExists(source.name()))
    except Exception:  # Spark Connect: the server's session, not this one's to ask
        known = False
    if not known:
        register_source(spark, source)


def register_formats(spark: Any) -> None:
    """Register `nats-pcg` and `nats` with `spark` and check that its Python workers can load
    them; if they cannot, a one-line `ConfigurationError` names the interpreter they run and
    PYSPARK_PYTHON."""
    from nats_spark.spark.group_source.source import NatsPcgDataSource
    from nats_spark.spark.nats_format import NatsDataSource

    for source in (NatsPcgDataSource, NatsDataSource):
        register_source(spark, source)
    try:
        # load() makes the source in a worker (`.schema` makes Spark Connect do so too), which
        # refuses a source without options: that refusal is the worker's nats-spark speaking.
        _ = spark.readStream.format(NatsPcgDataSource.name()).load().schema
    except Exception as error:
        if _LOADED_REFUSAL not in str(error):
            raise ConfigurationError(_unloadable(spark, str(error))) from None


def missing_on_workers(spark: Any, error: BaseException) -> str | None:
    """The one line for a failure of load() that says Spark's Python workers lack nats-spark
    (a registered format's worker: "No module named 'nats_spark'"; a format Spark looked up in
    them: DATA_SOURCE_NOT_FOUND, 190 lines of a Java trace); None for other failures."""
    text = str(error)
    if _NOT_IMPORTED in text:
        return _unloadable(spark, text)
    if _NOT_FOUND in text and any(f": {name}." in text for name in _FORMATS):
        cause = f"{_NOT_FOUND}: Spark did not find the format in them"
        return _unloadable(spark, cause, lookup_python(spark))
    return None


def worker_python(spark: Any) -> str:
    """The interpreter Spark's Python workers run, as this session knows it."""
    try:
        return str(spark.sparkContext.pythonExec)
    except Exception:  # Spark Connect: the server decides; its default is the same
        return os.environ.get("PYSPARK_PYTHON", "python3")


def lookup_python(spark: Any) -> str:
    """The interpreter Spark looked the `pyspark_*` formats up with (once per JVM, at the first
    data source call): the JVM's PYSPARK_DRIVER_PYTHON, else its PYSPARK_PYTHON, else python3."""
    try:
        getenv = spark.sparkContext._jvm.java.lang.System.getenv
        return str(getenv("PYSPARK_DRIVER_PYTHON") or getenv("PYSPARK_PYTHON") or "python3")
    except Exception:  # Spark Connect, or no session: what its workers run
        return worker_python(spark)


def _unloadable(spark: Any, error: str, python: str | None = None) -> str:
    """The line for workers running `python` (default: `worker_python`) without nats-spark."""
    found = _WORKER_ERROR.findall(error)
    cause = found[-1] if found else error.strip().splitlines()[0]
    python = python or worker_python(spark)
    if os.sep not in python:
        python = f"{python!r} from PATH ({shutil.which(python) or 'not found here'})"
    return (
        f"Spark's Python workers cannot load nats-spark ({cause}): they run {python}; set "
        f"PYSPARK_PYTHON to a Python with nats-spark installed (this one is {sys.executable}) "
        "before the Spark session starts, or install nats-spark there"
    )
