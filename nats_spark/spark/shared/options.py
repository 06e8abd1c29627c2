"""Every source option, parsed and validated in one place (Spark passes them all as strings)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nats_spark.connection import ConnectionSettings, credentials, parse_servers
from nats_spark.errors import ConfigurationError, option_not_applicable
from nats_spark.jetstream.publish import ATOMIC_BATCH_MAX
from nats_spark.jetstream.subjects import valid_publish_subject

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
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
KNOWN_OPTIONS: dict[str, str] = {
    **CONNECTION_OPTIONS,
    "stream": "the stream the group or consumer reads (required)",
    "group": "partitioned consumer group name (this or consumer)",
    "groupType": "auto | static | elastic (default auto)",
    "members": "comma list of members to read (default all)",
    "consumer": "an existing priority-group pull consumer (instead of group)",
    "priorityGroup": "priority group of that consumer (default its only group)",
    "minPending": "overflow: pull only when num_pending reaches this",
    "minAckPending": "overflow: pull only when num_ack_pending reaches this",
    "priority": "prioritized: 0-9, lower served first",
    "numPartitions": "parallel pulls per batch on a plain consumer (default 1)",
    "consumerLayout": "auto | partition | member: a consumer per partition or member (auto)",
    "startingPosition": "earliest | latest | sequence:<n> | time:<ISO-8601>, for new consumers",
    "ackWait": "ack wait of the consumers the source creates (default 30s)",
    "maxAckPending": "max ack pending of the consumers the source creates (default 100000)",
    "maxMessagesPerTrigger": "cap on messages per micro-batch over all partitions",
    "minMessagesPerTrigger": "hold a micro-batch back until this many messages are available",
    "maxTriggerDelay": "longest hold for minMessagesPerTrigger (default 15m)",
    "maxMessagesPerPartition": "cap on messages per partition per micro-batch",
    "fetchBatchSize": "messages per pull request (default 4096)",
    "fetchTimeout": "how long a pull waits for messages (default 1s)",
    "includeHeaders": "true | false (default true)",
    "ledgerBucket": "KV bucket of the ack ledger (default nats-spark-ledger)",
    "failOnDataLoss": "true | false (default true)",
}
SECRET_OPTIONS = frozenset({"token", "password"})
DEFAULT_MAX_TRIGGER_DELAY = 900.0  # 15 minutes, as Kafka's maxTriggerDelay


def parse_duration(name: str, text: str) -> float:
    """Seconds from `500ms`, `30s`, `2m`, `1h` or a bare number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigurationError(
            f"option {name}={text!r} is not a duration; use e.g. 500ms, 30s or 2m"
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
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


def _check_name(option: str, value: str) -> str:
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


@dataclass(frozen=True)
class SourceOptions:
    """Validated options of one query. Picklable; secrets live only in `connection`."""

    connection: ConnectionSettings
    stream: str
    group: str | None = None
    group_type: str = "auto"
    members: tuple[str, ...] | None = None
    consumer_layout: str = "auto"
    starting_position: StartingPosition | None = None  # None: not given (earliest)
    consumer: str | None = None
    priority_group: str | None = None
    min_pending: int = 0
    min_ack_pending: int = 0
    priority: int | None = None
    num_partitions: int = 1
    ack_wait: float = 30.0
    max_ack_pending: int = 100_000
    max_messages_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY
    max_messages_per_partition: int | None = None
    fetch_batch_size: int = 4096
    fetch_timeout: float = 1.0
    include_headers: bool = True
    ledger_bucket: str = "nats-spark-ledger"
    fail_on_data_loss: bool = True

    @property
    def target(self) -> str:
        """What the query reads, for messages and ledger keys."""
        return f"{self.stream}/{self.group or self.consumer}"


def _unknown_option(key: str, canonical: Mapping[str, str]) -> str:
    """The error for an option no format knows, naming the nearest known one. `key` is as Spark
    passes it: in lower case (its option maps ignore case), whatever the user typed."""
    nearest = difflib.get_close_matches(key.lower(), canonical, n=1)
    guess = f"did you mean {canonical[nearest[0]]}? " if nearest else ""
    return f"unknown option {key!r}; {guess}known options: {', '.join(canonical.values())}"


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
        auth = credentials(
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
        )
        return ConnectionSettings(
            servers=parse_servers(servers),
            user=auth["user"],
            password=auth["password"],
            token=auth["token"],
            nkey_seed=auth["nkey_seed"],
            creds=auth["creds"],
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


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Validate `raw` (case-insensitive keys, string values) into `SourceOptions`."""
    values = OptionValues(raw, KNOWN_OPTIONS)
    take, optional_int, duration, flag = (
        values.take,
        values.optional_int,
        values.duration,
        values.flag,
    )
    if take("servers") is None:
        raise ConfigurationError("option servers is required; set it to e.g. nats://host:4222")
    stream = values.required("stream", "the stream's name")
    group, consumer = take("group"), take("consumer")
    if (group is None) == (consumer is None):
        raise ConfigurationError(
            "set exactly one of the options group (a partitioned consumer group) and consumer "
            "(a plain priority-group consumer)"
        )
    group_type = (take("groupType") or "auto").lower()
    if group_type not in ("auto", "static", "elastic"):
        raise ConfigurationError(
            f"option groupType={group_type!r} is not valid; use auto, static or elastic"
        )
    group_only = (
        "groupType",
        "members",
        "consumerLayout",
        "startingPosition",
        "ackWait",
        "maxAckPending",
    )
    consumer_only = ("priorityGroup", "minPending", "minAckPending", "priority", "numPartitions")
    for name in group_only if consumer else consumer_only if group else ():
        if take(name) is not None:
            raise option_not_applicable(name, "consumer reads" if consumer else "group reads")
    consumer_layout = (take("consumerLayout") or SourceOptions.consumer_layout).lower()
    if consumer_layout not in ("auto", "partition", "member"):
        raise ConfigurationError(
            f"option consumerLayout={consumer_layout!r} is not valid; use auto, partition or member"
        )
    most, least, delay = values.trigger_sizes()
    members = None
    if (text := take("members")) is not None:
        members = tuple(_check_name("members", m.strip()) for m in text.split(",") if m.strip())
        if not members:
            raise ConfigurationError("option members is empty; list member names or omit it")
    return SourceOptions(
        connection=values.connection(f"nats-spark {stream}/{group or consumer}"),
        stream=_check_name("stream", stream),
        group=_check_name("group", group) if group else None,
        group_type=group_type,
        members=members,
        consumer_layout=consumer_layout,
        starting_position=None
        if (position := take("startingPosition")) is None
        else parse_starting_position(position),
        consumer=_check_name("consumer", consumer) if consumer else None,
        priority_group=take("priorityGroup"),
        min_pending=optional_int("minPending") or SourceOptions.min_pending,
        min_ack_pending=optional_int("minAckPending") or SourceOptions.min_ack_pending,
        priority=optional_int("priority", 0, 9),
        num_partitions=optional_int("numPartitions", 1, 1024) or SourceOptions.num_partitions,
        ack_wait=duration("ackWait", SourceOptions.ack_wait),
        max_ack_pending=optional_int("maxAckPending") or SourceOptions.max_ack_pending,
        max_messages_per_trigger=most,
        min_messages_per_trigger=least,
        max_trigger_delay=delay,
        max_messages_per_partition=optional_int("maxMessagesPerPartition"),
        fetch_batch_size=optional_int("fetchBatchSize", 1, 100_000)
        or SourceOptions.fetch_batch_size,
        fetch_timeout=duration("fetchTimeout", SourceOptions.fetch_timeout),
        include_headers=flag("includeHeaders", SourceOptions.include_headers),
        ledger_bucket=_check_name(
            "ledgerBucket", take("ledgerBucket") or SourceOptions.ledger_bucket
        ),
        fail_on_data_loss=flag("failOnDataLoss", SourceOptions.fail_on_data_loss),
    )


SINK_OPTIONS: dict[str, str] = {
    **CONNECTION_OPTIONS,
    "subject": "subject of rows without a subject column (or with a null subject)",
    "stream": "the stream every subject must land in (checked before publishing)",
    "publishAsyncMaxPending": "publishes in flight per task (default 4096)",
    "publishTimeout": "how long to wait for a PubAck before sending again (default 5s)",
    "atomicBatchSize": "rows per atomic batch when the stream option names a stream with "
    "allow_atomic (default 1000; 0: row by row)",
}


@dataclass(frozen=True)
class SinkOptions:
    """Validated options of a write to NATS (format `nats`). Picklable."""

    connection: ConnectionSettings
    subject: str | None = None
    stream: str | None = None
    max_pending: int = 4096
    publish_timeout: float = 5.0
    # Rows per atomic batch (0: row by row); None: not given, the stream decides (`check_target`).
    atomic_batch: int | None = None


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    """Validate the options of `df.write.format("nats")` / `writeStream.format("nats")`."""
    values = OptionValues(raw, SINK_OPTIONS)
    subject, stream = values.take("subject"), values.take("stream")
    if subject is not None and not valid_publish_subject(subject):
        raise ConfigurationError(
            f"option subject={subject!r} is not a subject one can publish to; use tokens "
            "without spaces or wildcards, e.g. orders.enriched"
        )
    return SinkOptions(
        connection=values.connection(f"nats-spark sink {stream or subject or ''}".rstrip()),
        subject=subject,
        stream=_check_name("stream", stream) if stream else None,
        max_pending=values.optional_int("publishAsyncMaxPending", 1, 1_000_000)
        or SinkOptions.max_pending,
        publish_timeout=values.duration("publishTimeout", SinkOptions.publish_timeout),
        atomic_batch=_atomic_batch(
            values.optional_int("atomicBatchSize", 0, ATOMIC_BATCH_MAX), stream
        ),
    )


def _atomic_batch(size: int | None, stream: str | None) -> int | None:
    if size and stream is None:
        raise ConfigurationError(
            "option atomicBatchSize needs the stream option: atomic batches go to one stream, "
            "which must have allow_atomic; set stream, or drop atomicBatchSize"
        )
    return size


READ_OPTIONS: dict[str, str] = {
    **CONNECTION_OPTIONS,
    "stream": "the stream to read (required)",
    "subjects": "comma list of filter subjects, wildcards allowed (default all)",
    "startingPosition": "earliest | latest | sequence:<n> | time:<ISO-8601> (default earliest)",
    "endingPosition": "batch reads: latest | sequence:<n> | time:<ISO-8601>, inclusive (latest)",
    "numPartitions": "Spark partitions per read or micro-batch (default: by range size)",
    "maxMessagesPerTrigger": "streaming: cap on stream sequences per micro-batch",
    "minMessagesPerTrigger": "streaming: hold a micro-batch back until this many sequences",
    "maxTriggerDelay": "streaming: longest hold for minMessagesPerTrigger (default 15m)",
    "includeHeaders": "true | false (default true)",
    "readPath": "auto | consumer | direct: an ephemeral consumer (auto) or batch direct get",
    "fetchBatchSize": "messages per request (default 4096)",
}
READ_PATHS = ("auto", "consumer", "direct")


@dataclass(frozen=True)
class ReadOptions:
    """Validated options of a read of a whole stream (format `nats`). Picklable."""

    connection: ConnectionSettings
    stream: str
    subjects: tuple[str, ...] = ()
    starting_position: StartingPosition = field(default_factory=StartingPosition)
    ending_position: StartingPosition | None = None  # None: the stream's last message
    num_partitions: int | None = None  # None: by range size
    max_messages_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY
    include_headers: bool = True
    read_path: str = "auto"
    fetch_batch_size: int = 4096


def _check_filter_subject(subject: str) -> str:
    tokens = subject.split(".")
    if not all(t and not any(c.isspace() for c in t) for t in tokens) or ">" in tokens[:-1]:
        raise ConfigurationError(
            f"option subjects has {subject!r}, which is not a filter subject; use tokens without "
            "spaces, '*' for one token and '>' only last, e.g. orders.*,audit.>"
        )
    return subject


def _position_order(start: StartingPosition, end: StartingPosition) -> None:
    """Refuse an end given before the start, when both are sequences or both times."""
    for key, parse in (("opt_start_seq", int), ("opt_start_time", datetime.fromisoformat)):
        both = key in start.deliver and key in end.deliver
        if both and parse(end.deliver[key]) < parse(start.deliver[key]):  # type: ignore[operator]
            raise ConfigurationError(
                f"option endingPosition={end.text!r} is before startingPosition="
                f"{start.text!r}; give an end at or after the start"
            )


def parse_read_options(raw: Mapping[str, str], streaming: bool) -> ReadOptions:
    """Validate the options of `spark.read.format("nats")` / `readStream.format("nats")`."""
    values = OptionValues(raw, READ_OPTIONS)
    take = values.take
    stream = _check_name("stream", values.required("stream", "the name of the stream to read"))
    streaming_only = ("maxMessagesPerTrigger", "minMessagesPerTrigger", "maxTriggerDelay")
    for name in ("endingPosition", *streaming_only):
        if take(name) is not None and (name in streaming_only) != streaming:
            where = "streaming reads (readStream)" if streaming else "batch reads (read)"
            raise option_not_applicable(name, where)
    subjects: tuple[str, ...] = ()
    if (text := take("subjects")) is not None:
        subjects = tuple(_check_filter_subject(s.strip()) for s in text.split(",") if s.strip())
    starting = parse_starting_position(take("startingPosition") or "earliest")
    ending = None
    if (text := take("endingPosition")) is not None:
        ending = parse_starting_position(text, "endingPosition")
        if ending.deliver["deliver_policy"] == "all":
            raise ConfigurationError(
                "option endingPosition=earliest is not valid; use latest, sequence:<n> or "
                "time:<ISO-8601>"
            )
        _position_order(starting, ending)
    most, least, delay = values.trigger_sizes()
    read_path = (take("readPath") or "auto").lower()
    if read_path not in READ_PATHS:
        raise ConfigurationError(
            f"option readPath={read_path!r} is not valid; use {', '.join(READ_PATHS)}"
        )
    return ReadOptions(
        connection=values.connection(f"nats-spark read {stream}"),
        stream=stream,
        subjects=subjects,
        starting_position=starting,
        ending_position=ending,
        num_partitions=values.optional_int("numPartitions", 1, 10_000),
        max_messages_per_trigger=most,
        min_messages_per_trigger=least,
        max_trigger_delay=delay,
        include_headers=values.flag("includeHeaders", ReadOptions.include_headers),
        read_path=read_path,
        fetch_batch_size=values.optional_int("fetchBatchSize", 1, 100_000)
        or ReadOptions.fetch_batch_size,
    )
