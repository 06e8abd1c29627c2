"""The connector's read path without Spark: plan a batch on the driver side, read every slot with
`read_slot` in this process, then ack it. Times the whole read, the ledger calls inside it, and
the commit; optionally samples the read with py-spy (`--py-spy out.txt`, `pip install py-spy`):
collapsed stacks of the read alone, set-up and commit left out.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import os
import pickle
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import KEYS, create_group, create_stream, emit, publish  # noqa: E402
from nats_spark.client import (
    NatsClient,  # noqa: E402
    close_shared_clients,  # noqa: E402
)
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator  # noqa: E402
from nats_spark.spark.group_source.ledger import Ledger  # noqa: E402
from nats_spark.spark.group_source.options import parse_options  # noqa: E402
from nats_spark.spark.group_source.task.slot_reader import read_slot  # noqa: E402


class LedgerClock:
    """Adds up the time spent in `Ledger` coroutines while installed (bench instrumentation)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._saved: dict[str, Callable[..., Any]] = {}

    def _wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        return timed

    def __enter__(self) -> LedgerClock:
        for name, method in vars(Ledger).items():
            if inspect.iscoroutinefunction(method) and not name.startswith("_"):
                self._saved[name] = method
                setattr(Ledger, name, self._wrap(method))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, method in self._saved.items():
            setattr(Ledger, name, method)


class LedgerStub:
    """Ledger writes that return at once without touching the server (bench instrumentation:
    the same read without its ledger cost)."""

    def __enter__(self) -> LedgerStub:
        self._saved = {name: getattr(Ledger, name) for name in ("write_chunk", "update_head")}

        async def write_chunk(ledger: Ledger, gen: int, slot: str, head: Any, replies: Any) -> list:
            return [f"{ledger.head_key(gen, slot)}.{head.attempt}.{len(head.chunks)}"]

        async def update_head(ledger: Ledger, gen: int, slot: str, head: Any, revision: int) -> int:
            return revision + 1

        Ledger.write_chunk = write_chunk  # type: ignore[method-assign]
        Ledger.update_head = update_head  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for name, method in self._saved.items():
            setattr(Ledger, name, method)


@contextlib.contextmanager
def py_spy(output: str | None) -> Iterator[None]:
    """Sample this process with py-spy (raw collapsed stacks, native frames) while inside."""
    if output is None:
        yield
        return
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--py-spy needs py-spy: pip install py-spy")
    command = [spy, "record", "--pid", str(os.getpid()), "--native", "--format", "raw"]
    sampler = subprocess.Popen([*command, "--rate", "250", "--output", output])
    time.sleep(1.0)  # py-spy attaches before the read starts
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        sampler.wait(timeout=60)


def _cpu(pid: int | None) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _reader(url: str, stream: str, group: str, options: dict[str, Any]) -> BatchCoordinator:
    raw = {"servers": url, "stream": stream, "group": group}
    raw.update({k: str(v) for k, v in options.items()})
    return BatchCoordinator(parse_options(raw))


