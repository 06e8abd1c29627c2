"""Shared pieces of the benchmarks: streams, groups, publishing, timing and memory sampling."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

import psutil

from nats_spark.client import NatsClient
from nats_spark.pcg import admin

PARTITIONS = 8
KEYS = 64  # distinct subjects (`<stream>.k<i>`), spread over the partitions by the server's hash


async def create_stream(client: NatsClient, stream: str, partitions: int = PARTITIONS) -> None:
    """A stream over `<stream>.*` storing `<partition>.<stream>.<key>` (what groups read)."""
    await client.api.create_stream(
        {
            "name": stream,
            "subjects": [f"{stream}.*"],
            "subject_transform": {
                "src": f"{stream}.*",
                "dest": f"{{{{partition({partitions},1)}}}}.{stream}.{{{{wildcard(1)}}}}",
            },
            "storage": "file",
        }
    )


async def create_group(
    client: NatsClient, stream: str, group: str, members: int, partitions: int = PARTITIONS
) -> list[str]:
    """A balanced static group of `members` members `m0..`; returns their names."""
    names = [f"m{i}" for i in range(members)]
    await admin.create_static(client, stream, group, partitions, members=names)
    return names


async def publish(
    client: NatsClient,
    stream: str,
    count: int,
    size: int,
    keys: int = KEYS,
    ids: bool = False,
    rate: float | None = None,
) -> float:
    """Publish `count` messages of `size` bytes over `keys` subjects, each confirmed by JetStream
    (with a message id each when `ids`), at most `rate` a second when given; returns msgs/s.

    Publishes are pipelined (many in flight, one reply subscription) so setup stays short.
    """
    nc = client.nc
    inbox = nc.new_inbox()
    window = asyncio.Semaphore(2000)
    done = asyncio.Event()
    acked = 0

    async def on_ack(msg: Any) -> None:
        nonlocal acked
        if b'"error"' in msg.data:
            raise RuntimeError(f"publish failed: {msg.data.decode()}")
        acked += 1
        window.release()
        if acked == count:
            done.set()

    sub = await nc.subscribe(f"{inbox}.*", cb=on_ack, pending_msgs_limit=-1)
    body = os.urandom(size)
    start = time.perf_counter()
    for i in range(count):
        await window.acquire()
        headers = {"Nats-Msg-Id": f"bench.{i}"} if ids else None
        await nc.publish(f"{stream}.k{i % keys}", body, reply=f"{inbox}.{i}", headers=headers)
        # Paced on a schedule (a late sleep is caught up), sleeping a millisecond or more at once.
        if rate is not None and (ahead := (i + 1) / rate - (time.perf_counter() - start)) > 1e-3:
            await asyncio.sleep(ahead)
    await asyncio.wait_for(done.wait(), timeout=300)
    elapsed = time.perf_counter() - start
    await sub.unsubscribe()
    return count / elapsed


class ProcessSampler:
    """Peak RSS and CPU time of this process tree while active, sampled on a thread, by kind:
    this (driver) process, the JVM, Spark's Python workers, the streaming source's runner,
    nats-server and a latency run's publisher (psutil reads each process's /proc/<pid>/stat
    and, for Python processes, its command line). CPU time counts from each process's first
    sample (or its start, if new; every process's start with `since_start`). A process that
    ends between samples loses the CPU it spent since the last one: compare runs of two sizes
    for marginal costs."""

    def __init__(self, interval: float = 0.2, since_start: bool = False) -> None:
        self.root = psutil.Process()
        self.interval = interval
        self.since_start = since_start
        self._kinds: dict[int, tuple[str, str | None]] = {}  # pid: (name, kind)
        self.peaks: dict[str, int] = {}
        self._cpu: dict[int, tuple[str, float, float]] = {}  # pid: (kind, first, last)
        self._known: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _kind(self, proc: psutil.Process, name: str) -> str | None:
        if proc.pid == self.root.pid:
            return "driver_python"
        if name.startswith("java"):
            return "jvm"
        if name.startswith("nats-server"):
            return "nats_server"
        if name.startswith("python"):
            command = proc.cmdline()
            if any("streaming_source_runner" in arg for arg in command):
                return "source_runner"
            if any(arg.endswith("steady_publisher.py") for arg in command):
                return "publisher"  # bench/steady_publisher.py, the load of a latency run
            return "python_worker"  # Spark's daemon and the workers it forks
        return None

    def _sample(self, first: bool = False) -> None:
        workers_total = 0
        for proc in [self.root, *self.root.children(recursive=True)]:
            try:
                # Classified again when the name changes: a new process runs its launcher (the
                # JVM's jspawnhelper, the spark-submit script) before it execs what it is.
                name = proc.name()
                if self._kinds.get(proc.pid, ("",))[0] != name:
                    self._kinds[proc.pid] = name, self._kind(proc, name)
                kind = self._kinds[proc.pid][1]
                if kind is None:
                    continue
                rss = proc.memory_info().rss
                times = proc.cpu_times()
            except psutil.Error:
                continue
            cpu = times.user + times.system
            start = self._cpu.get(proc.pid, (kind, 0.0 if not first else cpu, 0.0))[1]
            self._cpu[proc.pid] = (kind, start, cpu)
            if kind == "python_worker":
                workers_total += rss
            self.peaks[kind] = max(self.peaks.get(kind, 0), rss)
        self.peaks["python_workers_total"] = max(
            self.peaks.get("python_workers_total", 0), workers_total
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ProcessSampler:
        self._sample(first=not self.since_start)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def mib(self) -> dict[str, float]:
        """Peak RSS per kind (python_worker: the largest single worker)."""
        return {f"{kind}_mib": round(rss / 2**20, 1) for kind, rss in sorted(self.peaks.items())}

    def _spent(self) -> dict[str, float]:
        spent: dict[str, float] = {}
        for kind, first, last in self._cpu.values():
            spent[kind] = spent.get(kind, 0.0) + last - first
        spent["total"] = sum(spent.values())
        return dict(sorted(spent.items()))

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time by kind and in all, in seconds."""
        return {kind: round(seconds, 3) for kind, seconds in self._spent().items()}

    def cpu_us_per_msg(self, messages: int) -> dict[str, float]:
        """CPU time per message by kind and in all, in microseconds."""
        return {kind: round(s / messages * 1e6, 1) for kind, s in self._spent().items()}


class WrittenBytes:
    """Messages and bytes (subject, header block and payload, as published) written to the
    subjects `pattern` matches while started: what a run writes to a KV bucket's stream
    (`$KV.<bucket>.>`), counted by a plain subscription."""

    def __init__(self, client: NatsClient, pattern: str) -> None:
        self.client, self.pattern = client, pattern
        self.messages = self.bytes = 0
        self._sub: Any = None

    async def _count(self, msg: Any) -> None:
        headers = msg.headers or {}
        block = sum(len(k) + len(v) + 4 for k, v in headers.items()) + 12 if headers else 0
        self.messages += 1
        self.bytes += len(msg.subject) + block + len(msg.data)

    async def start(self) -> None:
        self._sub = await self.client.nc.subscribe(
            self.pattern, cb=self._count, pending_msgs_limit=-1, pending_bytes_limit=-1
        )

    async def stop(self) -> None:
        await self.client.nc.flush()
        await self._sub.unsubscribe()


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


def emit(name: str, figures: dict[str, Any]) -> None:
    """One JSON line per measurement, flushed, so partial runs still report."""
    print(json.dumps({"bench": name, **figures}), flush=True)
