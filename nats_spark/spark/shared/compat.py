"""What differs between the Spark versions the formats run on (4.0 to 4.3), decided once here."""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamWriter

try:  # Spark 4.2+: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.0/4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so a reader class has one definition on every Spark version."""


try:  # Spark 4.1+: the streaming writer gets Arrow record batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamWriterBase
except ImportError:  # Spark 4.0: Rows
    StreamWriterBase = DataSourceStreamWriter  # type: ignore[assignment,misc]

__all__ = ["ReadAllAvailable", "ReadMaxRows", "StreamWriterBase", "SupportsTriggerAvailableNow"]
