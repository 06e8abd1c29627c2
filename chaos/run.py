"""Randomised soak: the streaming job reads an elastic group while messages are published and
faults strike at random; at the end every published message must be committed exactly once and
acked, and the job must have caught up soon after each fault.

Faults: NATS server kill -9 and restart (with `--cluster`: the kill -9 of the leader of the
group's work-queue stream in a three-node cluster, everything replicated three times), driver
kill -9 (the job's whole process group), kill -9 of a Python worker (an executor's task), a
network partition between the job and NATS (a TCP proxy stops relaying for a few seconds), a cut
of every connection of the job, admin unpin of a member, deletion of a member consumer. A job
that dies of a fault is restarted, as a supervisor would. The first fault strikes once the job
has caught up after its start. The run ends with a table; the exit code is 1 if anything was
lost, duplicated or left unacked, or the job did not catch up after a fault within --max-stall.
With --each-once, every kind strikes once in a fixed order (tests/test_chaos.py runs it so).

A fault's stall is the time from its end until everything published before its end was committed
and acked (the group's work-queue stream holds nothing older).

    .venv/bin/python chaos/run.py --minutes 3 [--cluster] [--seed N] [--rate 200] [--keep DIR]
    .venv/bin/python chaos/run.py --each-once --gap 1 2 --seed 1  # every kind once
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

import pyarrow.parquet as pq

from chaos.proxy import Proxy, free_port
from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NatsSparkError, NotFound
from nats_spark.loop import Blocking, run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.config import PartitioningFilter
from nats_spark.pcg.consumers import PRIORITY_GROUP
from nats_spark.pcg.partitioning import elastic_stream_name
from nats_spark.pcg.store import GroupKind
from nats_spark.server import EmbeddedServer

STREAM, GROUP, MEMBERS, PARTITIONS = "CHAOS", "eg", ["a", "b", "c"], 6
WORK_QUEUE = elastic_stream_name(STREAM, GROUP)
T = TypeVar("T")
COMMON_FAULTS = (
    "driver kill -9",
    "executor kill -9",
    "network partition",
    "connections cut",
    "unpin",
    "consumer deleted",
)
# How long an outage lasts (seconds, drawn from the range) for the kinds that have one.
OUTAGES = {
    "server kill -9": (0.2, 2.0),
    "leader kill -9": (0.5, 3.0),
    "driver kill -9": (0.0, 2.0),
    "network partition": (3.0, 15.0),
}


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


async def send_numbered(client: NatsClient, count: int, start: int = 0, keys: int = 37) -> None:
    """`<n>` to `CHAOS.k<n % keys>` for `count` numbers from `start`, all in flight at once, each
    with `Nats-Msg-Id: <n>`: resending what may have been stored already stores nothing twice."""
    await asyncio.gather(
        *(
            client.js.publish(
                f"{STREAM}.k{n % keys}", str(n).encode(), headers={"Nats-Msg-Id": str(n)}
            )
            for n in range(start, start + count)
        )
    )


class Publisher(threading.Thread):
    """Publishes `<n>` at about `rate` per second (`send_numbered`); `published` counts only what
    JetStream confirmed: a chunk whose confirmation failed is sent again."""

    def __init__(self, client: Blocking[NatsClient], rate: int, keys: int = 37) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.rate = rate
        self.keys = keys
        self.published = 0
        self.halt = threading.Event()

    def run(self) -> None:
        chunk = max(1, self.rate // 10)
        while not self.halt.is_set():
            began = time.monotonic()
            try:
                run_sync(
                    send_numbered(self.client.target, chunk, self.published, self.keys),
                    timeout=15,
                )
                self.published += chunk
            except Exception:  # server down or restarting: the same numbers again
                time.sleep(0.5)
                continue
            time.sleep(max(0.0, chunk / self.rate - (time.monotonic() - began)))


class Job:
    """`python -m nats_spark.job` in its own process group (so kill -9 takes its JVM along),
    writing parquet to `<folder>/out`, or as `output_flags` say (e.g. `--format nats ...`)."""

    def __init__(
        self,
        urls: str,
        folder: Path,
        per_trigger: int = 3000,
        output_flags: tuple[str, ...] = (),
        options: tuple[str, ...] = (),
    ) -> None:
        self.urls = urls
        self.per_trigger = per_trigger
        self.options = options  # more source options, `name=value` each
        self.folder = folder
        self.output = folder / "out"
        self.output_flags = output_flags or ("--output", str(self.output))
        self.checkpoint = folder / "cp"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, trigger: str = "500ms") -> None:
        args = [
            *(sys.executable, "-m", "nats_spark.job", "--servers", self.urls, "--stream", STREAM),
            *("--group", GROUP, *self.output_flags),
            *("--checkpoint", str(self.checkpoint), "--trigger", trigger),
            # up to 4 attempts per task, as on a cluster (plain local mode fails the job at once)
            *("--master", "local[2,4]", "--option", "ackWait=5s"),
            *("--option", f"maxMessagesPerTrigger={self.per_trigger}"),
            *(flag for option in self.options for flag in ("--option", option)),
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

    def kill_worker(self, rng: random.Random) -> bool:
        """kill -9 one Python worker of the job's executor (forked by the `pyspark.daemon` that
        serves tasks; it runs in a process group of its own, so it is found by ancestry): a
        running or idle task's process. False when there is none yet."""
        if not self.running:
            return False
        assert self.process is not None
        job = self.process.pid
        parents: dict[int, int] = {}
        commands: dict[int, bytes] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                pid = int(stat.parent.name)
                parents[pid] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                commands[pid] = (stat.parent / "cmdline").read_bytes()

        def descends_from_job(pid: int) -> bool:
            while pid > 1:
                if pid == job:
                    return True
                pid = parents.get(pid, 0)
            return False

        daemons = {
            pid
            for pid, command in commands.items()
            if command.endswith(b"pyspark.daemon\0pyspark.worker\0") and descends_from_job(pid)
        }
        workers = [pid for pid, parent in parents.items() if parent in daemons]
        if not workers:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(rng.choice(workers), signal.SIGKILL)
        return True

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


