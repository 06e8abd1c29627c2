"""One availableNow read in a process of its own, as spark-submit runs a job: Python and Spark
start, the query runs to the end (its final commit included), then the process ends. Prints one
JSON line before Spark stops: the read's figures (`bench.connector.available_now`) and the CPU
of every process of the job counted from its start (start-up included), by kind.

    python bench/fresh_job.py URL STREAM GROUP EXPECTED_ROWS OPTIONS_JSON

`bench/cases.py` runs it and times it from the process start to that line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ProcessSampler  # noqa: E402


def main() -> None:
    url, stream, group, expected, options = sys.argv[1:]
    with ProcessSampler(interval=0.1, since_start=True) as job:
        from bench.connector import available_now, spark_session

        spark = spark_session()
        figures = available_now(spark, url, stream, group, int(expected), json.loads(options))
    print(json.dumps({**figures, "job_cpu_seconds": job.cpu_seconds()}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
