"""Planning and packed tasks at many slots, without Spark: the batch coordinator driven as Spark
calls it (`latestOffset`, `partitions`, the tasks' `read`, `commit`) in this process, on a
static group of 2 members and `--slots` partitions (a slot each) read by 2 packed tasks
(`maxTasksPerBatch=2`). `--busy` batches of `--per-slot` (4) messages per slot, then `--idle`
triggers with nothing new. Per batch and per idle trigger: milliseconds (medians), the ledger
bucket's operations by kind and by the key they name (`create:head`, `get:chunk`, `get:other`:
the pointer, ...), and the messages the driver's connection sent; per batch the
tasks' read time per slot (the two tasks read one after the other); each time also as this
process's CPU (`_cpu_ms`: driver and tasks, not the server's). The counts do not depend on the
machine's load; the milliseconds do (the load average is printed beside them). The `steady_`
figures are the busy batches from the third on: the first has no acks of a batch before it, and
the driver's planning of the second reads no acked marks yet.

    .venv/bin/python bench/packed_planning.py --slots 64,256
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import create_group, create_stream, emit, publish  # noqa: E402
from bench.latency_figures import ledger_key_kind  # noqa: E402
from nats_spark.client import NatsClient, close_shared_clients  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator  # noqa: E402
from nats_spark.spark.group_source.ledger import LedgerBucket  # noqa: E402
from nats_spark.spark.group_source.options import parse_options  # noqa: E402
from nats_spark.spark.group_source.slot_partition import PackedSlots  # noqa: E402
from nats_spark.spark.group_source.task.slot_reader import read_packed  # noqa: E402


class BucketOps:
    """The ledger bucket's operations (`LedgerBucket`'s calls), by name and the kind of key they
    name (`ledger_key_kind`), while installed."""

    NAMES = ("get", "create", "update", "put", "remove", "keys_matching")

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._saved = {name: getattr(LedgerBucket, name) for name in self.NAMES}
        for name, call in self._saved.items():
            setattr(LedgerBucket, name, self._counted(name, call))

    def _counted(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        async def counted(bucket: LedgerBucket, key: str, *args: Any, **kwargs: Any) -> Any:
            self.counts[f"{name}:{ledger_key_kind(key)}"] += 1
            return await call(bucket, key, *args, **kwargs)

        return counted

    def take(self) -> dict[str, int]:
        counts, self.counts = dict(self.counts), Counter()
        return counts

    def remove(self) -> None:
        for name, call in self._saved.items():
            setattr(LedgerBucket, name, call)


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1) if values else 0.0


def measure(url: str, slots: int, busy: int, idle: int, per_slot: int) -> dict[str, Any]:
    client = run_sync(NatsClient.open(ConnectionSettings(servers=(url,))))
    stream = f"PLAN{slots}"
    run_sync(create_stream(client, stream, slots))
    run_sync(create_group(client, stream, "g", 2, slots))
    options = {"servers": url, "stream": stream, "group": "g", "maxTasksPerBatch": "2"}
    reader = BatchCoordinator(parse_options({**options, "ledgerBucket": f"L{slots}"}))
    ops = BucketOps()
    figures: dict[str, list[Any]] = {}

    def note(name: str, value: Any) -> None:
        figures.setdefault(name, []).append(value)

    def note_ops(kinds: tuple[str, ...], step: str, counts: dict[str, int]) -> None:
        for kind in kinds:
            note(f"{kind}_{step}_ops", counts)

    def sent() -> int:
        return reader.client.nc.stats["out_msgs"] if reader.client is not None else 0

    try:
        end = run_sync(reader.initial_offset())
        # busy batches, the ack-only batch after them, then the idle triggers
        for index in range(busy + 1 + idle):
            if index < busy:
                run_sync(publish(client, stream, per_slot * slots, 100, keys=8 * slots))
            kind = "busy" if index < busy else "acks" if index == busy else "idle"
            kinds = (kind, "steady") if 2 <= index < busy else (kind,)
            ops.take()
            before, began, cpu = sent(), time.perf_counter(), time.process_time()
            start, end = end, run_sync(reader.latest_offset(end, None))
            note(f"{kind}_latest_offset_ms", (time.perf_counter() - began) * 1000)
            note(f"{kind}_latest_offset_cpu_ms", (time.process_time() - cpu) * 1000)
            note(f"{kind}_latest_offset_sent", sent() - before)
            note_ops(kinds, "latest_offset", ops.take())
            if end is start:
                continue
            before, began, cpu = sent(), time.perf_counter(), time.process_time()
            tasks = run_sync(reader.input_partitions(start, end))
            note(f"{kind}_partitions_ms", (time.perf_counter() - began) * 1000)
            note(f"{kind}_partitions_cpu_ms", (time.process_time() - cpu) * 1000)
            note(f"{kind}_partitions_sent", sent() - before)
            note_ops(kinds, "partitions", ops.take())
            began, cpu = time.perf_counter(), time.process_time()
            packed = [task for task in tasks if isinstance(task, PackedSlots)]
            rows = sum(len(batch) for task in packed for batch in read_packed(task))
            note(f"{kind}_task_ms_per_slot", (time.perf_counter() - began) * 1000 / slots)
            note(f"{kind}_task_cpu_ms_per_slot", (time.process_time() - cpu) * 1000 / slots)
            note_ops(kinds, "task", ops.take())
            note(f"{kind}_rows", rows)
            run_sync(reader.commit(end))
    finally:
        ops.remove()
        run_sync(reader.close())
        close_shared_clients()
        run_sync(client.close())
    summary: dict[str, Any] = {"slots": slots, "load_average": round(os.getloadavg()[0], 1)}
    for name, values in figures.items():
        if name.endswith("_ops"):  # per call, the mean of each kind
            kinds = sorted({kind for counts in values for kind in counts})
            summary[name] = {
                k: round(sum(c.get(k, 0) for c in values) / len(values), 1) for k in kinds
            }
        elif name.endswith("_rows"):
            summary[name] = values
        else:
            summary[name] = _median(values)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slots", default="64,256", help="comma-separated slot counts")
    parser.add_argument("--busy", type=int, default=4, help="busy batches")
    parser.add_argument("--idle", type=int, default=4, help="idle triggers after them")
    parser.add_argument("--per-slot", type=int, default=4, help="messages per slot and busy batch")
    args = parser.parse_args()
    with EmbeddedServer() as server:
        for slots in (int(s) for s in args.slots.split(",")):
            emit("packed_planning", measure(server.url, slots, args.busy, args.idle, args.per_slot))


if __name__ == "__main__":
    main()
