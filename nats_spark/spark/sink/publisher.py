"""The `nats` format's writers: rows to JetStream, exactly once in the target stream.

Every row is published with a message id made of where it comes from: (query id, batch id,
Spark partition, row index) for a streaming write, (write id, Spark partition, row index) for a
batch write. Spark re-runs a failed task, a speculative copy, or after a driver restart the
logged batch, with the same rows in the same order (the `nats-pcg` source replays exactly; so
do files and other deterministic sources), so a re-published row carries the same id and the
stream's duplicate window drops it. A task reports success only once JetStream has confirmed
every row, or every row before one that cannot be published, which the driver then fails the
write or batch with (before it commits).
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark import SparkFiles, TaskContext
from pyspark import __version__ as pyspark_version
from pyspark.sql.datasource import WriterCommitMessage

from nats_spark.client import NatsClient, shared_client
from nats_spark.errors import ConfigurationError, NotFound, stream_missing
from nats_spark.jetstream.publish import ATOMIC_BATCH_MAX, OutMessage, Publisher, PublishStats
from nats_spark.jetstream.replies import StreamInfo
from nats_spark.jetstream.subject_names import SubjectCapture, valid_publish_subject
from nats_spark.loop import run_sync
from nats_spark.spark.sink.options import SinkOptions

log = logging.getLogger(__name__)

_WINDOW_WARNING = 10 * 60  # seconds: shorter duplicate windows are worth a warning
_QUERY_ID = "sql.streaming.queryId"  # local properties Spark sets for a streaming batch's tasks
_BATCH_ID = "streaming.sql.batchId"


@dataclass(frozen=True)
class SinkColumns:
    """Which input columns a write uses (checked against the DataFrame's schema)."""

    subject: bool  # a `subject` column (else the `subject` option for every row)
    headers: str | None  # None, "single" (map<string,string>) or "multi" (map<string,array>)


def sink_columns(schema: Any, options: SinkOptions) -> SinkColumns:
    """Check the DataFrame's columns: `data` (binary or string), `subject` (string, or the
    option), `headers` (map<string,string> or map<string,array<string>>); others are ignored."""
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    fix = "write a DataFrame with columns subject (string), data (binary or string), headers"
    if types.get("data") not in ("binary", "string"):
        found = f"has type {types['data']}" if "data" in types else "is missing"
        raise ConfigurationError(f"column data {found}; {fix}")
    if "subject" in types and types["subject"] != "string":
        raise ConfigurationError(f"column subject has type {types['subject']}; {fix}")
    if "subject" not in types and options.subject is None:
        raise ConfigurationError(
            "no subject: the DataFrame has no subject column and the subject option is not set; "
            "add one of them"
        )
    kinds = {"map<string,string>": "single", "map<string,array<string>>": "multi"}
    if "headers" in types and types["headers"] not in kinds:
        raise ConfigurationError(f"column headers has type {types['headers']}; {fix}")
    return SinkColumns("subject" in types, kinds.get(types.get("headers", "")))


def first_check(options: SinkOptions) -> bool:
    """Whether this is the first check of the target stream in this Spark application. Spark
    creates a streaming query's writer again for every micro-batch, in one of the driver's
    Python worker processes, so what the check says about the stream would repeat each batch: a
    marker file in the application's own directory (SparkFiles', removed when the application
    ends), named after the servers and the stream, tells across those processes."""
    target = f"{options.connection.described()} {options.stream}"
    name = hashlib.sha256(target.encode()).hexdigest()[:32]
    marker = os.path.join(SparkFiles.getRootDirectory(), f"nats-sink-checked-{name}")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


async def check_target(
    client: NatsClient, options: SinkOptions, say: bool = True, streaming: bool = True
) -> SinkOptions:
    """Before anything is published: the stream exists, the subject option lands in it, and its
    duplicate window (what bounds exactly once) is said (`say`; else at debug level). Returns
    the options with the atomic batch size settled: atomic batches where the stream allows
    them, unless told otherwise."""
    atomic = 0
    streams: list[dict[str, Any]] | None = None  # the target stream's config, once fetched
    if options.stream is not None:
        try:
            info = await client.api.stream_info(options.stream)
        except NotFound:
            raise stream_missing(options.stream, options.connection.described()) from None
        streams = [info["config"]]
        atomic = _atomic_batch(options, info, say)
        _say_window(options.stream, info.duplicate_window, say, streaming)
    if options.subject is not None:
        capture = SubjectCapture(streams or await _target_streams(client, options))
        _check_subject(capture, options, options.subject)
    return replace(options, atomic_batch=atomic)


def _say_window(stream: str, window: float, say: bool, streaming: bool) -> None:
    """A short duplicate window is a warning for a streaming write only: a restart re-runs its
    last batch with the same message ids, maybe after a longer outage. A batch write's ids are
    its own job's (a second save() is a new write), repeated only by its tasks' retries."""
    if say and streaming and window < _WINDOW_WARNING:
        log.warning(
            "nats sink warning: stream %s drops repeated message ids within %gs only "
            "(duplicate_window), so a batch a restart re-runs later than that is stored twice; "
            "set it to your longest outage: nats stream edit %s --dupe-window 1h",
            stream,
            window,
            stream,
        )
        return
    log.log(
        logging.INFO if say else logging.DEBUG,
        "stream %s drops repeated message ids within %gs",
        stream,
        window,
    )


def _atomic_batch(options: SinkOptions, info: StreamInfo, say: bool) -> int:
    level = logging.INFO if say else logging.DEBUG
    if info.allow_atomic:
        size = ATOMIC_BATCH_MAX if options.atomic_batch is None else options.atomic_batch
        log.log(level, "stream %s allows atomic batches: %d rows per batch", options.stream, size)
        return size
    if options.atomic_batch:
        raise ConfigurationError(
            f"stream {options.stream!r} does not allow atomic batches (allow_atomic, nats-server "
            "2.12+); enable it on the stream, or drop atomicBatchSize"
        )
    if options.atomic_batch is None:
        log.log(
            level,
            "stream %s does not allow atomic batches: rows are published one by one, and a "
            "failed task's rows are visible before its retry completes them (allow_atomic "
            "on the stream hides them)",
            options.stream,
        )
    return 0


async def _target_streams(client: NatsClient, options: SinkOptions) -> list[dict[str, Any]]:
    if options.stream is not None:
        return [(await client.api.stream_info(options.stream))["config"]]
    return await client.api.stream_configs()


def _check_subject(capture: SubjectCapture, options: SinkOptions, subject: str) -> None:
    stream = capture.stream_of(subject)
    if stream is None:
        where = f"stream {options.stream!r}" if options.stream else "no stream"
        raise ConfigurationError(
            f"subject {subject!r} is not captured by {where}; add it to the stream's subjects "
            "or fix the subject column or option"
        )


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one task wrote; `refused`: why it stopped at a row that cannot be published."""

    rows: int
    published: int
    duplicates: int
    resent: int
    batches: int
    refused: str | None = None


def _header_pairs(value: Any) -> list[tuple[str, str]]:
    """Header (name, value) pairs from a map cell: Arrow gives pairs, Rows give a dict; values
    are strings or lists of strings."""
    items = value.items() if isinstance(value, dict) else value or ()
    pairs = []
    for name, values in items:
        for one in [values] if isinstance(values, str) or values is None else values:
            if one is not None:
                pairs.append((name, one))
    return pairs


class PartitionPublisher:
    """Publishes one Spark partition's rows, checked chunk by chunk before they are sent."""

    def __init__(self, options: SinkOptions, columns: SinkColumns, id_prefix: str) -> None:
        self.options = options
        self.columns = columns
        self.prefix = id_prefix
        self.client = shared_client(options.connection)
        self.capture = SubjectCapture(run_sync(_target_streams(self.client, options)))
        self.publisher = Publisher(
            self.client.nc,
            options.max_pending,
            options.publish_timeout,
            options.connection.retry_timeout,
            options.atomic_batch or 0,
        )
        self.rows = 0
        self.checked: set[str] = set()  # subjects found publishable and captured

    def _messages(
        self, subjects: Sequence[str | None], data: Sequence[Any], headers: Sequence[Any]
    ) -> list[OutMessage]:
        messages = []
        for i, payload in enumerate(data):
            row = self.rows + i
            subject = subjects[i] if self.columns.subject else None
            subject = subject or self.options.subject
            if subject not in self.checked:
                if subject is None or not valid_publish_subject(subject):
                    raise ConfigurationError(
                        f"row {row} of the task has subject {subject!r}, which one cannot "
                        "publish to; fill the subject column (tokens without spaces or "
                        "wildcards) or set the subject option for rows without one"
                    )
                _check_subject(self.capture, self.options, subject)
                if len(self.checked) >= 100_000:  # many distinct keys: bound the memory
                    self.checked.clear()
                self.checked.add(subject)
            body = payload.encode() if isinstance(payload, str) else payload or b""
            pairs = _header_pairs(headers[i]) if self.columns.headers else []
            messages.append(OutMessage(subject, body, pairs, f"{self.prefix}.{row}"))
        self.rows += len(messages)
        return messages

    def publish(
        self, chunks: Iterable[tuple[Sequence[Any], Sequence[Any], Sequence[Any]]]
    ) -> SinkCommit:
        """Publish chunks of (subjects, data, headers) columns; returns the task's commit.

        A row that cannot be published (its subject) fails the same way on every attempt, so
        it does not fail the task, which Spark would run again up to spark.task.maxFailures
        times, each printing the error: publishing stops before its chunk, what was sent is
        confirmed, and the commit carries the error for the driver to raise once."""
        refused = None
        run_sync(self.publisher.start())
        try:
            for subjects, data, headers in chunks:
                try:
                    messages = self._messages(subjects, data, headers)
                except ConfigurationError as error:
                    refused = str(error)
                    break
                run_sync(self.publisher.send(messages))
            stats = run_sync(self.publisher.finish())
        finally:
            run_sync(self.publisher.stop())
        return SinkCommit(
            self.rows, stats.published, stats.duplicates, stats.resent, stats.batches, refused
        )


def raise_refused(messages: Sequence[Any]) -> None:
    """On the driver, before a write or batch commits: the first row a task refused, as the
    write's one error."""
    for message in messages:
        if isinstance(message, SinkCommit) and message.refused is not None:
            raise ConfigurationError(message.refused)


def arrow_chunks(
    batches: Iterator[pa.RecordBatch], columns: SinkColumns
) -> Iterator[tuple[Sequence[Any], Sequence[Any], Sequence[Any]]]:
    for batch in batches:
        names = batch.schema.names
        subjects = batch.column("subject").to_pylist() if columns.subject else ()
        headers = batch.column("headers").to_pylist() if "headers" in names else ()
        yield subjects, batch.column("data").to_pylist(), headers


def task_id_prefix(base: str | None) -> str:
    """`<base>.<partition>`; for a streaming write `base` is None and comes from the task:
    `<query id>.<batch id>`."""
    context = TaskContext.get()
    if context is None:
        raise ConfigurationError("the nats sink writes from Spark tasks only")
    if base is None:
        query, batch = context.getLocalProperty(_QUERY_ID), context.getLocalProperty(_BATCH_ID)
        if not query or batch is None:
            raise ConfigurationError(
                f"Spark {pyspark_version} gave this streaming write's task no query and batch id "
                f"(task properties {_QUERY_ID}, {_BATCH_ID}), which the nats sink's message ids "
                "are made of; write each batch in foreachBatch with df.write.format('nats') "
                "instead (exactly once within one write) and report the runtime's version"
            )
        base = f"{query}.{batch}"
    return f"{base}.{context.partitionId()}"


def new_write_id() -> str:
    """One id per batch write job: task retries within the job publish the same message ids."""
    return uuid.uuid4().hex


def log_commit(what: str, messages: Sequence[Any]) -> None:
    totals = PublishStats()
    rows = 0
    for message in messages:
        if isinstance(message, SinkCommit):
            rows += message.rows
            totals.published += message.published
            totals.duplicates += message.duplicates
            totals.resent += message.resent
            totals.batches += message.batches
    log.info(
        "%s: %d rows, %d stored (%d atomic batches), %d already stored by an earlier attempt "
        "(dropped by message id), %d sent again after a missing PubAck",
        what,
        rows,
        totals.published,
        totals.batches,
        totals.duplicates,
        totals.resent,
    )
