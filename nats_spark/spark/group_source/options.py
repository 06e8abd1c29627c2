"""The options of format `nats-pcg` (a partitioned consumer group or a plain priority-group
consumer), parsed and validated."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, TypeVar

from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConfigurationError, option_not_applicable
from nats_spark.pcg.kinds import ConsumerLayout, GroupKind
from nats_spark.spark.shared.options import (
    CONNECTION_OPTIONS,
    DEFAULT_MAX_TRIGGER_DELAY,
    OptionValues,
    StartingPosition,
    check_name,
    parse_starting_position,
)

# Canonical option names with a one-line description (the README tables mirror these).
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
    "maxTasksPerBatch": "read the partitions in at most this many Spark tasks per micro-batch",
    "fetchBatchSize": "messages per pull request (default 4096)",
    "fetchTimeout": "how long a pull waits for messages (default 1s)",
    "includeHeaders": "true | false (default true)",
    "ledgerBucket": "KV bucket of the ack ledger (default nats-spark-ledger)",
    "failOnDataLoss": "true | false (default true)",
}

# Spark's processes that look the format up, create it and plan its reads parse these options and
# never pull: what the reading tasks need (and its import of nats-py) is imported in `reading`.
if TYPE_CHECKING:
    from nats_spark.spark.group_source.slot_partition import SlotReading


@dataclass(frozen=True)
class SourceOptions:
    """Validated options of one query. Picklable; secrets live only in `connection`."""

    connection: ConnectionSettings
    stream: str
    group: str | None = None
    group_type: GroupKind | None = None  # None: auto, as the group's KV entry says
    members: tuple[str, ...] | None = None
    consumer_layout: ConsumerLayout | None = None  # None: auto (`GroupLayouts.choose`)
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
    max_tasks_per_batch: int | None = None  # None: a task per partition (slot)
    fetch_batch_size: int = 4096
    fetch_timeout: float = 1.0
    include_headers: bool = True
    ledger_bucket: str = "nats-spark-ledger"
    fail_on_data_loss: bool = True

    @property
    def target(self) -> str:
        """What the query reads, for messages and ledger keys."""
        return f"{self.stream}/{self.group or self.consumer}"

    @property
    def reading(self) -> SlotReading:
        """What its tasks need of these options, whatever slot and batch they read."""
        from nats_spark.jetstream.pull_loop import Thresholds
        from nats_spark.spark.group_source.slot_partition import SlotReading

        return SlotReading(
            connection=self.connection,
            ledger_bucket=self.ledger_bucket,
            fetch_batch_size=self.fetch_batch_size,
            fetch_timeout=self.fetch_timeout,
            include_headers=self.include_headers,
            fail_on_data_loss=self.fail_on_data_loss,
            thresholds=Thresholds(self.min_pending, self.min_ack_pending, self.priority),
        )


Choice = TypeVar("Choice", bound=StrEnum)


def _auto_or(option: str, text: str | None, choices: tuple[Choice, ...]) -> Choice | None:
    """The one of `choices` the option names (in any case); None for auto, the default."""
    value = (text or "auto").lower()
    for choice in choices:
        if value == choice.value:
            return choice
    if value != "auto":
        named = ", ".join(choice.value for choice in choices[:-1])
        raise ConfigurationError(
            f"option {option}={value!r} is not valid; use auto, {named} or {choices[-1].value}"
        )
    return None


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Validate `raw` (case-insensitive keys, string values) into `SourceOptions`."""
    values = OptionValues(raw, KNOWN_OPTIONS)
    take, number, duration, flag = values.take, values.int_or, values.duration, values.flag
    stream, group, consumer = _what_is_read(values)
    group_type = _auto_or("groupType", take("groupType"), (GroupKind.STATIC, GroupKind.ELASTIC))
    _refuse_the_other_reads_options(values, consumer is not None)
    layouts = (ConsumerLayout.PARTITION, ConsumerLayout.MEMBER)
    consumer_layout = _auto_or("consumerLayout", take("consumerLayout"), layouts)
    most, least, delay = values.trigger_sizes()
    members = _members(take("members"))
    return SourceOptions(
        connection=values.connection(f"nats-spark {stream}/{group or consumer}"),
        stream=check_name("stream", stream),
        group=_name_or_none("group", group),
        group_type=group_type,
        members=members,
        consumer_layout=consumer_layout,
        starting_position=_starting_position(take("startingPosition")),
        consumer=_name_or_none("consumer", consumer),
        priority_group=take("priorityGroup"),
        min_pending=number("minPending", SourceOptions.min_pending),
        min_ack_pending=number("minAckPending", SourceOptions.min_ack_pending),
        priority=values.optional_int("priority", 0, 9),
        num_partitions=number("numPartitions", SourceOptions.num_partitions, 1, 1024),
        ack_wait=duration("ackWait", SourceOptions.ack_wait),
        max_ack_pending=number("maxAckPending", SourceOptions.max_ack_pending),
        max_messages_per_trigger=most,
        min_messages_per_trigger=least,
        max_trigger_delay=delay,
        max_messages_per_partition=values.optional_int("maxMessagesPerPartition"),
        max_tasks_per_batch=values.optional_int("maxTasksPerBatch", 1, 100_000),
        fetch_batch_size=number("fetchBatchSize", SourceOptions.fetch_batch_size, 1, 100_000),
        fetch_timeout=duration("fetchTimeout", SourceOptions.fetch_timeout),
        include_headers=flag("includeHeaders", SourceOptions.include_headers),
        ledger_bucket=check_name(
            "ledgerBucket", take("ledgerBucket") or SourceOptions.ledger_bucket
        ),
        fail_on_data_loss=flag("failOnDataLoss", SourceOptions.fail_on_data_loss),
    )


def _what_is_read(values: OptionValues) -> tuple[str, str | None, str | None]:
    """The stream, and the group or the consumer read from it (exactly one)."""
    if values.take("servers") is None:
        raise ConfigurationError("option servers is required; set it to e.g. nats://host:4222")
    stream = values.required("stream", "the stream's name")
    group, consumer = values.take("group"), values.take("consumer")
    if (group is None) == (consumer is None):
        raise ConfigurationError(
            "set exactly one of the options group (a partitioned consumer group) and consumer "
            "(a plain priority-group consumer)"
        )
    return stream, group, consumer


_GROUP_ONLY = (
    "groupType",
    "members",
    "consumerLayout",
    "startingPosition",
    "ackWait",
    "maxAckPending",
)
_CONSUMER_ONLY = ("priorityGroup", "minPending", "minAckPending", "priority", "numPartitions")


def _refuse_the_other_reads_options(values: OptionValues, consumer_read: bool) -> None:
    """Options of group reads on a consumer read, or the other way round, are refused."""
    for name in _GROUP_ONLY if consumer_read else _CONSUMER_ONLY:
        if values.take(name) is not None:
            raise option_not_applicable(name, "consumer reads" if consumer_read else "group reads")


def _members(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    members = tuple(check_name("members", m.strip()) for m in text.split(",") if m.strip())
    if not members:
        raise ConfigurationError("option members is empty; list member names or omit it")
    return members


def _name_or_none(option: str, name: str | None) -> str | None:
    return check_name(option, name) if name else None


def _starting_position(text: str | None) -> StartingPosition | None:
    return None if text is None else parse_starting_position(text)
