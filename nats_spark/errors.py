"""The connector's exceptions: each carries one line naming the problem and the fix."""


class NatsSparkError(Exception):
    """Base of every error the connector raises on purpose."""


class ConfigurationError(NatsSparkError, ValueError):
    """An option, argument or server-side configuration does not fit."""


class ConnectionFailed(NatsSparkError, ConnectionError):
    """The NATS servers could not be reached, or refused the credentials or TLS setup."""


class ServerTooOld(NatsSparkError):
    """The NATS server lacks a feature the connector needs."""


STREAM_NOT_FOUND = 10059  # JetStream error codes
CONSUMER_NOT_FOUND = 10014


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
        return self.err_code == STREAM_NOT_FOUND


class NotFound(JetStreamApiError):
    """A stream, consumer, message or key does not exist (JetStream status 404)."""


class PullError(NatsSparkError):
    """A pull request ended in a way that needs the caller's attention (deleted consumer, ...)."""

    def __init__(self, status: int, description: str, hint: str = "") -> None:
        self.status = status
        self.description = description
        message = f"pull failed with status {status} {description}".rstrip()
        super().__init__(f"{message}: {hint}" if hint else message)


class PriorityGroupMisconfigured(PullError, ConfigurationError):
    """The server rejected a pull as not fitting the consumer's priority settings (status 400)."""