class Nats:
    """One server, or three routed to each other (`cluster`), each behind a TCP proxy that the
    job connects through; the publisher and the checks connect directly."""

    def __init__(self, cluster: bool) -> None:
        self.servers: list[EmbeddedServer] = []
        if cluster:
            ports = [free_port() for _ in range(3)]
            for n, port in enumerate(ports, 1):
                routes = ",".join(f"nats://127.0.0.1:{p}" for p in ports if p != port)
                self.servers.append(
                    EmbeddedServer(
                        extra_args=[
                            *("--cluster", f"nats://127.0.0.1:{port}", "--routes", routes),
                            *("--cluster_name", "chaos", "--server_name", f"n{n}"),
                            "--no_advertise",  # clients keep to the proxies they were given
                        ]
                    )
                )
        else:
            self.servers.append(EmbeddedServer())
        for server in self.servers:
            server.start()
        self.proxies = [Proxy(int(server.port or 0)) for server in self.servers]

    @property
    def direct_urls(self) -> str:
        return ",".join(server.url for server in self.servers)

    @property
    def proxied_urls(self) -> str:
        return ",".join(proxy.url for proxy in self.proxies)

    def server_named(self, name: str) -> EmbeddedServer:
        return self.servers[int(name.removeprefix("n")) - 1]

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        for server in self.servers:
            server.cleanup()


