"""Spark's own cost per row of a Python source's record batches: what no connector can go below.

A trivial Python data source yields the same record batch of the source schema (16,384 rows,
`--size`-byte payloads, built once per task) over and over, 8 partitions, into the `noop` sink,
in a warm session (a 20,000-row read first); then N and 4N rows. Prints one JSON line: the CPU
seconds of every process kind at both sizes and the marginal CPU per row between them (the
Python workers' is Spark taking the batches from `read()` to the JVM).

    python bench/worker_floor.py [--rows 250000] [--size 100]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402

from bench.cases import _marginal  # noqa: E402
from bench.common import ProcessSampler  # noqa: E402
from bench.connector import spark_session  # noqa: E402
from nats_spark.arrays import bytes_array, int_array  # noqa: E402
from nats_spark.spark.shared.columns import (  # noqa: E402
    ARROW_SCHEMA,
    BATCH_ROWS,
    constant,
    headers_array,
    timestamps_from_nanos,
)
from nats_spark.spark.shared.schema import SCHEMA_FIELDS  # noqa: E402

PARTITIONS = 8


def record_batch(size: int) -> pa.RecordBatch:
    """One record batch of the source schema: 1,000 subjects, random payloads, no headers."""
    n = BATCH_ROWS
    return pa.record_batch(
        [
            bytes_array([b"k%d" % (i % 1000) for i in range(n)], pa.string()),
            bytes_array([os.urandom(size) for _ in range(n)]),
            headers_array([None] * n, True),
            constant(3, n, pa.int32()),
            constant("m0", n, pa.string()),
            constant("FLOOR", n, pa.string()),
            int_array(range(n)),
            int_array(range(n)),
            constant(1, n, pa.int32()),
            timestamps_from_nanos([time.time_ns()] * n),
        ],
        schema=ARROW_SCHEMA,
    )


class FloorReader(DataSourceReader):
    def __init__(self, rows: int, size: int) -> None:
        self.rows, self.size = rows, size

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(PARTITIONS)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batch, left = record_batch(self.size), self.rows // PARTITIONS
        while left > 0:
            yield batch.slice(0, min(BATCH_ROWS, left))
            left -= BATCH_ROWS


class Floor(DataSource):
    @classmethod
    def name(cls) -> str:
        return "worker_floor"

    def schema(self) -> str:
        return ", ".join(f"{name} {kind}" for name, kind in SCHEMA_FIELDS)

    def reader(self, schema: Any) -> FloorReader:
        return FloorReader(int(self.options["rows"]), int(self.options["size"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=250_000, help="N (then 4N)")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    args = parser.parse_args()
    spark = spark_session()
    spark.dataSource.register(Floor)
    spent = {}
    for rows in (20_000, args.rows, 4 * args.rows):
        with ProcessSampler(0.1) as sampler:
            reader = spark.read.format("worker_floor").option("rows", rows)
            reader.option("size", args.size).load().write.format("noop").mode("overwrite").save()
        spent[rows] = sampler.cpu_seconds()
    figures = {
        "rows": args.rows,
        "size": args.size,
        "cpu_seconds": {"N": spent[args.rows], "4N": spent[4 * args.rows]},
        "marginal_cpu_us_per_row": _marginal(spent[args.rows], spent[4 * args.rows], args.rows),
    }
    print(json.dumps({"bench": "worker_floor", **figures}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
