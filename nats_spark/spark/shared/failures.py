"""The connector's one-line errors as the first thing Spark shows.

Spark puts a Python worker's error into its own message as the full traceback, the connector's
line last, after 10 to 70 lines. Every Spark worker that runs a data source method ends its
process after reporting an exception, and reports it as the exception's type and message alone
when `SPARK_HIDE_TRACEBACK` is set (pyspark's `handle_worker_exception`). Entry points wrapped
here set it for the connector's own errors only, just before the process reports one and exits;
other errors keep their traceback, and ours is logged at debug level.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from nats_spark.errors import NatsSparkError

log = logging.getLogger(__name__)

Entry = TypeVar("Entry", bound=Callable[..., Any])


def _report_one_line(error: NatsSparkError) -> None:
    log.debug("connector error", exc_info=error)
    os.environ["SPARK_HIDE_TRACEBACK"] = "1"


def one_line_errors(entry: Entry) -> Entry:
    """Wrap a method Spark calls (a generator's errors count while it is iterated)."""
    if inspect.isgeneratorfunction(entry):

        @functools.wraps(entry)
        def iterate(*args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from entry(*args, **kwargs)
            except NatsSparkError as error:
                _report_one_line(error)
                raise

        return iterate  # type: ignore[return-value]

    @functools.wraps(entry)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return entry(*args, **kwargs)
        except NatsSparkError as error:
            _report_one_line(error)
            raise

    return call  # type: ignore[return-value]
