"""Class data sharing for the suite's JVMs: run by spark-submit once per virtualenv, it loads the
classes a test's session loads (SQL, a Python UDF, a Python data source read in batch and as a
stream), and its driver JVM archives them when it exits (`-XX:ArchiveClassesAtExit`). Every JVM
the suite starts later maps them instead of loading them from Spark's jars: about 5.5 of the
~15 CPU-s each start costs on two cores (see `tests/conftest.py`).

    spark-submit --driver-java-options "-XX:ArchiveClassesAtExit=F" tests/spark_class_archive.py
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.functions import udf

from nats_spark.spark.local_session import local_session


class _Reader(DataSourceReader):
    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        yield (1,)


class _StreamReader(DataSourceStreamReader):
    def initialOffset(self) -> dict[str, int]:
        return {"at": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"at": 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(0), InputPartition(1)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        yield (1,)


class OneRow(DataSource):
    """A Python data source of one row, read in batch or as a stream (also the probe of
    bench/spark_floor.py)."""

    @classmethod
    def name(cls) -> str:
        return "one_row"

    def schema(self) -> str:
        return "x int"

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader()

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader()


def main() -> None:
    spark = local_session("nats-spark-class-archive")
    assert spark.range(10).count() == 10
    plus_one = udf(lambda x: x + 1, "long")
    assert spark.range(3).select(plus_one("id")).collect()[2][0] == 3
    spark.dataSource.register(OneRow)
    assert spark.read.format("one_row").load().collect()[0][0] == 1
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            spark.readStream.format("one_row")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
    spark.stop()


if __name__ == "__main__":
    main()
