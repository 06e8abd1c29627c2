"""The `nats` format's writers, as Spark calls them: a batch write and a streaming write, each
task publishing its rows through a `PartitionPublisher` (see `publisher.py` for message ids)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from nats_spark.client import NatsClient
from nats_spark.loop import run_sync
from nats_spark.spark.shared.compat import StreamWriterBase
from nats_spark.spark.shared.failures import one_line_errors
from nats_spark.spark.sink.options import SinkOptions, parse_sink_options
from nats_spark.spark.sink.publisher import (
    PartitionPublisher,
    SinkColumns,
    arrow_chunks,
    check_target,
    first_check,
    log_commit,
    raise_refused,
    sink_columns,
    task_id_prefix,
)


def prepare_write(
    raw: Mapping[str, str], schema: Any, streaming: bool
) -> tuple[SinkOptions, SinkColumns]:
    """Options, columns and the target checked on the driver, before any task publishes."""
    options = parse_sink_options(raw)
    columns = sink_columns(schema, options)
    # A streaming write's writer is made again for every micro-batch: it says things once.
    say = first_check(options) if streaming else True
    return _checked(options, say, streaming), columns


def check_sink(raw: Mapping[str, str]) -> None:
    """A streaming write's options, servers and target, checked before its query starts, where
    the package starts it (the job): Spark asks a Python sink nothing before its first
    micro-batch, which waits for the first input (`prepare_write` checks again then)."""
    _checked(parse_sink_options(raw), say=False, streaming=True)


def _checked(options: SinkOptions, say: bool, streaming: bool) -> SinkOptions:
    async def check() -> SinkOptions:
        client = await NatsClient.open(options.connection)
        try:
            return await check_target(client, options, say, streaming)
        finally:
            await client.close()

    return run_sync(check())


def _rows_chunks(
    rows: Iterator[Any], columns: SinkColumns, size: int = 4096
) -> Iterator[tuple[Sequence[Any], Sequence[Any], Sequence[Any]]]:
    """Column chunks from Rows (Spark 4.0's streaming writer)."""
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield _columns_of(chunk, columns)
            chunk = []
    if chunk:
        yield _columns_of(chunk, columns)


def _columns_of(
    rows: list[Any], columns: SinkColumns
) -> tuple[Sequence[Any], Sequence[Any], Sequence[Any]]:
    subjects = [row["subject"] for row in rows] if columns.subject else []
    headers = [row["headers"] for row in rows] if columns.headers else []
    return subjects, [row["data"] for row in rows], headers


class NatsWriter(DataSourceArrowWriter):
    """`df.write.format("nats")`: one write id per job, shared by the retries of its tasks."""

    def __init__(self, options: SinkOptions, columns: SinkColumns, write_id: str) -> None:
        self.options = options
        self.columns = columns
        self.write_id = write_id

    @one_line_errors
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        publisher = PartitionPublisher(self.options, self.columns, task_id_prefix(self.write_id))
        return publisher.publish(arrow_chunks(iterator, self.columns))

    @one_line_errors
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        raise_refused(messages)
        log_commit(f"write {self.write_id}", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log_commit(f"write {self.write_id} failed; what its tasks stored stays", messages)


class NatsStreamWriter(StreamWriterBase):
    """`df.writeStream.format("nats")`: message ids from the query id and the batch id."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    @one_line_errors
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        publisher = PartitionPublisher(self.options, self.columns, task_id_prefix(None))
        first = next(iterator, None)
        if first is None:
            return publisher.publish(())
        rest = _chain(first, iterator)
        if isinstance(first, pa.RecordBatch):
            return publisher.publish(arrow_chunks(rest, self.columns))
        return publisher.publish(_rows_chunks(rest, self.columns))

    @one_line_errors
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        raise_refused(messages)
        log_commit(f"batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log_commit(f"batch {batchId} failed; Spark runs it again", messages)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
