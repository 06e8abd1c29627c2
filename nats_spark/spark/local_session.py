"""A Spark session on this machine, as the demo, the tests and the benchmarks start one: no UI,
two shuffle partitions, the driver on the loopback only, Python workers on this interpreter."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

_CONFIG = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.streaming.pollingDelay": "50ms",
    # Python workers connect back to the JVM within this (15 s by default, which a busy machine
    # can miss: "Python worker failed to connect back").
    "spark.python.authenticate.socketTimeout": "120s",
}


def local_session(app_name: str, master: str = "local[2]") -> Any:
    """The session `app_name` (made, or the running one), its log down to errors."""
    # Spark's Python workers run PYSPARK_PYTHON (else `python3` from PATH): this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, and no warning about it
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in _CONFIG.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def stop_spark(spark: Any, timeout: float = 60.0) -> None:
    """Stop `spark` and end the JVM this Python process started for it, waiting while the JVM's
    shutdown hook deletes Spark's temporary folders. A Jupyter kernel needs this before it
    stops: at shutdown ipykernel sends SIGTERM to its child processes again and again (10 ms,
    30 ms, 100 ms ... apart), which caught the `rm` that hook runs ('Cannot run program "rm"',
    a 30-line Java trace under the last cell) and left the folders behind. A JVM this process
    did not start (spark-submit's, Databricks', Spark Connect's server) is left running."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    if gateway is None or process is None or process.stdin is None:
        return
    gateway.shutdown()
    process.stdin.close()  # Spark's gateway server exits when its stdin ends
    process.wait(timeout)
    SparkContext._gateway = None  # a new session starts a new JVM
    SparkContext._jvm = None


def stop_between_batches(query: Any, within: float = 10.0) -> None:
    """Stop `query` once no batch runs, or after `within` seconds anyway. A stop interrupts the
    query's thread: Spark logs a batch stopped midway as aborted, with errors, and one stopped
    while it wrote its checkpoint caught the process Hadoop's local file system starts for a
    rename (`readlink`), which logged a Java trace ('Interrupted while joining', Spark 4.1)."""
    deadline = time.monotonic() + within
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
