"""The connector's one line first, where the package hands a Spark error to the user: the job's
`query failed:` line, and `one_line_failures` around the driver's calls (the notebooks').

Spark writes a failed query's text itself, from its error templates, with what the Python
worker reported last: `[STREAM_FAILED] Query [id = …, runId = …] terminated with exception:
[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform
latestOffset: nats_spark.errors.ConfigurationError: <the line>`. A data source method can only
raise (the worker sends the exception's type and text, `SPARK_HIDE_TRACEBACK`), and pyspark's
`StreamingQuery.awaitTermination()` and `exception()` raise and return that text as the JVM
built it, so nothing a source does puts its line before Spark's prefixes. The same holds at
`load()` (`[PYTHON_DATA_SOURCE_ERROR] …`) and for a format Spark's Python workers could not
find (`DATA_SOURCE_NOT_FOUND`, which pyspark leaves a Py4JJavaError with the JVM's trace).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from nats_spark.errors import NatsSparkError
from nats_spark.spark.registration import missing_on_workers

# The connector's own error line inside a Spark error's text (the worker's exception line).
_SOURCE_ERROR = re.compile(r"(?:^|\s)nats_spark\.[\w.]+?: (.+)$", re.MULTILINE)


class SparkFailed(NatsSparkError):
    """A Spark error whose cause the connector said in one line: that line, first and alone.
    Spark's own error is `spark_error`."""

    def __init__(self, line: str, spark_error: BaseException) -> None:
        super().__init__(line)
        self.spark_error = spark_error


def connector_line(error: BaseException, spark: Any = None) -> str | None:
    """The one line a Spark error is about, if the connector said it: that Spark's Python
    workers lack nats-spark (with `spark`, which knows the Python they run), or the connector's
    own error; None for every other error."""
    missing = missing_on_workers(spark, error)
    if missing:
        return missing
    match = _SOURCE_ERROR.search(str(error))
    return match.group(1).strip() if match else None


def failure_line(error: BaseException | str, spark: Any = None) -> str:
    """One line for a failed query: the connector's (`connector_line`), else Spark's first."""
    if isinstance(error, str):
        error = Exception(error)
    return connector_line(error, spark) or str(error).strip().splitlines()[0]


@contextlib.contextmanager
def one_line_failures(spark: Any = None) -> Iterator[None]:
    """Raise a Spark error the connector explains as `SparkFailed`: its line, without Spark's
    prefixes and the JVM's trace (`spark_error` keeps them). Other errors pass unchanged.

        with one_line_failures(spark):
            query.awaitTermination()
    """
    try:
        yield
    except NatsSparkError:
        raise
    except Exception as error:
        line = connector_line(error, spark)
        if line is None:
            raise
        raise SparkFailed(line, error) from None
