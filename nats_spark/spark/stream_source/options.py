"""The options of reads of a whole stream (format `nats`), parsed and validated."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConfigurationError, option_not_applicable
from nats_spark.spark.shared.options import (
    CONNECTION_OPTIONS,
    DEFAULT_MAX_TRIGGER_DELAY,
    OptionValues,
    StartingPosition,
    check_name,
    parse_starting_position,
)

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


def parse_read_options(raw: Mapping[str, str], streaming: bool | None) -> ReadOptions:
    """Validate the options of `spark.read.format("nats")` / `readStream.format("nats")`;
    `streaming` None (at load(), which does not say) leaves out the check of the options that
    apply to batch or streaming reads only."""
    values = OptionValues(raw, READ_OPTIONS)
    take = values.take
    stream = check_name("stream", values.required("stream", "the name of the stream to read"))
    streaming_only = ("maxMessagesPerTrigger", "minMessagesPerTrigger", "maxTriggerDelay")
    for name in ("endingPosition", *streaming_only):
        given = take(name) is not None
        if given and streaming is not None and (name in streaming_only) != streaming:
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
        fetch_batch_size=values.int_or("fetchBatchSize", ReadOptions.fetch_batch_size, 1, 100_000),
    )
