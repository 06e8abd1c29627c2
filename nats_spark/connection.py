"""Connection settings in one place, mapped to `nats.connect`'s arguments; secrets never printed.

Spark's processes that look a format up, create it or plan a read parse options into these
settings and never connect, so this module imports neither nats-py nor asyncio: `connect.py`
opens connections.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from nats_spark.errors import ConfigurationError
from nats_spark.jetstream.subject_names import valid_publish_subject

if TYPE_CHECKING:
    import ssl

DEFAULT_URL = "nats://127.0.0.1:4222"
_SCHEMES = ("nats://", "tls://", "ws://", "wss://")
_DOMAIN = re.compile(r"^[^\s.*>]+$")  # one subject token, as nats-server names domains
DEFAULT_PREFIX = "$JS.API"  # the JetStream API's subjects without a domain or an imported API


def no_jetstream(subject: str) -> str:
    """Why nobody answers `subject` on the default API prefix, and the fix."""
    return (
        f"JetStream did not answer {subject}; enable JetStream on the server "
        "(nats-server -js) and check the account's permissions"
    )


def parse_servers(text: str) -> tuple[str, ...]:
    """Split a comma list of server URLs; bare `host:port` gets `nats://`."""
    servers = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "://" not in part:
            part = "nats://" + part
        if not part.startswith(_SCHEMES):
            raise ConfigurationError(
                f"server URL {redact_url(part)!r} has an unknown scheme; use nats://, tls://, "
                "ws:// or wss://"
            )
        servers.append(part)
    if not servers:
        raise ConfigurationError("no NATS server given; set servers to e.g. nats://host:4222")
    return tuple(servers)


SECRET_ENVIRONMENT = {
    "user": "NATS_USER",
    "password": "NATS_PASSWORD",
    "token": "NATS_TOKEN",
    "creds": "NATS_CREDS",
}


def read_secret_file(option: str, path: str) -> str:
    """A password or token kept in a file (trailing newline dropped); errors name the option and
    the path, never the content."""
    try:
        with open(path, encoding="utf-8") as file:
            secret = file.read().strip()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or type(error).__name__
        raise ConfigurationError(
            f"{option} {path} cannot be read ({reason}); check the path and its permissions"
        ) from None
    if not secret:
        raise ConfigurationError(f"{option} {path} is empty; put the secret in it")
    return secret


def credentials(
    given: dict[str, str | None],
    files: dict[str, tuple[str, str | None]],
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str | None]:
    """`user`/`password`/`token`/`creds`/`nkey_seed` from the options (`given`), else secrets
    from files (`files`: option name -> path, for password and token), else, when no way to
    authenticate is given at all, from NATS_USER, NATS_PASSWORD, NATS_TOKEN and NATS_CREDS: so
    that secrets need not be on a command line, where `ps` shows them."""
    values = dict(given)
    for key, (option, path) in files.items():
        if path is None:
            continue
        if values.get(key) is not None:
            raise ConfigurationError(f"both {key} and {option} given; use one of them")
        values[key] = read_secret_file(option, path)
    if not any(values.values()):
        for key, variable in SECRET_ENVIRONMENT.items():
            values[key] = environ.get(variable) or None
    return values


def with_credentials(
    given: dict[str, str | None], files: dict[str, tuple[str, str | None]], **settings: Any
) -> ConnectionSettings:
    """`ConnectionSettings` with the credentials `credentials` finds for `given` and `files`,
    and the other `settings` as given."""
    auth = credentials(given, files)
    return ConnectionSettings(
        user=auth["user"],
        password=auth["password"],
        token=auth["token"],
        nkey_seed=auth["nkey_seed"],
        creds=auth["creds"],
        **settings,
    )


def redact_url(url: str) -> str:
    """The URL with any `user:password@` or `token@` part replaced by `***@`."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


