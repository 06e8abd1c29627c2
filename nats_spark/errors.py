"""The connector's exceptions: each carries one line naming the problem and the fix.

A condition more than one format or entry point meets is worded once, by a builder here."""

import json
from enum import IntEnum
from typing import Any

# Where an error points to the list of permissions a query needs: a command of the installed
# package (`nats_spark.permissions`), as the wheel carries no docs/ pages.
PERMISSIONS_DOC = "every subject a query needs: python -m nats_spark.permissions <stream>"


class NatsSparkError(Exception):
    """Base of every error the connector raises on purpose."""


class ConfigurationError(NatsSparkError, ValueError):
    """An option, argument or server-side configuration does not fit."""


def stream_missing(stream: str, servers: str) -> ConfigurationError:
    """The stream an option names does not exist (every format checks it before reading or
    writing)."""
    return ConfigurationError(
        f"stream {stream!r} does not exist on {servers}; create it or fix the stream option"
    )


def option_not_applicable(name: str, where: str) -> ConfigurationError:
    """An option given where it has no meaning (`where`: e.g. "batch reads (read)")."""
    return ConfigurationError(f"option {name} does not apply to {where}; drop it")


# What a consumer deleted and created again from its start does (`consumer_created_again`).
CREATED_AGAIN_HARM = "the new one delivers again what the query already committed"


def consumer_created_again(
    stream: str,
    name: str,
    when: str,
    evidence: str,
    recreation: str,
    harm: str = CREATED_AGAIN_HARM,
) -> ConfigurationError:
    """A consumer a query reads was deleted and created again `when` (seen by `evidence`) and
    cannot be read on: `harm` says why (by default, it starts over, delivering what the query
    committed); `recreation`: how to go on (none when `harm` says it). Told by the driver (a
    later creation time) and by a task (a delivery the consumer had acked)."""
    way_on = f"; {recreation}" if recreation else ""
    return ConfigurationError(
        f"consumer {name!r} on stream {stream!r} was deleted and created again {when} "
        f"({evidence}): {harm}{way_on}"
    )


def foreign_checkpoint(offset: Any, reader: str) -> ConfigurationError:
    """A checkpoint offset `reader` did not write (another source, format or version)."""
    return ConfigurationError(
        f"checkpoint offset {json.dumps(offset)[:200]} was not written by {reader}; start the "
        "query with a new checkpoint location"
    )


class ConnectionFailed(NatsSparkError, ConnectionError):
    """The NATS servers could not be reached, or refused the credentials or TLS setup."""


class ServerTooOld(NatsSparkError):
    """The NATS server lacks a feature the connector needs."""


class ErrorCode(IntEnum):
    """`err_code` values of JetStream API errors the connector acts on."""

    CLUSTER_INCOMPLETE = 10004
    UNAVAILABLE = 10008  # JetStream temporarily unavailable (no meta leader)
    NOT_LEADER = 10009  # this server can not handle the request (leader moving)
    PEER_NOT_MEMBER = 10040
    STREAM_NOT_FOUND = 10059
    FILTER_NOT_UNIQUE_ON_WORK_QUEUE = 10100  # another consumer of the work queue has the filter
    CONSUMER_EXISTS_WITH_OTHER_CONFIG = 10148
    DUPLICATE_IN_PROCESS = 10158  # a publish with the same message id is being stored
    ATOMIC_BATCH_INCOMPLETE = 10176
    ATOMIC_BATCH_TOO_LARGE = 10199
    ATOMIC_BATCH_HAS_DUPLICATE = 10201  # a message id of the batch is stored already
    ATOMIC_TOO_MANY_INFLIGHT = 10210


# What means "ask again shortly".
TRANSIENT_ERROR_CODES = frozenset(
    {
        ErrorCode.CLUSTER_INCOMPLETE,
        ErrorCode.UNAVAILABLE,
        ErrorCode.NOT_LEADER,
        ErrorCode.PEER_NOT_MEMBER,
    }
)


class PermissionDenied(NatsSparkError):
    """The user may not publish the request's subject (the server's permissions refused it)."""


def publish_denied(subject: str) -> PermissionDenied:
    """A request to `subject` the server refused (an asynchronous permission violation)."""
    return PermissionDenied(
        f"permission denied to publish {subject}; allow the user to publish to it "
        f"({PERMISSIONS_DOC})"
    )


class JetStreamApiError(NatsSparkError):
    """A `$JS.API` request answered with an error."""

    def __init__(self, subject: str, code: int, err_code: int, description: str) -> None:
        self.subject = subject
        self.code = code
        self.err_code = err_code
        self.description = description
        super().__init__(f"{description} (status {code}, error code {err_code}, on {subject})")

    @property
    def stream_missing(self) -> bool:
        """The stream itself is gone (not only the consumer or message asked for)."""
        return self.err_code == ErrorCode.STREAM_NOT_FOUND


class NotFound(JetStreamApiError):
    """A stream, consumer, message or key does not exist (JetStream status 404)."""


class PullError(NatsSparkError):
    """A pull request ended in a way that needs the caller's attention (deleted consumer, ...)."""

    def __init__(self, status: int, description: str, hint: str = "") -> None:
        self.status = status
        self.description = description
        message = f"pull failed with status {status} {description}".rstrip()
        super().__init__(f"{message}: {hint}" if hint else message)

    @property
    def consumer_gone(self) -> bool:
        """The consumer no longer exists (deleted, or no responders)."""
        return self.status == 503 or (
            self.status == 409 and self.description.lower().startswith("consumer deleted")
        )


class PriorityGroupMisconfigured(PullError, ConfigurationError):
    """The server rejected a pull as not fitting the consumer's priority settings (status 400)."""