def read_batch(
    url: str,
    stream: str,
    group: str,
    server_pid: int | None = None,
    record: bool = True,
    profile: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Plan one batch of `group` and read all of it in this process; ack it; return figures.
    With `record=False` the ledger writes are stubbed out (and nothing is acked); `profile`: a
    py-spy output file for the read."""
    reader = _reader(url, stream, group, options)
    start = run_sync(reader.initial_offset())
    end = run_sync(reader.latest_offset(start, None))
    partitions = run_sync(reader.partitions(start, end))
    rows = 0
    clock = LedgerClock()
    cpu = _cpu(None), _cpu(server_pid)
    began = time.perf_counter()
    with clock if record else LedgerStub(), py_spy(profile):
        for partition in partitions:
            for batch in read_slot(partition):
                rows += batch.num_rows
    read_seconds = time.perf_counter() - began
    reader_cpu, server_cpu = _cpu(None) - cpu[0], _cpu(server_pid) - cpu[1]
    began = time.perf_counter()
    acked = run_sync(reader.ack_through(end.gen)) if record else 0
    commit_seconds = time.perf_counter() - began
    run_sync(reader.close())
    close_shared_clients()
    return {
        "messages": rows,
        "read_seconds": round(read_seconds, 3),
        "msgs_per_s": round(rows / read_seconds),
        # Time inside ledger calls; they overlap with reading, so this bounds the cost from above.
        "ledger_call_seconds": round(clock.seconds, 3),
        "ledger_calls": clock.calls,
        "reader_cpu_us_per_msg": round(reader_cpu / rows * 1e6, 2),
        "server_cpu_us_per_msg": round(server_cpu / rows * 1e6, 2),
        "acked": acked,
        "commit_seconds": round(commit_seconds, 3),
    }


def planned_batch_bytes(
    url: str, client: NatsClient, stream: str, group: str, keys: int, **options: Any
) -> dict[str, int]:
    """What Spark ships to the tasks of a batch (its input partitions, pickled): for the first
    batch of `group` (all `stream` holds), and for the next one, planned once the first was read
    in this process and committed and 100 more messages came (earlier batches' messages not
    yet settled are what a dedupe window holds then)."""
    reader = _reader(url, stream, group, options)
    start = run_sync(reader.initial_offset())
    end = run_sync(reader.latest_offset(start, None))
    first = run_sync(reader.partitions(start, end))
    for partition in first:
        for _ in read_slot(partition):
            pass
    run_sync(reader.commit(end))
    run_sync(publish(client, stream, 100, 100, keys))
    following = run_sync(reader.latest_offset(end, None))
    second = run_sync(reader.partitions(end, following))
    run_sync(reader.close())
    close_shared_clients()
    return {
        "first_batch_bytes": len(pickle.dumps(first)),
        "next_batch_bytes": len(pickle.dumps(second)),
    }


def server_filter_cost(
    url: str, server_pid: int | None, partitions: int, messages: int = 80_000
) -> dict[str, float]:
    """Server CPU per delivered message for a consumer of the whole stream (as the baseline's) and
    for consumers filtering one or two partitions (`<p>.>`, as group members do), on file streams
    with few and with many subjects."""

    async def measure() -> dict[str, float]:
        client = await NatsClient.open(ConnectionSettings(servers=(url,)))
        figures = {}
        try:
            for keys in (64, 1000):
                stream = f"FILTER{keys}"
                await create_stream(client, stream, partitions)
                await publish(client, stream, messages, 100, keys)
                for filters in ([], ["0.>"], ["0.>", "1.>"]):  # the baseline's, group members'
                    name = f"f{len(filters)}"
                    config = {"durable_name": name, "ack_policy": "none"}
                    await client.api.create_consumer(
                        stream, name, {**config, "filter_subjects": filters} if filters else config
                    )
                    consumer = client.pull_consumer(stream, name)
                    before, got = _cpu(server_pid), 0
                    while taken := len((await consumer.fetch(1000, no_wait=True)).deliveries):
                        got += taken
                    spent = _cpu(server_pid) - before
                    await consumer.close()
                    label = f"{keys}_subjects_{len(filters)}_filters_server_cpu_us_per_msg"
                    figures[label] = round(spent / got * 1e6, 1)
        finally:
            await client.close()
        return figures

    return run_sync(measure())


def ledger_overhead(
    url: str, stream: str, server_pid: int | None, rounds: int = 3, **options: Any
) -> dict[str, Any]:
    """The same read of `stream` (fresh 4-member groups) with ledger writes and with the writes
    stubbed out, alternating. Wall time compares the fastest read of each kind (the least
    disturbed by other load); CPU time (reader and server) compares the medians."""
    client = run_sync(NatsClient.open(ConnectionSettings(servers=(url,))))
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    try:
        for i in range(rounds):
            for record in (False, True):
                group = f"ab{i}{'r' if record else 's'}"
                run_sync(create_group(client, stream, group, 4))
                runs[record].append(read_batch(url, stream, group, server_pid, record, **options))
    finally:
        run_sync(client.close())

    def cpu(figures: dict[str, Any]) -> float:
        return figures["reader_cpu_us_per_msg"] + figures["server_cpu_us_per_msg"]

    wall = {k: [r["read_seconds"] for r in v] for k, v in runs.items()}
    cpu_us = {k: statistics.median(cpu(r) for r in v) for k, v in runs.items()}
    return {
        "read_seconds_with_ledger": wall[True],
        "read_seconds_without_ledger": wall[False],
        "cpu_us_per_msg_with_ledger": round(cpu_us[True], 1),
        "cpu_us_per_msg_without_ledger": round(cpu_us[False], 1),
        "ledger_overhead_wall": round(1 - min(wall[False]) / min(wall[True]), 3),
        "ledger_overhead_cpu": round(1 - cpu_us[False] / cpu_us[True], 3),
    }


async def _setup(
    url: str, stream: str, group: str, count: int, size: int, members: int, keys: int
) -> float:
    client = await NatsClient.open(ConnectionSettings(servers=(url,)))
    try:
        await create_stream(client, stream)
        rate = await publish(client, stream, count, size, keys)
        await create_group(client, stream, group, members)
        return rate
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--keys", type=int, default=KEYS, help="distinct subjects")
    parser.add_argument("--fetch-batch-size", type=int, default=None)
    parser.add_argument("--py-spy", metavar="FILE", help="py-spy's collapsed stacks of the read")
    args = parser.parse_args()
    with EmbeddedServer() as server:
        run_sync(_setup(server.url, "RP", "g", args.messages, args.size, args.members, args.keys))
        options: dict[str, Any] = {"maxAckPending": args.messages}
        if args.fetch_batch_size:
            options["fetchBatchSize"] = args.fetch_batch_size
        figures = read_batch(server.url, "RP", "g", server.pid, profile=args.py_spy, **options)
        emit("read_path", {"size": args.size, "members": args.members, **figures})


if __name__ == "__main__":
    main()
