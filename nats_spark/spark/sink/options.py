"""The options of writes to NATS (format `nats`), parsed and validated."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConfigurationError
from nats_spark.jetstream.publish import ATOMIC_BATCH_MAX
from nats_spark.jetstream.subject_names import valid_publish_subject
from nats_spark.spark.shared.options import CONNECTION_OPTIONS, OptionValues, check_name

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
        stream=check_name("stream", stream) if stream else None,
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
