"""Opening a NATS connection with `ConnectionSettings` (nats-py's connect), failures as one-line
errors naming the fix."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import ssl

from nats.aio.client import Client as NATS
from nats.errors import ConnectionClosedError, StaleConnectionError

from nats_spark import nats_py
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import PERMISSIONS_DOC, ConfigurationError, ConnectionFailed

log = logging.getLogger(__name__)


def _failure_reason(error: BaseException, tls: bool = False) -> str:
    """Why a connect failed, with the fix; `tls` says the connection was to use TLS."""
    text = str(error).strip() or type(error).__name__
    lowered = text.lower()
    if "authorization" in lowered or "authentication" in lowered:
        return "the server refused the credentials; check user/password, token, nkey or creds"
    if "permissions violation" in lowered:
        return f"permission denied ({text}); grant the user that permission ({PERMISSIONS_DOC})"
    if isinstance(error, TimeoutError):
        return (
            f"no server answered in time ({text}); check the URL and that nats-server is "
            "running, or raise the option connectTimeout"
        )
    if isinstance(error, ConnectionRefusedError) or "connect call failed" in lowered:
        return f"no server answered ({text}); check the URL and that nats-server is running"
    # Without a TLS error of its own, a TLS connection dropped during the handshake is one too.
    dropped = tls and isinstance(error, (OSError, StaleConnectionError, ConnectionClosedError))
    if isinstance(error, ssl.SSLError) or "ssl" in lowered or "certificate" in lowered or dropped:
        return f"TLS failed ({text}); check tlsCaCert, tlsCert, tlsKey and the server's TLS setup"
    return text


def _uses_tls(nc: NATS) -> bool:
    """Whether the open connection is encrypted: nats-py upgrades a TCP connection only when the
    server's INFO requires TLS, whatever the URL or TLS context; `wss://` is TLS underneath."""
    scheme = nats_py.server_scheme(nc)
    if scheme == "wss":
        return True
    return scheme != "ws" and bool(nats_py.server_info(nc).get("tls_required"))


async def connect(settings: ConnectionSettings, denied: list[str] | None = None) -> NATS:
    """Connect with `settings`; failures become one-line `ConnectionFailed` errors.

    The server reports a publish it refuses only asynchronously; such permission violations are
    appended to `denied` (when given) so that callers can check after a flush.
    """
    _require_nkeys(settings)
    connecting = _Connecting(settings, denied)
    cause = await connecting.attempt()
    if cause is None:
        return await connecting.opened()
    raise await connecting.failed(cause)


def _require_nkeys(settings: ConnectionSettings) -> None:
    if settings.nkey_seed or settings.creds:
        try:  # nats-py signs with the optional `nkeys` package and fails obscurely without it
            importlib.import_module("nkeys")
        except ImportError:
            raise ConfigurationError(
                "nkeySeed and creds authentication need the nkeys package; install "
                "'nats-spark[nkeys]' (or nkeys) on the driver and every executor"
            ) from None


class _Connecting:
    """One connect with `settings`: nats-py's attempt, watched, and what it ended in."""

    def __init__(self, settings: ConnectionSettings, denied: list[str] | None) -> None:
        self.settings = settings
        self.denied = denied
        # The first error while not connected: it explains a failed connect best.
        self.first_error: BaseException | None = None
        self.tls_failed = asyncio.Event()
        self.nc = NATS()
        nats_py.install(self.nc)
        # nats-py hangs for good after a failed TLS handshake (nats.py issue #718), and a TLS
        # error does not heal on retry: stop at the first one. The deadline bounds any other hang.
        self.deadline = 1 + 2 * len(settings.servers) * (
            settings.connect_timeout + settings.reconnect_time_wait
        )

    async def on_error(self, error: Exception) -> None:
        nc, settings = self.nc, self.settings
        if not nc.is_connected:
            self.first_error = self.first_error or error
            if isinstance(error, ssl.SSLError):
                self.tls_failed.set()
        if self.denied is not None and "permissions violation" in str(error).lower():
            self.denied.append(str(error))
        level = logging.WARNING if nc.is_connected or nc.is_reconnecting else logging.DEBUG
        log.log(level, "NATS error on %s: %s", settings.described(), _failure_reason(error))

    async def on_reconnect(self) -> None:
        if self.settings.uses_tls and not _uses_tls(self.nc):  # a server of the list without TLS
            log.error(
                "closing a connection to %s: it reconnected without TLS",
                self.settings.described(),
            )
            await self.nc.close()

    async def attempt(self) -> BaseException | None:
        """Connect; None once open, else what explains the failure best."""
        kwargs = self.settings.connect_kwargs()
        # Fail fast on the first connect (one retry per server); reconnect policy applies later.
        kwargs["max_reconnect_attempts"] = 1
        attempt = asyncio.ensure_future(
            self.nc.connect(error_cb=self.on_error, reconnected_cb=self.on_reconnect, **kwargs)
        )
        # Retrieve the outcome even of an attempt given up on below ("never retrieved" noise).
        attempt.add_done_callback(lambda task: task.cancelled() or task.exception())
        watch = asyncio.ensure_future(self.tls_failed.wait())
        try:
            await asyncio.wait(
                {attempt, watch}, timeout=self.deadline, return_when="FIRST_COMPLETED"
            )
        except BaseException:  # our caller gave up: so does the attempt
            attempt.cancel()
            raise
        finally:
            watch.cancel()
        if not attempt.done() or attempt.cancelled():
            attempt.cancel()
            timeout = TimeoutError(f"no answer within {self.deadline:g}s")
            return self.first_error or timeout
        error = attempt.exception()
        return None if error is None else self.first_error or error

    async def opened(self) -> NATS:
        """The open connection, once it is known to be as secure as asked; from now on it
        reconnects as the settings say."""
        settings = self.settings
        if settings.uses_tls and not _uses_tls(self.nc):
            await self.nc.close()
            raise ConnectionFailed(
                f"cannot connect to NATS at {settings.described()}: TLS was asked for (a tls:// "
                "or wss:// URL, or a TLS option) but the server offers no TLS, and the connection "
                "would be plaintext; enable TLS on the server, or drop the TLS options"
            )
        self.nc.options["max_reconnect_attempts"] = settings.max_reconnect_attempts
        return self.nc

    async def failed(self, cause: BaseException) -> ConnectionFailed:
        """The error of a connect that failed with `cause`, its connection closed."""
        settings, nc = self.settings, self.nc
        with contextlib.suppress(BaseException):  # best effort on a connection that never opened
            await asyncio.wait_for(nc.close(), 1)
        nats_py.drop_transport(nc)
        info = nats_py.server_info(nc)
        untrusted = isinstance(cause, ssl.SSLCertVerificationError)  # the server's cert, not ours
        if info.get("tls_verify") and not settings.tls_cert and not untrusted:
            reason = (
                "TLS failed: the server requires a client certificate (mutual TLS); set tlsCert "
                "and tlsKey"
            )
        else:
            reason = _failure_reason(cause, settings.uses_tls or bool(info.get("tls_required")))
        return ConnectionFailed(f"cannot connect to NATS at {settings.described()}: {reason}")
