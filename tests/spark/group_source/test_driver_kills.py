"""Driver kill -9 at fixed points of a batch (fault_driver.py, a query in a process of its own):
nothing of an uncommitted batch acked, its re-run replays the same rows, exactly once after the
restart; and a kept batch whose first sequence the stream moves on while its driver is dead.

Apart from test_faults.py (the other faults) so that the two workers of a lane share them: each
test here starts a JVM per driver start and takes minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import assert_exactly_once, publish, static_group, unacked, wait_until

from nats_spark.jetstream.acks import send_acks
from nats_spark.loop import run_sync
from nats_spark.spark.group_source.ledger import (
    EntryDeliveries,
    EntryState,
    Ledger,
    pointer_key,
    read_deliveries,
    read_head,
    read_pointer,
)

pytestmark = pytest.mark.spark  # each driver runs Spark in a process of its own

DRIVER = Path(__file__).with_name("fault_driver.py")


class Driver:
    """fault_driver.py in its own session: a foreachBatch query writing one JSON file per
    committed batch, which SIGKILLs its process group at the point it is told."""

    def __init__(self, url: str, stream: str, folder: Path) -> None:
        self.url, self.stream, self.folder = url, stream, folder
        self.out = folder / "out"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, kill_at: str, trigger: str = "200ms") -> None:
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYSPARK_SUBMIT_ARGS": "--conf spark.ui.enabled=false pyspark-shell",
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        args = [sys.executable, str(DRIVER), self.url, self.stream, str(self.out)]
        args += [str(self.folder / "cp"), kill_at, trigger]
        with (self.folder / "driver.log").open("ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def killed(self, timeout: float = 240) -> None:
        """Wait for the driver to kill itself at its fault point."""
        assert self.process is not None
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the driver never reached its fault point; see {self.folder}/driver.log")
        assert code == -signal.SIGKILL, f"driver exited with {code}; see {self.folder}/driver.log"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def files(self) -> dict[str, str]:
        if not self.out.exists():
            return {}
        return {f.name: f.read_text() for f in self.out.glob("batch-*.json")}

    def values(self) -> list[int]:
        return [v for text in self.files().values() for v in json.loads(text)]


@pytest.mark.compat("4.0")
@pytest.mark.timeout(900)  # four driver starts: a JVM each
def test_driver_killed_at_fixed_points(client, nats_url, unique, tmp_path):
    """The driver killed -9 while batch 0's tasks pull, after its sink wrote it (before Spark's
    commit log) and after the commit log (before the acks), restarted each time; then half of
    batch 0's acks sent, as a kill while acking leaves them, and restarted. Nothing is acked
    early, every re-run of batch 0 writes the same rows, and the last run reads everything
    exactly once.

    Not killed between the tasks' end and the sink's write: the source is then where it is after
    the write (every slot sealed, the batch logged, not committed), which `after_sink` covers; the
    sink's side of a kill there is test_sink.test_driver_killed_group_to_stream_exactly_once and
    the kill sweep's `commit` phase (test_chaos.test_kill_sweep)."""
    stream = f"DK{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    driver = Driver(nats_url, stream, tmp_path)
    published = 0

    def publish_more(count: int) -> None:
        nonlocal published
        publish(client, stream, count, start=published)
        published += count

    def assert_nothing_acked(point: str) -> None:
        # Guarantee 1: nothing of a batch that was not committed (and acked) is acked.
        assert unacked(client, stream, "g") == published, f"acked early ({point})"

    try:
        publish_more(300)
        # While tasks pull (a UDF on the rows: the restart takes their open entries over), and
        # after the sink's write before Spark's commit log (the restart replays the sealed
        # entries): batch 0 each time, re-run on restart.
        for point in ("pulling", "after_sink"):
            driver.start(point)
            driver.killed()
            assert_nothing_acked(point)
            publish_more(100)
        written = driver.files()
        assert list(written) == ["batch-0.json"], written

        # After the commit log: batch 0 is committed, its acks not sent.
        driver.start("after_commit_log", trigger="once")
        driver.killed()
        assert driver.files() == written, "the re-run of batch 0 must rewrite the same rows"
        assert_nothing_acked("after_commit_log")
        # Killed during the commit: half of batch 0's acks sent, its ledger entries not marked.
        kv = run_sync(Ledger.bucket(client.target, "nats-spark-ledger", create=False))
        pointer = run_sync(read_pointer(kv, pointer_key(stream, "g")))
        ledger = Ledger(kv, pointer.lineage)
        for gen, slot in run_sync(ledger.heads()):
            head, _ = run_sync(read_head(ledger, gen, slot))
            assert head.state is EntryState.SEALED, (gen, slot, head.state)
            every = run_sync(read_deliveries(ledger, head))
            seqs, consumer_seqs, counts = every.stream_seq, every.consumer_seq, every.delivered
            half = EntryDeliveries(every.prefix, seqs[::2], consumer_seqs[::2], counts[::2])
            run_sync(send_acks(client.nc, half.ack_commands(), len(half)))
        publish_more(100)

        driver.start("never")
        wait_until(lambda: len(driver.values()) >= published, 120, f"{published} rows")
        wait_until(lambda: unacked(client, stream, "g") == 0, 60, "every member acked")
        values = driver.values()
        if len(values) != len(set(values)):  # keep what explains it (seen once, in CI)
            print(ledger_story(kv, tmp_path / "cp", pointer.lineage, driver.files()))
    finally:
        driver.stop()
    assert_exactly_once(driver.values(), published)


