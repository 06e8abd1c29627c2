"""Retrying JetStream calls through the moments a cluster has no leader to answer them.

A stream or consumer is leaderless while its leader's server restarts and an election runs (up to
about 9 s, or some 30 s when a leader must first notice it lost its quorum). Requests then time
out, or are answered "temporarily unavailable"; both deserve another try, errors that name a real
problem (not found, bad request, permission) do not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError

from nats_spark.errors import TRANSIENT_ERROR_CODES, JetStreamApiError, NatsSparkError
from nats_spark.nats_py import read_loop_alive

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_PAUSE, MAX_PAUSE = 0.25, 2.0


class ConnectionLost(NatsSparkError):
    """The connection cannot receive answers any more (its read loop ended)."""


class Unavailable(NatsSparkError):
    """JetStream stayed unavailable for longer than the retry budget."""


def is_transient(error: BaseException) -> bool:
    """Whether `error` says only that JetStream could not answer right now."""
    if isinstance(error, (NatsTimeout, asyncio.TimeoutError)):
        return True
    if isinstance(error, (JetStreamApiError, APIError)):
        # nats-py's key-value errors are APIErrors without the codes
        code, err_code = getattr(error, "code", None), getattr(error, "err_code", None)
        return code == 503 or err_code in TRANSIENT_ERROR_CODES
    return False


async def retrying(
    call: Callable[[], Awaitable[T]],
    what: str,
    budget: float,
    transient: Callable[[BaseException], bool] = is_transient,
    connection: NATS | None = None,
) -> T:
    """`call()`, again after transient failures, with growing pauses, for up to `budget` seconds;
    then `Unavailable` naming `what` and the last failure. On `connection` whose read loop died,
    nothing can answer: `ConnectionLost` at once instead of waiting out the budget."""
    deadline = time.monotonic() + budget
    pause, attempts = FIRST_PAUSE, 0
    while True:
        try:
            return await call()
        except Exception as error:
            if not transient(error):
                raise
            if connection is not None and not read_loop_alive(connection):
                raise ConnectionLost(
                    f"{what} failed: the NATS connection stopped reading from the server; the "
                    "task fails and Spark retries it on a new connection"
                ) from None
            attempts += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(
                    f"{what} kept failing for {budget:g}s ({describe(error)}); check that the "
                    "NATS servers are up and their JetStream cluster has a leader, or raise "
                    "retryTimeout"
                ) from None
            if attempts == 1:
                log.warning("%s failed (%s); retrying for up to %gs", what, describe(error), budget)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, MAX_PAUSE)


def describe(error: BaseException) -> str:
    text = str(error).strip()
    return text if text and text != "nats: timeout" else "timed out"