class Progress(threading.Thread):
    """Polls the work-queue stream: `acked_through` is the highest sequence up to which every
    message was committed and acked (acks remove messages from a work queue)."""

    def __init__(self, client: Blocking[NatsClient]) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.acked_through = 0
        self.halt = threading.Event()

    def last_stored(self) -> int:
        return int(run_sync(self.client.api.stream_info(WORK_QUEUE))["state"]["last_seq"])

    def run(self) -> None:
        while not self.halt.wait(0.25):
            try:
                state = run_sync(self.client.api.stream_info(WORK_QUEUE), timeout=5)["state"]
            except Exception:  # server down or no leader: no reading this time
                continue
            held = state["messages"]
            self.acked_through = state["last_seq"] if not held else state["first_seq"] - 1


@dataclass
class Tally:
    faults: Counter[str] = field(default_factory=Counter)
    stalls: dict[str, float] = field(default_factory=dict)  # longest per kind
    late: Counter[str] = field(default_factory=Counter)  # not caught up within max_stall
    missed: list[str] = field(default_factory=list)  # kinds that found nothing to strike

    def stalled(self, kind: str, seconds: float, caught_up: bool) -> None:
        self.faults[kind] += 1
        self.stalls[kind] = max(self.stalls.get(kind, 0.0), seconds)
        if not caught_up:
            self.late[kind] += 1


@dataclass(frozen=True)
class Plan:
    """What a soak does: faults drawn at random from `kinds` for `minutes`, or (`minutes` None)
    each of `kinds` once, in order, with `gap` seconds (drawn from the range) before each."""

    seed: int
    cluster: bool = False
    kinds: tuple[str, ...] = ()  # empty: every kind the mode has
    minutes: float | None = 3.0
    rate: int = 200  # messages published per second
    gap: tuple[float, float] = (4.0, 12.0)
    outages: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(OUTAGES))
    max_stall: float = 120.0  # seconds to wait for catch-up per fault
    drain: float = 300.0  # seconds allowed to catch up at the end
    options: tuple[str, ...] = ()  # more source options of the job (`name=value`)

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        server = "leader kill -9" if self.cluster else "server kill -9"
        return self.kinds or (server, *COMMON_FAULTS)


