"""A Spark session on this machine, as the demo, the tests and the benchmarks start one: no UI,
two shuffle partitions, the driver on the loopback only, Python workers on this interpreter."""

from __future__ import annotations

import os
import sys
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
