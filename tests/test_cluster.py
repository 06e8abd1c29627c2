"""The job on a Spark standalone cluster (a master and two one-core workers of this venv's pyspark):
each group member is read on its own executor, exactly once, and everything is acked."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from spark_helpers import (
    JOB_FILE,
    Launched,
    assert_exactly_once,
    committed_rows,
    job_flags,
    launch,
    publish,
    row_payloads,
    settled,
    spark_bin,
    spark_env,
    static_group,
    wait_for_log,
)

from chaos.proxy import free_port

pytestmark = pytest.mark.spark

# A task of batch 0 as the driver logs it: "... Starting task 0.0 in stage 0.0 (TID 0)
# (127.0.0.1,executor 1, partition 0, ...)".
_BATCH_TASK = re.compile(
    r"\[batchId = 0\] Starting task \S+ in stage \S+ \(TID \d+\) \([^,]+,executor (\d+),"
)


@pytest.fixture(scope="module")
def master_url(tmp_path_factory) -> Iterator[str]:
    """A standalone master on loopback with two workers of one core each."""
    tmp = tmp_path_factory.mktemp("cluster")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    started: list[Launched] = []
    try:
        master = launch(
            "master",
            [
                spark_bin("spark-class"),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(free_port()),
            ],
            tmp,
            spark_env(),
        )
        started.append(master)
        for i in (1, 2):
            started.append(
                launch(
                    f"worker{i}",
                    [
                        spark_bin("spark-class"),
                        "org.apache.spark.deploy.worker.Worker",
                        url,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "1",
                        "--memory",
                        "1g",
                        "--webui-port",
                        str(free_port()),
                        "--work-dir",
                        str(tmp / f"work{i}"),
                    ],
                    tmp,
                    spark_env(),
                )
            )
        wait_for_log(master, "Registering worker", count=2, timeout=90)
        yield url
    finally:
        for process in reversed(started):  # workers first: they stop their executors
            process.stop()


def test_job_on_standalone_cluster_reads_each_member_on_its_own_executor(
    master_url: str, client, nats_url: str, unique: str, tmp_path: Path
) -> None:
    stream = f"C{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 400)
    started = time.monotonic()
    job = launch(
        "job",
        [
            spark_bin("spark-submit"),
            "--master",  # the job must keep the master spark-submit was given
            master_url,
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.executor.memory=512m",
            # Plan batch 0 only once both executors are there, so each member gets one
            # (the ratio counts against spark.cores.max: unset, it is met at once).
            "--conf",
            "spark.log.level=INFO",  # the task lines read below (the job's default is WARN)
            "--conf",
            "spark.cores.max=2",
            "--conf",
            "spark.scheduler.minRegisteredResourcesRatio=1.0",
            "--conf",
            "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
            JOB_FILE,
            "--group",
            "g",
            *job_flags(nats_url, stream, tmp_path),
        ],
        tmp_path / "logs",
        spark_env(),
    )
    try:
        code, out, err = job.wait(180)
    finally:
        job.stop()
    assert code == 0, job.tail()
    assert "batch 0: 400 rows" in out, out
    executors = set(_BATCH_TASK.findall(err))
    assert len(executors) == 2, f"batch 0 ran on executors {executors}"
    rows = committed_rows(tmp_path / "data")
    assert_exactly_once(row_payloads(rows), 400)
    assert {row["member"] for row in rows} == {"m1", "m2"}
    assert settled(client, stream, "g")
    print(f"job on the cluster took {time.monotonic() - started:.1f}s")
