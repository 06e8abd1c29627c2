"""Driver kill -9 and restart from the checkpoint: still exactly once, nothing acked early."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from spark_helpers import (
    assert_exactly_once,
    batches_logged,
    committed_rows,
    kill_group,
    member_states,
    publish,
    row_payloads,
    settled,
    start_job,
    static_group,
    wait_until,
)

from nats_spark.client import NatsClient
from nats_spark.loop import Blocking

# Not `compat`: the older Sparks' driver kills run at fixed points of a batch
# (test_driver_kills.test_driver_killed_at_fixed_points); this one, at timed points, on the newest.
pytestmark = [pytest.mark.spark]


def written(out: Path) -> list[int]:
    """The payloads the job's file sink committed to `out` (what Spark reads back), read without
    a Spark session of the test's own."""
    return row_payloads(committed_rows(out)) if (out / "_spark_metadata").exists() else []


def assert_nothing_acked_early(
    client: Blocking[NatsClient], stream: str, out: Path, published: int
) -> None:
    """With the driver dead, the messages acked are at most the distinct rows committed to `out`:
    a message is acked only after the batch holding it committed."""
    states = member_states(client, stream, "g").values()
    acked = published - sum(s["pending"] + s["ack_pending"] for s in states)
    committed = len(set(written(out)))
    assert acked <= committed, f"{acked} messages acked, only {committed} rows committed"


@pytest.mark.timeout(600)  # three driver starts: a JVM each
def test_driver_kill_minus_nine_twice_then_restart(client, nats_url, unique, tmp_path):
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
        assert_nothing_acked_early(client, stream, out, published)
        publish(client, stream, 500, start=published)
        published += 500
    job = start_job(nats_url, stream, out, checkpoint, log)
    try:
        wait_until(
            lambda: len(written(out)) >= published, 180, f"{published} rows after restart", 1.0
        )
        wait_until(lambda: settled(client, stream), 60, "every member acked")
    finally:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(30)
        except subprocess.TimeoutExpired:
            kill_group(job)
    assert_exactly_once(written(out), published)
