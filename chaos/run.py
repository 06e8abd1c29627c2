"""Randomised soak: the streaming job reads an elastic group while messages are published and
faults strike at random; at the end every published message must be committed exactly once and
acked.

Faults: NATS server kill -9 and restart, driver kill -9 (the job's whole process group), admin
unpin of a member, deletion of a member consumer. A job that dies of a fault is restarted, as a
supervisor would. The run ends with a table; the exit code is 1 if anything was lost, duplicated
or left unacked.

    .venv/bin/python chaos/run.py --minutes 3 [--seed N] [--rate 200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.parquet as pq

from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NatsSparkError, NotFound
from nats_spark.loop import Blocking, run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.config import PartitioningFilter
from nats_spark.pcg.consumers import PRIORITY_GROUP
from nats_spark.pcg.partitioning import elastic_stream_name
from nats_spark.server import EmbeddedServer

STREAM, GROUP, MEMBERS, PARTITIONS = "CHAOS", "eg", ["a", "b", "c"], 6
FAULTS = ("server kill -9", "driver kill -9", "unpin", "consumer deleted")


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


class Publisher(threading.Thread):
    """Publishes `<n>` to `CHAOS.k<n % 37>` at about `rate` per second. Each message carries
    `Nats-Msg-Id: <n>`, so resending a chunk whose confirmation was lost stores nothing twice;
    `published` counts only what JetStream confirmed."""

    def __init__(self, client: Blocking[NatsClient], rate: int) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.rate = rate
        self.published = 0
        self.halt = threading.Event()

    async def _send(self, first: int, count: int) -> None:
        js = self.client.target.js
        await asyncio.gather(
            *(
                js.publish(f"{STREAM}.k{n % 37}", str(n).encode(), headers={"Nats-Msg-Id": str(n)})
                for n in range(first, first + count)
            )
        )

    def run(self) -> None:
        chunk = max(1, self.rate // 10)
        while not self.halt.is_set():
            began = time.monotonic()
            try:
                run_sync(self._send(self.published, chunk), timeout=15)
                self.published += chunk
            except Exception:  # server down or restarting: the same numbers again
                time.sleep(0.5)
                continue
            time.sleep(max(0.0, chunk / self.rate - (time.monotonic() - began)))


class Job:
    """`python -m nats_spark.job` in its own process group (so kill -9 takes its JVM along)."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.folder = folder
        self.output = folder / "out"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            "nats_spark.job",
            "--servers",
            self.url,
            "--stream",
            STREAM,
            "--group",
            GROUP,
            "--output",
            str(self.output),
            "--checkpoint",
            str(self.folder / "cp"),
            "--trigger",
            "500ms",
            "--master",
            "local[2]",
            "--option",
            "ackWait=5s",
            "--option",
            "maxMessagesPerTrigger=3000",
        ]
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYSPARK_SUBMIT_ARGS": "--conf spark.ui.enabled=false pyspark-shell",
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        with (self.folder / "job.log").open("ab") as out:
            self.process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def committed(self) -> list[int]:
        """Payload numbers in the files the file sink committed (its `_spark_metadata` log)."""
        files: set[str] = set()
        metadata = self.output / "_spark_metadata"
        if not metadata.exists():
            return []
        for entry in metadata.iterdir():
            if entry.name.startswith("."):
                continue
            for line in entry.read_text().splitlines()[1:]:
                record = json.loads(line)
                if record["action"] == "add":
                    files.add(urlparse(record["path"]).path)
        return [
            int(value)
            for file in sorted(files)
            for value in pq.read_table(file, columns=["data"]).column("data").to_pylist()
        ]


def group_consumers(client: Blocking[NatsClient]) -> list[tuple[str, str]]:
    """The consumers the job reads the group through (either layout): those on its work-queue
    stream."""
    stream = elastic_stream_name(STREAM, GROUP)
    return [(stream, name) for name in run_sync(client.api.consumer_names(stream))]