def ledger_story(kv: Any, checkpoint: Path, pointer_lineage: str, files: dict[str, str]) -> str:
    """The offset log, every ledger entry of every lineage and the rows per batch file."""
    lines = [f"pointer lineage {pointer_lineage}"]
    for offset in sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name)):
        lines.append(f"offsets/{offset.name}: {offset.read_text().splitlines()[-1]}")
    lineages = {
        json.loads(o.read_text().splitlines()[-1])["lineage"]
        for o in (checkpoint / "offsets").glob("[0-9]*")
    } | {pointer_lineage}
    for lineage in sorted(lineages):
        ledger = Ledger(kv, lineage)
        for gen, slot in sorted(run_sync(ledger.heads())):
            head, _ = run_sync(read_head(ledger, gen, slot))
            seqs = sorted(run_sync(read_deliveries(ledger, head)).stream_seq)
            lines.append(f"{lineage} gen {gen} {slot}: {head.state} {len(seqs)} {seqs[:3]}..")
    for name, text in sorted(files.items()):
        rows = json.loads(text)
        lines.append(f"{name}: {len(rows)} rows {sorted(rows)[:3]}..")
    return "\n".join(lines)


def test_first_sequence_moves_under_a_kept_batch(client, nats_url, unique, tmp_path):
    """Batch 0 (100 messages) is committed and its driver killed before the acks: its entry is
    kept (sealed, acks due). The stream's max_msgs then drops the batch's first 50 messages while
    they are pending, and a purge later drops everything read. The restarted query acks what is
    left of batch 0, reads the rest once, settles batch 0's entry once nothing can come back (the
    first sequence is past it, or the ack floor), neither stops nor re-reads, and keeps reading
    after the purge."""
    stream = f"FS{unique}"
    static_group(client, stream, "g", ["m1"], partitions=1)
    driver = Driver(nats_url, stream, tmp_path)
    publish(client, stream, 100)

    def gens() -> list[int]:
        kv = run_sync(Ledger.bucket(client.target, "nats-spark-ledger", create=False))
        pointer = run_sync(read_pointer(kv, pointer_key(stream, "g")))
        assert pointer is not None
        return [gen for gen, _ in run_sync(Ledger(kv, pointer.lineage).heads())]

    try:
        driver.start("after_commit_log", trigger="once")
        driver.killed()
        assert sorted(driver.values()) == list(range(100))
        assert gens() == [1], "batch 0's entry is kept for its acks"
        config = run_sync(client.api.stream_info(stream)).config
        run_sync(client.api.update_stream({**config, "max_msgs": 120}))
        publish(client, stream, 70, start=100)
        assert run_sync(client.api.stream_info(stream)).first_seq == 51
        driver.start("never")
        wait_until(lambda: len(driver.values()) >= 170, 180, "170 rows after the restart")
        wait_until(lambda: unacked(client, stream, "g") == 0, 60, "every message acked")
        wait_until(lambda: 1 not in gens(), 120, "batch 0's entry settled")
        run_sync(client.api.request(f"STREAM.PURGE.{stream}", {}))
        publish(client, stream, 30, start=170)
        wait_until(lambda: len(driver.values()) >= 200, 120, "the rows after the purge")
        wait_until(lambda: unacked(client, stream, "g") == 0, 60, "every message acked")
        assert driver.process is not None and driver.process.poll() is None, "the query stopped"
    finally:
        driver.stop()
    assert_exactly_once(driver.values(), 200)
