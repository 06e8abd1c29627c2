"""What a packed task's key costs against a key per head: the ledger bucket's plain calls
(`LedgerBucket`) on one embedded server, per call, for 300-byte heads on distinct keys and for
packed keys (`packed_heads`, format 4) of `--sections` heads each. Per case: wall milliseconds
per call with `--in-flight` calls out at once, and the CPU per call of this process and of
nats-server (read from /proc, so Linux only; in clock ticks of 10 ms, hence many calls). A
packed key's writes are compare-and-set updates, one in flight per key as a task sends them.

    .venv/bin/python bench/packed_key_cost.py --sections 128,16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import emit  # noqa: E402
from nats_spark.client import NatsClient  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402
from nats_spark.spark.group_source.ledger import LedgerBucket  # noqa: E402
from nats_spark.spark.group_source.packed_heads import PACKED_FORMAT  # noqa: E402

HEAD = json.dumps({"format": 3, "state": "sealed", "pad": "x" * 260})


def _server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _timed(
    name: str, calls: int, in_flight: int, call: Callable[[int], Awaitable[Any]], pid: int
) -> dict[str, Any]:
    limit = asyncio.Semaphore(in_flight)

    async def one(index: int) -> None:
        async with limit:
            await call(index)

    cpu, server, wall = time.process_time(), _server_cpu(pid), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    wall, server = time.perf_counter() - wall, _server_cpu(pid) - server
    return {
        "case": name,
        "calls": calls,
        "in_flight": in_flight,
        "wall_ms_per_call": round(wall * 1000 / calls, 3),
        "server_cpu_us_per_call": round(server * 1e6 / calls, 1),
        "client_cpu_us_per_call": round((time.process_time() - cpu) * 1e6 / calls, 1),
    }


async def measure(args: argparse.Namespace) -> None:
    with EmbeddedServer() as server:
        assert server.pid is not None
        client = await NatsClient.open(ConnectionSettings(servers=(server.url,)))
        await client.js.create_key_value(bucket="cost", history=1)
        kv = LedgerBucket(client, "cost")
        head = HEAD.encode()
        cases: list[tuple[str, int, Callable[[int], Awaitable[Any]]]] = [
            ("put, a key per head", 16, lambda i: kv.put(f"h.{i}", head)),
            ("get, a key per head", 16, lambda i: kv.get(f"h.{i}")),
        ]
        revisions: dict[str, int] = {}
        for sections in args.sections:
            value = json.dumps(
                {"format": PACKED_FORMAT, "sections": {f"s{j}": [j, HEAD] for j in range(sections)}}
            ).encode()
            keys = [f"p{sections}.{k}" for k in range(args.keys)]
            for key in keys:
                revisions[key] = await kv.put(key, value)

            async def update(i: int, keys: list[str] = keys, value: bytes = value) -> None:
                key = keys[i % len(keys)]
                revisions[key] = await kv.update(key, value, revisions[key])

            async def get(i: int, keys: list[str] = keys) -> None:
                await kv.get(keys[i % len(keys)])

            size = f"{sections} heads, {len(value)} B"
            cases += [(f"update, packed key of {size}", args.keys, update)]
            cases += [(f"get, packed key of {size}", args.keys, get)]
        for _ in range(args.rounds):
            for name, in_flight, call in cases:
                emit("packed_key_cost", await _timed(name, args.calls, in_flight, call, server.pid))
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sections", default="128,16", help="heads per packed key: a list")
    parser.add_argument("--keys", type=int, default=8, help="packed keys written at once")
    parser.add_argument("--calls", type=int, default=2000, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.sections = [int(s) for s in args.sections.split(",")]
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
