"""A selective batch read: `spark.read.format("nats").load().where(...)` into the `noop` sink
(local[2]) with Spark's Python filter pushdown off (every message is read and Spark filters)
and on (NATS filters), on one embedded server.

    .venv/bin/python bench/pushdown.py [--messages N] [--size B] [--keys K] [--runs R]

The stream holds N messages of B bytes over K subjects `PUSHDOWN.k<i>` (round robin: with the
default 100 keys one subject is 1% of the stream). Cases: one subject (1%), two subjects (2%,
two filter subjects), the last 1% of sequences, 8 subjects (8%, as many filter subjects as an IN
list becomes) and 64 subjects (64%, one covering filter subject). Prints one JSON line per read
and a summary with each case's best times and the speedup.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ProcessSampler, emit, publish  # noqa: E402
from bench.connector import spark_session  # noqa: E402
from nats_spark.client import NatsClient, close_shared_clients  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402

STREAM = "PUSHDOWN"
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


async def setup(url: str, count: int, size: int, keys: int) -> float:
    client = await NatsClient.open(ConnectionSettings(servers=(url,)))
    try:
        await client.api.create_stream(
            {"name": STREAM, "subjects": [f"{STREAM}.*"], "storage": "file"}
        )
        return await publish(client, STREAM, count, size, keys=keys)
    finally:
        await client.close()


def filtered_read(
    spark: Any, url: str, where: str, pushdown: bool, messages: int
) -> dict[str, Any]:
    """One read into the noop sink: wall time, and CPU per message of the whole stream by
    process kind (so both modes are per the same message count)."""
    spark.conf.set(PUSHDOWN, str(pushdown).lower())
    df = spark.read.format("nats").option("servers", url).option("stream", STREAM).load()
    with ProcessSampler() as sampler:
        start = time.perf_counter()
        df.where(where).write.format("noop").mode("overwrite").save()
        elapsed = time.perf_counter() - start
    return {"seconds": round(elapsed, 2), "cpu_us_per_stream_msg": sampler.cpu_us_per_msg(messages)}


def in_list(count: int) -> str:
    return f"subject IN ({', '.join(repr(f'{STREAM}.k{i}') for i in range(count))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    n = args.messages
    cases = {
        "one_subject": f"subject = '{STREAM}.k7'",
        "two_subjects": f"subject IN ('{STREAM}.k7', '{STREAM}.k8')",
        "last_sequences": f"stream_seq > {n - n // 100}",
        # As many filter subjects as an IN list becomes (MAX_IN_SUBJECTS: 8%), and more (64%:
        # a covering `PUSHDOWN.*`, Spark filters).
        "in_8_subjects": in_list(8),
        "in_64_subjects": in_list(64),
    }
    with EmbeddedServer() as server:
        rate = run_sync(setup(server.url, n, args.size, args.keys))
        emit("setup", {"messages": n, "size": args.size, "keys": args.keys,
                       "publish_msgs_per_s": round(rate)})  # fmt: skip
        spark = spark_session("local[2]")
        base = spark.read.format("nats").option("servers", server.url).option("stream", STREAM)
        for name, where in cases.items():
            spark.conf.set(PUSHDOWN, "true")
            emit("rows", {"case": name, "where": where, "rows": base.load().where(where).count()})
        best: dict[str, dict[str, float]] = {}
        for run in range(args.runs):
            for name, where in cases.items():
                for pushdown in (False, True):
                    figures = filtered_read(spark, server.url, where, pushdown, n)
                    emit("read", {"run": run, "case": name, "pushdown": pushdown, **figures})
                    key = "pushed" if pushdown else "spark_filters"
                    seen = best.setdefault(name, {}).get(key, float("inf"))
                    best[name][key] = min(seen, figures["seconds"])
        emit(
            "summary",
            {
                "best_seconds": best,
                "speedup": {
                    name: round(times["spark_filters"] / times["pushed"], 1)
                    for name, times in best.items()
                },
            },
        )
        spark.stop()
        close_shared_clients()


if __name__ == "__main__":
    main()
