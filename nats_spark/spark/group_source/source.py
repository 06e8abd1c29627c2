"""The `nats-pcg` data source: Spark's entry points, delegating to the offset and slot readers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from nats_spark.errors import ConfigurationError
from nats_spark.spark.group_source.driver.offsets import SourceOffset
from nats_spark.spark.group_source.options import SourceOptions, parse_options
from nats_spark.spark.shared.compat import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from nats_spark.spark.shared.driver_calls import wait
from nats_spark.spark.shared.failures import one_line_errors
from nats_spark.spark.shared.schema import SCHEMA_DDL, check_schema
from nats_spark.spark.shared.stop_signal import stop_on_sigterm

# Spark starts a Python process to look the format up, another to create it, one to run the
# stream reader's driver calls and the workers that read: each imports this module, and only the
# last two need the driver's or the executors' half. Those halves are imported where they are
# used, so the processes that need neither skip about 0.3 CPU-s of imports each (nats-py,
# pyarrow's compute, asyncio: none of them is imported by this module or its options).
if TYPE_CHECKING:
    import pyarrow as pa

    from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator


class NatsPcgDataSource(DataSource):
    """`spark.readStream.format("nats-pcg")`: partitioned consumer groups and priority-group
    consumers of NATS JetStream."""

    @one_line_errors
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)  # bad options fail at load(), before any pull

    @classmethod
    def name(cls) -> str:
        return "nats-pcg"

    @one_line_errors
    def schema(self) -> str:
        """Spark asks at load() (without a schema of the user's): the target is checked here,
        so a wrong server, stream or group fails there, not when the query starts."""
        from nats_spark.spark.group_source.driver.preflight import check_target

        check_target(self.parsed)
        return SCHEMA_DDL

    @one_line_errors
    def reader(self, schema: Any) -> Any:
        check_schema(schema)
        raise ConfigurationError(
            "nats-pcg is a streaming source; use spark.readStream.format('nats-pcg')"
        )

    @one_line_errors
    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        try:
            check_schema(schema)
        except ConfigurationError as error:
            # Raised from here, pyspark's runner masks it (its cleanup then fails on the reader
            # it never got): the reader raises it on the query's first call, before any pull.
            return NatsPcgStreamReader(self.parsed, refused=error)
        return NatsPcgStreamReader(self.parsed)


class NatsPcgStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver calls go to an `BatchCoordinator` (made on first use, never pickled); `read` runs on
    executors from the partition alone."""

    def __init__(self, options: SourceOptions, refused: ConfigurationError | None = None) -> None:
        self.options = options
        self.refused = refused
        self._offsets: BatchCoordinator | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "refused": None, "_offsets": None}

    @property
    def offsets(self) -> BatchCoordinator:
        if self.refused is not None:
            raise self.refused
        if self._offsets is None:
            from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator

            self._offsets = BatchCoordinator(self.options)
            stop_on_sigterm()  # or Spark ends this process without calling `stop`
        return self._offsets

    @one_line_errors
    def initialOffset(self) -> dict[str, Any]:
        return wait(self.offsets.initial_offset()).to_json()

    @one_line_errors
    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict[str, Any]:
        begin = SourceOffset.from_json(start) if start else None
        max_rows = getattr(limit, "max_rows", None)
        return wait(self.offsets.latest_offset(begin, max_rows)).to_json()

    @one_line_errors
    def getDefaultReadLimit(self) -> Any:
        """Spark 4.2+ only (older versions never call it)."""
        if self.options.max_messages_per_trigger:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.offsets.report() if self._offsets else None

    @one_line_errors
    def prepareForTriggerAvailableNow(self) -> None:
        wait(self.offsets.prepare_available_now())

    @one_line_errors
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return wait(
            self.offsets.input_partitions(
                SourceOffset.from_json(start), SourceOffset.from_json(end)
            )
        )

    @one_line_errors
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from nats_spark.spark.group_source.slot_partition import PackedSlots, SlotPartition
        from nats_spark.spark.group_source.task.slot_reader import read_packed, read_slot

        if isinstance(partition, PackedSlots):
            yield from read_packed(partition)
        else:
            assert isinstance(partition, SlotPartition)
            yield from read_slot(partition)

    @one_line_errors
    def commit(self, end: dict) -> None:
        wait(self.offsets.commit(SourceOffset.from_json(end)))

    @one_line_errors
    def stop(self) -> None:
        if self._offsets is not None:
            wait(self._offsets.close())
            self._offsets = None
