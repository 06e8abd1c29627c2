"""The `nats` sink against a nats-py publish loop, and what exactly once costs.

In one run on one embedded server:
- nats-py API: the plain loop a user writes with nats-py's JetStream API, `js.publish_async` of
  `--messages` rows of `--size` bytes (up to 4,000 awaiting their PubAck, nats-py's default),
  then every PubAck awaited and checked;
- nats-py: a hand-pipelined loop of raw publishes with replies, up to 2,000 awaiting their
  PubAck, all answered on one reply subscription (bench/common.publish): faster than the API;
- the same loop with a `Nats-Msg-Id` header on every message (the server's dedupe cost);
- the sink: `df.write.format("nats")` of as many rows in `--tasks` Spark partitions (local[2]),
  row by row (every row with its message id, one PubAck each);
- the sink into a stream with `allow_atomic`: atomic batches of 1000 rows, one PubAck each.
Prints a JSON line per run, then a summary with the ratios to nats-py and the server's cost of
message ids.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import KEYS, ProcessSampler, emit, publish  # noqa: E402
from bench.connector import spark_session  # noqa: E402
from nats_spark.client import NatsClient  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


async def publish_with_api(client: NatsClient, stream: str, count: int, size: int) -> float:
    """nats-py's `js.publish_async` over `KEYS` subjects, every PubAck awaited; returns msgs/s."""
    js = client.nc.jetstream()
    body = os.urandom(size)
    started = time.perf_counter()
    acks = [await js.publish_async(f"{stream}.k{i % KEYS}", body) for i in range(count)]
    for ack in acks:
        await ack  # raises if JetStream refused one
    return count / (time.perf_counter() - started)


def _stream(client: NatsClient, name: str, atomic: bool = False) -> str:
    config = {"name": name, "subjects": [f"{name}.>"], "allow_atomic": atomic}
    run_sync(client.api.create_stream(config))
    return name


def _timed(what: str, count: int, run: Any) -> dict[str, Any]:
    with ProcessSampler() as sampler:
        started = time.perf_counter()
        rate = run()
        elapsed = time.perf_counter() - started
    cpu = sampler.cpu_us_per_msg(count)
    figures = {
        "messages": count,
        "seconds": round(elapsed, 2),
        "msgs_per_s": round(rate if rate else count / elapsed),
        "server_cpu_us_per_msg": cpu.get("nats_server"),
        "cpu_us_per_msg": cpu,
    }
    emit(what, figures)
    return figures


def main() -> None:
    args = _args()
    results: dict[str, list[dict[str, Any]]] = {
        "nats_py_api": [],
        "nats_py": [],
        "nats_py_ids": [],
        "sink": [],
        "sink_atomic": [],
    }
    with EmbeddedServer() as server:
        client = run_sync(NatsClient.open(ConnectionSettings(servers=(server.url,))))
        spark = spark_session()
        try:
            payload = "x" * args.size
            rows = spark.range(0, args.messages, numPartitions=args.tasks).selectExpr(
                f"'{payload}' AS data"
            )
            rows = rows.cache()
            rows.count()
            for i in range(args.rounds + 1):  # round 0 warms up the JVM and the workers
                stream = _stream(client, f"J{i}")
                api = _timed(
                    "nats_py_api",
                    args.messages,
                    lambda s=stream: run_sync(
                        publish_with_api(client, s, args.messages, args.size)
                    ),
                )
                stream = _stream(client, f"P{i}")
                base = _timed(
                    "nats_py",
                    args.messages,
                    lambda s=stream: run_sync(publish(client, s, args.messages, args.size)),
                )
                stream = _stream(client, f"I{i}")
                ids = _timed(
                    "nats_py_ids",
                    args.messages,
                    lambda s=stream: run_sync(
                        publish(client, s, args.messages, args.size, ids=True)
                    ),
                )

                def write(s: str, **options: str) -> None:
                    writer = rows.write.format("nats").mode("append")
                    for key, value in {"servers": server.url, "subject": f"{s}.all"}.items():
                        writer = writer.option(key, value)
                    writer.options(**options).save()

                stream = _stream(client, f"S{i}")
                sink = _timed("sink", args.messages, lambda s=stream: write(s))
                stream = _stream(client, f"A{i}", atomic=True)
                atomic = _timed("sink_atomic", args.messages, lambda s=stream: write(s, stream=s))
                if i:
                    for name, figures in (
                        ("nats_py_api", api),
                        ("nats_py", base),
                        ("nats_py_ids", ids),
                        ("sink", sink),
                        ("sink_atomic", atomic),
                    ):
                        results[name].append(figures)
        finally:
            spark.stop()
            run_sync(client.close())

    def median(runs: list[dict[str, Any]], key: str) -> float:
        values = sorted(r[key] for r in runs)
        return values[len(values) // 2]

    summary = {
        name: {
            "msgs_per_s": median(runs, "msgs_per_s"),
            "server_cpu_us_per_msg": median(runs, "server_cpu_us_per_msg"),
        }
        for name, runs in results.items()
    }
    for name in ("sink", "sink_atomic"):
        for base in ("nats_py_api", "nats_py"):
            summary[f"{name}_vs_{base}"] = round(
                summary[name]["msgs_per_s"] / summary[base]["msgs_per_s"], 2
            )
    summary["message_id_server_cost_us"] = round(
        summary["nats_py_ids"]["server_cpu_us_per_msg"]
        - summary["nats_py"]["server_cpu_us_per_msg"],
        1,
    )
    print(json.dumps({"settings": vars(args), **summary}))


if __name__ == "__main__":
    main()
