"""A whole-stream batch read: `spark.read.format("nats")` into the `noop` sink (local[2]) against
a plain nats-py ordered consumer reading the same messages, on one embedded server.

    .venv/bin/python bench/batch_read.py [--messages N] [--size B] [--keys K] [--runs R]

Prints one JSON line per measurement and a summary with the ratio of each Spark read path
(batch direct get, ephemeral consumer) to nats-py.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats  # noqa: E402

from bench.common import ProcessSampler, emit, publish  # noqa: E402
from bench.connector import spark_session  # noqa: E402
from nats_spark.client import NatsClient, close_shared_clients  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402

STREAM = "BATCHREAD"


async def setup(url: str, count: int, size: int, keys: int) -> float:
    client = await NatsClient.open(ConnectionSettings(servers=(url,)))
    try:
        await client.api.create_stream(
            {"name": STREAM, "subjects": [f"{STREAM}.*"], "storage": "file", "allow_direct": True}
        )
        return await publish(client, STREAM, count, size, keys=keys)
    finally:
        await client.close()


async def nats_py_ordered(url: str, count: int) -> dict[str, Any]:
    """The plainest fast nats-py read of a whole stream: an ordered consumer with a callback
    (faster in nats-py than a pull consumer's fetch loop), stopping after `count` messages."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        done = asyncio.Event()
        got = payload = 0

        async def on_message(msg: Any) -> None:
            nonlocal got, payload
            payload += len(msg.data) + len(msg.subject) + len(msg.headers or ())
            got += 1
            if got == count:
                done.set()

        start = time.perf_counter()
        sub = await js.subscribe(
            f"{STREAM}.*",
            cb=on_message,
            ordered_consumer=True,
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
        )
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - start
        await sub.unsubscribe()
        return {"messages": got, "seconds": round(elapsed, 2), "msgs_per_s": round(got / elapsed)}
    finally:
        await nc.close()


def spark_read(spark: Any, url: str, count: int, options: dict[str, str]) -> dict[str, Any]:
    reader = spark.read.format("nats").option("servers", url).option("stream", STREAM)
    for key, value in options.items():
        reader = reader.option(key, value)
    with ProcessSampler() as sampler:
        start = time.perf_counter()
        reader.load().write.format("noop").mode("overwrite").save()
        elapsed = time.perf_counter() - start
    return {
        "messages": count,
        "seconds": round(elapsed, 2),
        "msgs_per_s": round(count / elapsed),
        "cpu_us_per_msg": sampler.cpu_us_per_msg(count),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    paths = {"direct": {"readPath": "direct"}, "consumer": {"readPath": "consumer"}}
    with EmbeddedServer() as server:
        rate = run_sync(setup(server.url, args.messages, args.size, args.keys))
        emit("setup", {"messages": args.messages, "size": args.size, "keys": args.keys,
                       "publish_msgs_per_s": round(rate)})  # fmt: skip
        spark = spark_session("local[2]")
        spark_read(spark, server.url, 1000, {"endingPosition": "sequence:1000"})  # warm up
        best: dict[str, int] = {}
        for run in range(args.runs):
            figures = run_sync(nats_py_ordered(server.url, args.messages))
            emit("nats_py_ordered", {"run": run, **figures})
            best["nats_py"] = max(best.get("nats_py", 0), figures["msgs_per_s"])
            for name, options in paths.items():
                figures = spark_read(spark, server.url, args.messages, options)
                emit(f"spark_{name}", {"run": run, **figures})
                best[name] = max(best.get(name, 0), figures["msgs_per_s"])
        emit(
            "summary",
            {
                "best_msgs_per_s": best,
                "ratio_direct": round(best["direct"] / best["nats_py"], 2),
                "ratio_consumer": round(best["consumer"] / best["nats_py"], 2),
            },
        )
        spark.stop()
        close_shared_clients()


if __name__ == "__main__":
    main()
