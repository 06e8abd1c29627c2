"""The `nats` format: Spark's entry point for reading a whole stream (`stream_source/`) and for
writing DataFrames to JetStream (`sink/`).

`df.write.format("nats")` (append) and `df.writeStream.format("nats")`; see `sink/publisher.py`
for how rows become messages and why a re-run stores nothing twice. `spark.read.format("nats")`
and `spark.readStream.format("nats")` read ranges of stream sequences; see
`stream_source/stream_range.py` and `stream_source/stream_reader.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource

from nats_spark.errors import ConfigurationError
from nats_spark.spark.shared.failures import one_line_errors
from nats_spark.spark.shared.schema import SCHEMA_DDL, check_schema
from nats_spark.spark.stream_source.options import parse_read_options

# As in group_source/source.py: the processes Spark starts to look the format up or create it
# need neither the readers nor the writers, so those are imported where they are used.
if TYPE_CHECKING:
    from nats_spark.spark.sink.writers import NatsStreamWriter, NatsWriter
    from nats_spark.spark.stream_source.stream_range import RangeReader
    from nats_spark.spark.stream_source.stream_reader import RangeStreamReader


class NatsDataSource(DataSource):
    """`format("nats")`: writes to JetStream, and reads a whole stream without acks, consumers
    of its own or groups (`nats-pcg` reads groups and consumers)."""

    @classmethod
    def name(cls) -> str:
        return "nats"

    @one_line_errors
    def writer(self, schema: Any, overwrite: bool) -> NatsWriter:
        if overwrite:
            raise ConfigurationError("a NATS stream cannot be overwritten; use mode('append')")
        from nats_spark.spark.sink.publisher import new_write_id
        from nats_spark.spark.sink.writers import NatsWriter, prepare_write

        options, columns = prepare_write(self.options, schema, streaming=False)
        return NatsWriter(options, columns, new_write_id())

    @one_line_errors
    def streamWriter(self, schema: Any, overwrite: bool) -> NatsStreamWriter:
        from nats_spark.spark.sink.writers import NatsStreamWriter, prepare_write

        options, columns = prepare_write(self.options, schema, streaming=True)
        return NatsStreamWriter(options, columns)

    @one_line_errors
    def schema(self) -> str:
        """Spark asks at a read's load() (without a schema of the user's; writes never ask): the
        options, the servers and the stream are checked here, so a mistake fails there, not
        when the read runs or the query starts. Which options apply to batch or streaming reads
        only is checked when Spark asks for the reader, as load() does not say which it is."""
        from nats_spark.spark.shared.load_check import check_at_load

        options = parse_read_options(self.options, streaming=None)
        check_at_load(options.connection, options.stream)
        return SCHEMA_DDL

    @one_line_errors
    def reader(self, schema: Any) -> RangeReader:
        from nats_spark.spark.stream_source.pushdown import spark_pushes_filters
        from nats_spark.spark.stream_source.stream_range import FilteringRangeReader, RangeReader

        check_schema(schema, "nats")
        options = parse_read_options(self.options, streaming=False)
        return FilteringRangeReader(options) if spark_pushes_filters() else RangeReader(options)

    @one_line_errors
    def streamReader(self, schema: Any) -> RangeStreamReader:
        from nats_spark.spark.stream_source.stream_reader import RangeStreamReader

        check_schema(schema, "nats")
        return RangeStreamReader(parse_read_options(self.options, streaming=True))
