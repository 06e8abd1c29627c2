"""Driver kill -9 and restart from the checkpoint: still exactly once, nothing acked early."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spark_helpers import (
    assert_exactly_once,
    member_states,
    payloads,
    publish,
    static_group,
    wait_until,
)

pytestmark = pytest.mark.spark


def start_job(
    url: str, stream: str, out: Path, checkpoint: Path, log: Path, *options: str
) -> subprocess.Popen:
    """The streaming job in its own process group, so kill -9 takes its JVM along; `options`
    are more source options, `name=value`."""
    args = [
        sys.executable,
        "-m",
        "nats_spark.job",
        "--servers",
        url,
        "--stream",
        stream,
        "--group",
        "g",
        "--output",
        str(out),
        "--checkpoint",
        str(checkpoint),
        "--trigger",
        "200ms",
        "--master",
        "local[2]",
        "--option",
        "maxMessagesPerTrigger=150",
        "--option",
        "ackWait=5s",
        *(f"--option={option}" for option in options),
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen(
        args, stdout=log.open("a"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def kill_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def batches_logged(log: Path) -> int:
    return log.read_text().count("rows") if log.exists() else 0


@pytest.mark.timeout(600)  # three driver starts: a JVM each
def test_driver_kill_minus_nine_twice_then_restart(spark, client, nats_url, unique, tmp_path):
    stream = f"K{unique}"
    static_group(client, stream, "g", ["m1", "m2", "m3"], partitions=6)
    publish(client, stream, 1500)
    out, checkpoint, log = tmp_path / "out", tmp_path / "cp", tmp_path / "job.log"
    published = 1500
    for round_ in range(2):
        job = start_job(nats_url, stream, out, checkpoint, log)
        try:
            target = batches_logged(log) + 2 + round_
            wait_until(lambda t=target: batches_logged(log) >= t, 120, "batches to run")
            time.sleep(0.15 * (round_ + 1))  # land the kill at different points of a batch
        finally:
            kill_group(job)
        publish(client, stream, 500, start=published)
        published += 500
    job = start_job(nats_url, stream, out, checkpoint, log)
    try:
        wait_until(
            lambda: out.exists() and len(payloads(spark, str(out))) >= published,
            180,
            f"{published} rows after restart",
        )
        wait_until(
            lambda: all(
                s == {"pending": 0, "ack_pending": 0}
                for s in member_states(client, stream, "g").values()
            ),
            60,
            "every member acked",
        )
    finally:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(30)
        except subprocess.TimeoutExpired:
            kill_group(job)
    assert_exactly_once(payloads(spark, str(out)), published)