@dataclass
class Outcome:
    """What a soak did and what the sink committed."""

    plan: Plan
    tally: Tally
    job_starts: int
    published: int
    rows: list[int]
    unacked: int  # messages left in the work queue at the end (-1: never read)

    @property
    def lost(self) -> int:
        return len(set(range(self.published)) - set(self.rows))

    @property
    def duplicated(self) -> int:
        return len(self.rows) - len(set(self.rows))

    @property
    def failed(self) -> bool:
        late = self.tally.late or self.tally.missed
        return bool(self.lost or self.duplicated or self.unacked or late)

    def table(self) -> str:
        stalls = self.tally.stalls
        longest = max(stalls.items(), key=lambda item: item[1], default=("-", 0.0))
        rows = [
            ("faults injected", sum(self.tally.faults.values())),
            *(
                (
                    f"  {kind}",
                    f"{self.tally.faults[kind]} (longest stall {stalls.get(kind, 0):.1f}s)",
                )
                for kind in self.plan.fault_kinds
            ),
            *((("job options", " ".join(self.plan.options)),) if self.plan.options else ()),
            ("job starts", self.job_starts),
            ("messages published", self.published),
            ("rows committed", len(self.rows)),
            ("lost", self.lost),
            ("duplicated", self.duplicated),
            ("unacked", self.unacked),
            ("longest stall", f"{longest[1]:.1f}s ({longest[0]})"),
            ("not caught up", sum(self.tally.late.values()) + len(self.tally.missed)),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def group_consumers(client: Blocking[NatsClient]) -> list[str]:
    """The consumers the job reads the group through (either layout): those on its work-queue
    stream."""
    return list(run_sync(client.api.consumer_names(WORK_QUEUE)))


def retried(call: Callable[[], T], seconds: float = 60.0) -> T:
    """`call()`, retried while the cluster elects leaders or a server restarts."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except (NatsSparkError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def inject(
    kind: str,
    rng: random.Random,
    nats: Nats,
    job: Job,
    client: Blocking[NatsClient],
    outages: dict[str, tuple[float, float]] = OUTAGES,
) -> bool:
    """Strike with `kind`; returns once the fault has ended. False when it could not strike."""
    outage = outages.get(kind, (0.0, 0.0))
    if kind == "server kill -9":
        server = nats.servers[0]
        server.kill()
        time.sleep(rng.uniform(*outage))
        server.start()
    elif kind == "leader kill -9":
        info = retried(lambda: run_sync(client.api.stream_info(WORK_QUEUE)))
        server = nats.server_named(info["cluster"]["leader"])
        server.kill()
        time.sleep(rng.uniform(*outage))
        server.start()
    elif kind == "driver kill -9":
        job.kill()
        time.sleep(rng.uniform(*outage))
        job.start()
    elif kind == "executor kill -9":
        return job.kill_worker(rng)
    elif kind == "network partition":
        for proxy in nats.proxies:
            proxy.blackhole()
        time.sleep(rng.uniform(*outage))
        for proxy in nats.proxies:
            proxy.heal()
    elif kind == "connections cut":
        for proxy in nats.proxies:
            proxy.cut()
    else:
        consumers = group_consumers(client)
        if not consumers:
            return False  # between a deletion and the job's next batch
        name = rng.choice(consumers)
        if kind == "unpin":
            run_sync(client.api.unpin(WORK_QUEUE, name, PRIORITY_GROUP))
        else:
            run_sync(client.api.delete_consumer(WORK_QUEUE, name))
    return True


def create_group(client: Blocking[NatsClient], replicas: int) -> None:
    run_sync(
        client.api.create_stream(
            {"name": STREAM, "subjects": [f"{STREAM}.*"], "num_replicas": replicas}
        )
    )
    filters = [PartitioningFilter(f"{STREAM}.*", [1])]
    run_sync(admin.create_elastic(client.target, STREAM, GROUP, PARTITIONS, filters))
    if replicas > 1:  # the group's config bucket, created with one replica by default
        bucket = f"KV_{GroupKind.ELASTIC.bucket}"
        config = run_sync(client.api.stream_info(bucket))["config"]
        run_sync(client.api.update_stream({**config, "num_replicas": replicas}))
    run_sync(admin.add_members(client.target, STREAM, GROUP, MEMBERS))


def schedule(plan: Plan, rng: random.Random) -> Iterator[str]:
    """The kinds to strike with, in turn: each once in order, or at random until time is up."""
    if plan.minutes is None:
        yield from plan.fault_kinds
        return
    end = time.monotonic() + plan.minutes * 60
    while time.monotonic() < end:
        yield rng.choice(plan.fault_kinds)


def soak(plan: Plan, folder: Path) -> Outcome:
    rng = random.Random(plan.seed)
    tally = Tally()
    nats = Nats(plan.cluster)
    client = open_blocking(
        ConnectionSettings(servers=tuple(nats.direct_urls.split(",")), name="chaos")
    )
    retried(lambda: run_sync(client.api.account_info()))  # a cluster elects its meta leader
    retried(lambda: create_group(client, 3 if plan.cluster else 1))
    publisher = Publisher(client, plan.rate)
    progress = Progress(client)
    job = Job(nats.proxied_urls, folder, options=plan.options)
    publisher.start()
    progress.start()
    job.start()
    mode = "three-node cluster" if plan.cluster else "one server"
    length = "each fault once" if plan.minutes is None else f"{plan.minutes} min"
    log(f"soak for {length} ({mode}), seed {plan.seed}, work dir {folder}")
    left = -1

    def caught_up(since: float) -> bool:
        """Wait until everything stored now is acked (restarting a job that a fault ended)."""
        stored = retried(progress.last_stored)
        while progress.acked_through < stored:
            if time.monotonic() - since > plan.max_stall:
                return False
            if not job.running:
                log("the job ended: restarting it")
                job.start()
            time.sleep(0.25)
        return True

    def strike(kind: str) -> bool:
        """`inject`; with each kind once, tried again until it strikes (e.g. a Python worker
        to kill is there again), within max_stall."""
        deadline = time.monotonic() + plan.max_stall
        while True:
            try:
                if inject(kind, rng, nats, job, client, plan.outages):
                    return True
            except (NatsSparkError, NotFound) as error:  # e.g. the consumer is gone already
                log(f"{kind}: not injected ({error})")
            if plan.minutes is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    try:
        # The first fault strikes a job that reads, not one that is still starting.
        while retried(progress.last_stored) == 0:
            time.sleep(0.1)
        if not caught_up(time.monotonic()):
            log("the job did not catch up after starting")
        for kind in schedule(plan, rng):
            time.sleep(rng.uniform(*plan.gap))
            if not job.running:
                log("the job ended (a fault failed its query): restarting it")
                job.start()
            if not strike(kind):
                log(f"{kind}: nothing to strike")
                if plan.minutes is None:
                    tally.missed.append(kind)
                continue
            ended = time.monotonic()
            done = caught_up(ended)
            stall = time.monotonic() - ended
            tally.stalled(kind, stall, done)
            state = "caught up" if done else "not caught up"
            log(f"{kind}: {state} {stall:.1f}s after it ended (published {publisher.published})")
        publisher.halt.set()
        publisher.join(30)
        log(f"publishing stopped at {publisher.published}; draining")
        drain_end = time.monotonic() + plan.drain
        while time.monotonic() < drain_end:
            if not job.running:
                log("the job ended: restarting it")
                job.start()
            left = retried(lambda: run_sync(client.api.stream_info(WORK_QUEUE)))["state"][
                "messages"
            ]
            if left == 0 and len(set(job.committed())) >= publisher.published:
                break
            time.sleep(0.5)
    finally:
        publisher.halt.set()
        progress.halt.set()
        job.stop()
        run_sync(client.target.close())
        nats.close()
    return Outcome(plan, tally, job.starts, publisher.published, job.committed(), left)


def main() -> int:
    # SIGTERM ends the run through its cleanup (job, servers), like Ctrl-C
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="how long faults strike")
    parser.add_argument(
        "--each-once", action="store_true", help="each kind once, in order (not --minutes)"
    )
    parser.add_argument("--cluster", action="store_true", help="three servers, replicas 3")
    parser.add_argument(
        "--faults",
        nargs="+",
        choices=("server kill -9", "leader kill -9", *COMMON_FAULTS),
        help="only these kinds (default: all that fit the mode)",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--rate", type=int, default=200, help="messages published per second")
    parser.add_argument(
        "--gap", type=float, nargs=2, default=(4.0, 12.0), help="seconds between faults (range)"
    )
    parser.add_argument(
        "--max-stall", type=float, default=120.0, help="seconds to wait for catch-up per fault"
    )
    parser.add_argument("--drain", type=float, default=300.0, help="seconds allowed to catch up")
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        help="a source option of the job, name=value (e.g. maxTasksPerBatch=1: packed tasks)",
    )
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="nats-spark-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    plan = Plan(
        seed=args.seed,
        cluster=args.cluster,
        kinds=tuple(args.faults or ()),
        minutes=None if args.each_once else args.minutes,
        rate=args.rate,
        gap=tuple(args.gap),
        max_stall=args.max_stall,
        drain=args.drain,
        options=tuple(args.option),
    )
    outcome = soak(plan, folder)
    print()
    print(outcome.table())
    if not outcome.failed and not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    elif outcome.failed:
        print(f"job log, output and checkpoint kept in {folder}")
    return 1 if outcome.failed else 0


if __name__ == "__main__":
    sys.exit(main())