def unacked(client: Blocking[NatsClient]) -> int:
    """Messages in the group's work-queue stream: every message stays there until acked."""
    return run_sync(client.api.stream_info(elastic_stream_name(STREAM, GROUP)))["state"]["messages"]


def inject(kind: str, rng: random.Random, server: EmbeddedServer, job: Job, client) -> None:
    if kind == "server kill -9":
        server.kill()
        time.sleep(rng.uniform(0.2, 2.0))
        server.start()
    elif kind == "driver kill -9":
        job.kill()
        time.sleep(rng.uniform(0.0, 2.0))
        job.start()
    else:
        consumers = group_consumers(client)
        if not consumers:
            return  # between a deletion and the job's next batch
        stream, name = rng.choice(consumers)
        if kind == "unpin":
            run_sync(client.api.unpin(stream, name, PRIORITY_GROUP))
        else:
            run_sync(client.api.delete_consumer(stream, name))


def soak(args: argparse.Namespace, folder: Path) -> int:
    rng = random.Random(args.seed)
    faults: Counter[str] = Counter()
    with EmbeddedServer() as server:
        client = open_blocking(ConnectionSettings(servers=(server.url,), name="chaos"))
        run_sync(client.api.create_stream({"name": STREAM, "subjects": [f"{STREAM}.*"]}))
        filters = [PartitioningFilter(f"{STREAM}.*", [1])]
        run_sync(admin.create_elastic(client.target, STREAM, GROUP, PARTITIONS, filters))
        run_sync(admin.add_members(client.target, STREAM, GROUP, MEMBERS))
        publisher = Publisher(client, args.rate)
        job = Job(server.url, folder)
        publisher.start()
        job.start()
        log(f"soak for {args.minutes} min, seed {args.seed}, work dir {folder}")
        end = time.monotonic() + args.minutes * 60
        try:
            while time.monotonic() < end:
                time.sleep(rng.uniform(4, 12))
                if not job.running:
                    log("the job ended (a fault failed its query): restarting it")
                    job.start()
                kind = rng.choice(FAULTS)
                try:
                    inject(kind, rng, server, job, client)
                except (NatsSparkError, NotFound) as error:  # e.g. the consumer is gone already
                    log(f"{kind}: not injected ({error})")
                    continue
                faults[kind] += 1
                log(f"{kind} (published {publisher.published})")
            publisher.halt.set()
            publisher.join(30)
            log(f"publishing stopped at {publisher.published}; draining")
            drain_end = time.monotonic() + args.drain
            left = -1
            while time.monotonic() < drain_end:
                if not job.running:
                    log("the job ended: restarting it")
                    job.start()
                left = unacked(client)
                if left == 0 and len(set(job.committed())) >= publisher.published:
                    break
                time.sleep(2)
        finally:
            publisher.halt.set()
            job.stop()
            run_sync(client.target.close())
        rows = job.committed()
        published = set(range(publisher.published))
        lost = len(published - set(rows))
        duplicated = len(rows) - len(set(rows))
        table = [
            ("faults injected", sum(faults.values())),
            *((f"  {kind}", faults[kind]) for kind in FAULTS),
            ("job starts", job.starts),
            ("messages published", publisher.published),
            ("rows committed", len(rows)),
            ("lost", lost),
            ("duplicated", duplicated),
            ("unacked", left),
        ]
        width = max(len(name) for name, _ in table)
        print()
        for name, value in table:
            print(f"{name:<{width}}  {value:>8}")
        return 1 if lost or duplicated or left else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="how long faults strike")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--rate", type=int, default=200, help="messages published per second")
    parser.add_argument("--drain", type=float, default=300.0, help="seconds allowed to catch up")
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="nats-spark-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    code = soak(args, folder)
    if code == 0 and not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    elif code:
        print(f"job log, output and checkpoint kept in {folder}")
    return code


if __name__ == "__main__":
    sys.exit(main())
