"""What the formats' options share (Spark passes them all as strings): the connection options,
starting positions, the trigger sizes, and how a value is read and checked. Each format's own
options live with it: `group_source.options`, `stream_source.options`, `sink.options`."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nats_spark.connection import ConnectionSettings, parse_servers, with_credentials
from nats_spark.errors import ConfigurationError

# A duration is one or more `<number><unit>` parts: `500ms`, `30s`, `2m`, `1h`, or as Spark
# writes intervals (trigger intervals, watermarks): `30 seconds`, `1 minute 30 seconds`,
# `interval 5 minutes`; a bare number is seconds.
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)\s*")
_UNIT_SECONDS = {
    **dict.fromkeys(("ms", "msec", "msecs", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
}
_NAME = re.compile(r"^[^\s.*>/\\]{1,255}$")

# Canonical option names with a one-line description (the README tables mirror these).
CONNECTION_OPTIONS: dict[str, str] = {
    "servers": "comma list of NATS URLs (required)",
    "creds": "path of a .creds file (or $NATS_CREDS)",
    "token": "auth token (or tokenFile, or $NATS_TOKEN)",
    "tokenFile": "path of a file holding the auth token",
    "user": "user name (or $NATS_USER)",
    "password": "password (or passwordFile, or $NATS_PASSWORD)",
    "passwordFile": "path of a file holding the password",
    "nkeySeed": "path of an nkey seed file",
    "tlsCaCert": "path of the CA certificate that signs the server's",
    "tlsCert": "path of the client certificate (mutual TLS)",
    "tlsKey": "path of the client key (mutual TLS)",
    "connectTimeout": "connect timeout (default 5s)",
    "retryTimeout": "how long NATS calls are retried while JetStream has no leader (default 60s)",
    "domain": "JetStream domain of the stream, e.g. through a leaf node (default: none)",
    "apiPrefix": "subject prefix of a JetStream API imported from another account (default "
    "$JS.API; not with domain)",
    "inboxPrefix": "prefix of the reply inboxes (default _INBOX)",
}
SECRET_OPTIONS = frozenset({"token", "password"})
DEFAULT_MAX_TRIGGER_DELAY = 900.0  # 15 minutes, as Kafka's maxTriggerDelay


def _seconds(text: str) -> float | None:
    """The seconds `text` writes (see `_DURATION_PART`); None when it is no duration."""
    rest = text.strip().lower().removeprefix("interval").strip()
    if not rest or not re.fullmatch(f"(?:{_DURATION_PART.pattern})+", rest):
        return None
    parts = _DURATION_PART.findall(rest)
    seconds = 0.0
    for number, unit in parts:
        if unit not in _UNIT_SECONDS or (not unit and len(parts) > 1):
            return None
        seconds += float(number) * _UNIT_SECONDS[unit]
    return seconds


def parse_duration(name: str, text: str) -> float:
    """Seconds from `500ms`, `30s`, `2m`, `1h`, a bare number of seconds, or a Spark interval
    such as `30 seconds` or `1 minute`."""
    seconds = _seconds(text)
    if seconds is None:
        raise ConfigurationError(
            f"option {name}={text!r} is not a duration; use e.g. 500ms, 30s or 2m "
            "(or as Spark writes intervals: 30 seconds, 1 minute)"
        )
    if seconds <= 0:
        raise ConfigurationError(f"option {name} must be positive, got {text!r}")
    return seconds


def parse_int(name: str, text: str, low: int = 1, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigurationError(f"option {name}={text!r} is not a whole number") from None
    if value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ConfigurationError(f"option {name}={value} is out of range; use a number {bounds}")
    return value


def parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigurationError(f"option {name}={text!r} is not a boolean; use true or false")


def check_name(option: str, value: str) -> str:
    if not _NAME.match(value):
        raise ConfigurationError(
            f"option {option}={value!r} is not a valid NATS name; names have no spaces, "
            "'.', '*', '>', '/' or '\\'"
        )
    return value


@dataclass(frozen=True)
class StartingPosition:
    """Where consumers the source creates for a static group start (existing ones keep theirs)."""

    text: str = "earliest"  # as given, for messages
    deliver: dict[str, Any] = field(default_factory=lambda: {"deliver_policy": "all"})


def parse_starting_position(text: str, option: str = "startingPosition") -> StartingPosition:
    """`earliest`, `latest`, `sequence:<n>` (that message first) or `time:<ISO-8601>`."""
    kind, _, value = text.strip().partition(":")
    kind = kind.lower()
    if kind == "earliest" and not value:
        return StartingPosition()
    if kind == "latest" and not value:
        return StartingPosition("latest", {"deliver_policy": "new"})
    if kind == "sequence" and value.strip().isdigit() and int(value) > 0:
        seq = int(value)
        return StartingPosition(text, {"deliver_policy": "by_start_sequence", "opt_start_seq": seq})
    if kind == "time":
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            when = None
        if when is not None:
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            stamp = when.astimezone(UTC).isoformat().replace("+00:00", "Z")
            return StartingPosition(
                text, {"deliver_policy": "by_start_time", "opt_start_time": stamp}
            )
    raise ConfigurationError(
        f"option {option}={text!r} is not valid; use earliest, latest, sequence:<n> "
        "(n from 1) or time:<ISO-8601>, e.g. time:2026-11-23T08:00:00Z"
    )


# Options of Spark's Kafka source and sink (in lower case, as Spark passes them) and the options
# of ours that do their job; a format names those it knows. Kafka's `failOnDataLoss`,
# `includeHeaders` and `maxTriggerDelay` are ours too.
_KAFKA_OPTIONS: dict[str, tuple[str, ...]] = {
    "kafka.bootstrap.servers": ("servers",),
    "subscribe": ("stream", "group", "consumer", "subjects"),
    "subscribepattern": ("stream", "group", "consumer", "subjects"),
    "assign": ("stream", "group", "consumer", "members", "subjects"),
    "topic": ("subject", "stream"),
    "kafka.group.id": ("group", "consumer"),
    "groupidprefix": ("group", "consumer"),
    "startingoffsets": ("startingPosition",),
    "startingtimestamp": ("startingPosition",),
    "startingoffsetsbytimestamp": ("startingPosition",),
    "endingoffsets": ("endingPosition",),
    "endingtimestamp": ("endingPosition",),
    "maxoffsetspertrigger": ("maxMessagesPerTrigger",),
    "minoffsetspertrigger": ("minMessagesPerTrigger",),
    "minpartitions": ("numPartitions",),
    "kafka.security.protocol": ("creds", "user", "token", "tlsCaCert"),
}


def _unknown_option(key: str, canonical: Mapping[str, str]) -> str:
    """The error for an option no format knows, naming the nearest known one or, for a Kafka
    option, the ones of ours that do its job. `key` is as Spark passes it: in lower case (its
    option maps ignore case), whatever the user typed."""
    lowered = key.lower()
    ours = [canonical[o.lower()] for o in _KAFKA_OPTIONS.get(lowered, ()) if o.lower() in canonical]
    if not ours and lowered.startswith(("kafka.sasl.", "kafka.ssl.")):
        ours = [canonical[o.lower()] for o in _KAFKA_OPTIONS["kafka.security.protocol"]]
    if ours:
        return f"unknown option {key!r} (a Kafka option); use {_either(ours)}"
    nearest = difflib.get_close_matches(lowered, canonical, n=1)
    guess = f"did you mean {canonical[nearest[0]]}? " if nearest else ""
    return f"unknown option {key!r}; {guess}known options: {', '.join(canonical.values())}"


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class OptionValues:
    """Option strings under their canonical names (Spark passes names in any case), with the
    typed readers every option goes through."""

    def __init__(self, raw: Mapping[str, str], known: Mapping[str, str]) -> None:
        canonical = {name.lower(): name for name in known}
        self.values: dict[str, str] = {}
        for key, value in raw.items():
            name = canonical.get(key.lower())
            if name is None:
                if key.lower() in ("path", "checkpointlocation", "queryname"):
                    continue  # Spark adds these for some call paths
                raise ConfigurationError(_unknown_option(key, canonical))
            self.values[name] = str(value)

    def take(self, name: str) -> str | None:
        """The value, None when absent or blank."""
        value = self.values.get(name)
        return value if value is None or value.strip() else None

    def required(self, name: str, example: str) -> str:
        value = self.take(name)
        if value is None:
            raise ConfigurationError(f"option {name} is required; set it to {example}")
        return value

    def optional_int(self, name: str, low: int = 1, high: int | None = None) -> int | None:
        text = self.take(name)
        return None if text is None else parse_int(name, text, low, high)

    def int_or(self, name: str, default: int, low: int = 1, high: int | None = None) -> int:
        """The whole number, `default` when absent."""
        number = self.optional_int(name, low, high)
        return default if number is None else number

    def duration(self, name: str, default: float) -> float:
        text = self.take(name)
        return default if text is None else parse_duration(name, text)

    def flag(self, name: str, default: bool) -> bool:
        text = self.take(name)
        return default if text is None else parse_bool(name, text)

    def trigger_sizes(self) -> tuple[int | None, int | None, float]:
        """maxMessagesPerTrigger, minMessagesPerTrigger and maxTriggerDelay, checked together."""
        most, least = (
            self.optional_int("maxMessagesPerTrigger"),
            self.optional_int("minMessagesPerTrigger"),
        )
        if least is None and self.take("maxTriggerDelay") is not None:
            raise ConfigurationError(
                "option maxTriggerDelay applies only with minMessagesPerTrigger; set "
                "minMessagesPerTrigger or drop maxTriggerDelay"
            )
        if least is not None and most is not None and least > most:
            raise ConfigurationError(
                f"option minMessagesPerTrigger={least} is above maxMessagesPerTrigger={most}; "
                "give a minimum at or below the maximum"
            )
        return most, least, self.duration("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY)

    def connection(self, name: str) -> ConnectionSettings:
        """The connection options (`CONNECTION_OPTIONS`) as settings; `name` is the client's
        connection name on the server."""
        take = self.take
        servers = self.required("servers", "e.g. nats://host:4222")
        return with_credentials(
            {
                "user": take("user"),
                "password": self.values.get("password"),
                "token": take("token"),
                "creds": take("creds"),
                "nkey_seed": take("nkeySeed"),
            },
            {
                "password": ("passwordFile", take("passwordFile")),
                "token": ("tokenFile", take("tokenFile")),
            },
            servers=parse_servers(servers),
            tls_ca_cert=take("tlsCaCert"),
            tls_cert=take("tlsCert"),
            tls_key=take("tlsKey"),
            connect_timeout=self.duration("connectTimeout", ConnectionSettings.connect_timeout),
            retry_timeout=self.duration("retryTimeout", ConnectionSettings.retry_timeout),
            domain=take("domain"),
            api_prefix=take("apiPrefix"),
            inbox_prefix=take("inboxPrefix"),
            name=name,
        )
