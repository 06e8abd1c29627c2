"""The floor under any fresh-process job with a Python data source: Spark's own start, no NATS.

In a process of its own, as spark-submit runs a job: Python and the JVM start, a session is made
(as the bench's), and a trivial Python data source yields one row to `collect()`. Prints one JSON
line: the seconds from the process start to the session and to the end of that read, and the CPU
of every process of the job by kind at both points. `bench/cases.py` runs it beside the fresh
job, so a fresh ratio can be read against what no connector can avoid.

    python bench/spark_floor.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

STARTED = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ProcessSampler  # noqa: E402


def main() -> None:
    with ProcessSampler(interval=0.05, since_start=True) as job:
        from bench.connector import spark_session
        from tests.spark_class_archive import OneRow

        spark = spark_session()
        session = {"seconds": round(time.time() - STARTED, 2), "cpu_seconds": job.cpu_seconds()}
        spark.dataSource.register(OneRow)
        spark.read.format("one_row").load().collect()
        read = {"seconds": round(time.time() - STARTED, 2), "cpu_seconds": job.cpu_seconds()}
    print(json.dumps({"session": session, "one_row_python_source_read": read}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