@dataclass(frozen=True)
class ConnectionSettings:
    """How to reach NATS. Picklable, so it can travel to Spark executors inside a partition.

    `nkey_seed` and `creds` are paths to files; `password` and `token` are the secrets themselves
    and never appear in `repr`.
    """

    servers: tuple[str, ...] = (DEFAULT_URL,)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed: str | None = None
    creds: str | None = None
    tls_ca_cert: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    name: str = "nats-spark"
    connect_timeout: float = 5.0
    retry_timeout: float = 60.0  # how long JetStream calls are retried while it has no leader
    max_reconnect_attempts: int = 60
    reconnect_time_wait: float = 0.5
    domain: str | None = None  # JetStream domain: the API is `$JS.<domain>.API`
    api_prefix: str | None = None  # the JetStream API imported from another account
    inbox_prefix: str | None = None  # replies come to `<inbox_prefix>.<id>...` (default _INBOX)

    def __post_init__(self) -> None:
        if self.password is not None and self.user is None:
            raise ConfigurationError("password given without user; set user as well")
        if self.token and self.user:
            raise ConfigurationError("both token and user given; use one way to authenticate")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigurationError(
                "tlsCert and tlsKey go together; give both for mutual TLS, or neither"
            )
        for label, path in (
            ("nkeySeed", self.nkey_seed),
            ("creds", self.creds),
            ("tlsCaCert", self.tls_ca_cert),
            ("tlsCert", self.tls_cert),
            ("tlsKey", self.tls_key),
        ):
            if path and not os.path.isfile(path):
                raise ConfigurationError(f"{label} file {path} does not exist; check the path")
        if self.connect_timeout <= 0:
            raise ConfigurationError("option connectTimeout must be positive; give e.g. 5s")
        if self.retry_timeout <= 0:
            raise ConfigurationError("option retryTimeout must be positive; give e.g. 60s")
        _check_routing(self.domain, self.api_prefix, self.inbox_prefix)
        self.ssl_context()  # a CA, cert or key file that is not PEM fails here, naming the option

    def __repr__(self) -> str:
        # Server URLs may embed `user:password@` or `token@`: show them redacted.
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        values["servers"] = tuple(redact_url(s) for s in self.servers)
        shown = ", ".join(f"{name}={value!r}" for name, value in values.items())
        return f"{type(self).__name__}({shown})"

    @property
    def uses_tls(self) -> bool:
        return bool(self.tls_ca_cert or self.tls_cert) or any(
            s.startswith(("tls://", "wss://")) for s in self.servers
        )

    def described(self) -> str:
        """Servers without credentials, for messages."""
        return ",".join(redact_url(s) for s in self.servers)

    @property
    def jetstream_prefix(self) -> str:
        """The subject prefix of the JetStream API: `$JS.API`, `$JS.<domain>.API` or apiPrefix."""
        if self.domain:
            return f"$JS.{self.domain}.API"
        return self.api_prefix.rstrip(".") if self.api_prefix else DEFAULT_PREFIX

    def unreachable(self, subject: str) -> str:
        """Why nobody answers a JetStream request on `subject`, and the fix, for messages."""
        if self.domain:
            return (
                f"JetStream domain {self.domain!r} not reachable from {self.described()} (no "
                f"answer to {subject}); check the leaf node link to that domain, or fix the "
                "option domain (--js-domain)"
            )
        if self.api_prefix:
            return (
                f"no JetStream API answers under the prefix {self.jetstream_prefix!r} (no answer "
                f"to {subject}); check the account's import of the JetStream API, or fix the "
                "option apiPrefix (--js-api-prefix)"
            )
        return no_jetstream(subject)

    def with_name(self, name: str) -> ConnectionSettings:
        return replace(self, name=name)

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.uses_tls:
            return None
        import ssl  # here: settings without TLS are parsed in processes that never connect

        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_cert)
        except (ssl.SSLError, ValueError) as error:
            raise ConfigurationError(
                f"tlsCaCert file {self.tls_ca_cert} holds no usable CA certificate ({error}); "
                "give a PEM file of the CA that signs the server's certificate"
            ) from None
        if self.tls_cert:
            try:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            except (ssl.SSLError, ValueError) as error:
                raise ConfigurationError(
                    f"tlsCert {self.tls_cert} and tlsKey {self.tls_key} are not a PEM certificate "
                    f"and its private key ({error}); give the client certificate and its key"
                ) from None
        return context

    def connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "servers": list(self.servers),
            "name": self.name,
            "connect_timeout": self.connect_timeout,
            "max_reconnect_attempts": self.max_reconnect_attempts,
            "reconnect_time_wait": self.reconnect_time_wait,
            "allow_reconnect": True,
        }
        if self.user is not None:
            kwargs["user"] = self.user
            kwargs["password"] = self.password or ""
        if self.token:
            kwargs["token"] = self.token
        if self.nkey_seed:
            kwargs["nkeys_seed"] = self.nkey_seed
        if self.creds:
            kwargs["user_credentials"] = self.creds
        if self.inbox_prefix:
            kwargs["inbox_prefix"] = self.inbox_prefix
        context = self.ssl_context()
        if context is not None:
            kwargs["tls"] = context
            if self.tls_hostname:
                kwargs["tls_hostname"] = self.tls_hostname
        return kwargs


def _check_routing(domain: str | None, api_prefix: str | None, inbox_prefix: str | None) -> None:
    """One-line errors for a domain or prefix no server would route."""
    if domain is not None and api_prefix is not None:
        raise ConfigurationError(
            "options domain (--js-domain) and apiPrefix (--js-api-prefix) are exclusive: a "
            "domain sets the API prefix $JS.<domain>.API; give one of them"
        )
    if domain is not None and not _DOMAIN.match(domain):
        raise ConfigurationError(
            f"option domain (--js-domain) {domain!r} is not a JetStream domain; give the domain "
            "name the servers set in jetstream { domain: ... }, without spaces, dots or wildcards"
        )
    if api_prefix is not None and not valid_publish_subject(api_prefix.rstrip(".")):
        raise ConfigurationError(
            f"option apiPrefix (--js-api-prefix) {api_prefix!r} is not a subject prefix; give "
            "the subject the JetStream API is imported under, e.g. JS.acme.API, without spaces "
            "or wildcards"
        )
    if inbox_prefix is not None and (
        inbox_prefix.endswith(".") or not valid_publish_subject(inbox_prefix)
    ):
        raise ConfigurationError(
            f"option inboxPrefix (--inbox-prefix) {inbox_prefix!r} is not an inbox prefix; give "
            "subject tokens without spaces, wildcards or a trailing dot, e.g. _INBOX_etl"
        )
