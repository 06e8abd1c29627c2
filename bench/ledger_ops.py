"""CPU per ack ledger bucket operation: nats-py's `KeyValue` against the plain requests the ledger
sends (`KvRequests`), and the ledger's own calls (`LedgerBucket`: those requests inside their
retry), in one process on one server.

Each operation runs `--small` and then `--large` times in a row, one awaited after the other as a
task's ledger calls are; its CPU per call is the marginal process CPU (`time.process_time`, all
threads: the event loop runs on one of its own) between the two runs, which leaves out what a
run costs once. The implementations take turns, `--rounds` times; medians are printed. Values
are 200 bytes, about a head's size. The server is a process of its own: its CPU is not counted.

    .venv/bin/python bench/ledger_ops.py
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import emit  # noqa: E402
from nats_spark.client import NatsClient  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402
from nats_spark.spark.group_source.ledger import Ledger  # noqa: E402

VALUE = b"v" * 200
OPERATIONS = ("get", "create", "update", "put")


def calls(kv: Any, update: Callable[[Any, str, bytes, int], Awaitable[int]]) -> dict[str, Any]:
    """Per operation, a run of `n` calls on keys below `prefix` (a new prefix per run)."""

    async def get(prefix: str, n: int) -> None:
        await kv.put(f"{prefix}.k", VALUE)
        for _ in range(n):
            await kv.get(f"{prefix}.k")

    async def create(prefix: str, n: int) -> None:
        for i in range(n):
            await kv.create(f"{prefix}.{i}", VALUE)

    async def update_(prefix: str, n: int) -> None:
        revision = await kv.create(f"{prefix}.k", VALUE)
        for _ in range(n):
            revision = await update(kv, f"{prefix}.k", VALUE, revision)

    async def put(prefix: str, n: int) -> None:
        for i in range(n):
            await kv.put(f"{prefix}.{i % 16}", VALUE)

    return {"get": get, "create": create, "update": update_, "put": put}


async def nats_py_update(kv: Any, key: str, value: bytes, last: int) -> int:
    return int(await kv.update(key, value, last=last))


async def ledger_update(kv: Any, key: str, value: bytes, last: int) -> int:
    return int(await kv.update(key, value, last))


def cpu_us_per_call(run: Any, small: int, large: int, names: itertools.count) -> float:
    spent = []
    for n in (small, large):
        prefix = f"r{next(names)}"
        started = time.process_time()
        run_sync(run(prefix, n))
        spent.append(time.process_time() - started)
    return (spent[1] - spent[0]) / (large - small) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", type=int, default=300, help="calls in the shorter run")
    parser.add_argument("--large", type=int, default=1500, help="calls in the longer run")
    parser.add_argument("--rounds", type=int, default=5, help="turns of each implementation")
    args = parser.parse_args()
    with EmbeddedServer() as server:
        client = run_sync(NatsClient.open(ConnectionSettings(servers=(server.url,))))
        bucket = run_sync(Ledger.bucket(client, "bench-ledger", create=True))
        nats_py = run_sync(client.js.key_value("bench-ledger"))
        implementations = {
            "nats_py": calls(nats_py, nats_py_update),
            "requests": calls(bucket.requests, ledger_update),
            "ledger_bucket": calls(bucket, ledger_update),
        }
        names = itertools.count()
        figures: dict[str, dict[str, list[float]]] = {
            name: {op: [] for op in OPERATIONS} for name in implementations
        }
        for _ in range(args.rounds):
            for op in OPERATIONS:
                for name, runs in implementations.items():
                    cpu = cpu_us_per_call(runs[op], args.small, args.large, names)
                    figures[name][op].append(cpu)
        for name, by_op in figures.items():
            emit(
                "ledger_ops",
                {
                    "implementation": name,
                    **{f"{op}_cpu_us": round(statistics.median(v), 1) for op, v in by_op.items()},
                    "calls": [args.small, args.large],
                    "rounds": args.rounds,
                    "load": os.getloadavg()[0],
                },
            )
        run_sync(client.nc.close())


if __name__ == "__main__":
    main()
