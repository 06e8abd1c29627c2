"""Read throughput over key counts: the connector in both layouts against a nats-py loop.

For every (distinct subjects, payload) point: a file stream of `--messages` messages over K
keys (`<stream>.k<i>`, stored as `<partition>.<stream>.k<i>`), read to the end by
- a plain nats-py fetch+ack loop (one consumer of the whole stream),
- the connector, static group of 8 partitions / 4 members, default options, partition layout,
- the same in the member layout (Go's consumers); stopped after `--member-seconds` when it has
  not finished, its rate then taken from what the server delivered so far.
Each reports msgs/s, the ratio to nats-py and nats-server CPU per message. Then the catch-up
case: a `--catchup-messages` backlog over `--catchup-keys` keys. Prints a JSON line per run and
a summary JSON with a markdown table (the README's).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.baseline import nats_py_pull_loop  # noqa: E402
from bench.common import ProcessSampler, create_group, create_stream, emit, publish  # noqa: E402
from bench.connector import noop_query, reader, spark_session  # noqa: E402
from nats_spark.client import NatsClient  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.pcg.consumers import member_consumer  # noqa: E402
from nats_spark.pcg.store import load_group  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", default="64,1000,10000,100000")
    parser.add_argument("--payloads", default="100,1024")
    parser.add_argument("--messages", type=int, default=200_000, help="per point, 100 B")
    parser.add_argument("--messages-1k", type=int, default=100_000, help="per point, 1 KiB")
    parser.add_argument("--catchup-messages", type=int, default=1_000_000)
    parser.add_argument("--catchup-keys", type=int, default=10_000)
    parser.add_argument("--member-seconds", type=float, default=120.0)
    parser.add_argument("--layouts", default="partition,member")
    return parser.parse_args()


def _baseline(url: str, stream: str, count: int) -> dict[str, Any]:
    with ProcessSampler() as sampler:
        figures = run_sync(nats_py_pull_loop(url, stream, count, "baseline"))
    return {**figures, "server_cpu_us_per_msg": sampler.cpu_us_per_msg(count)["nats_server"]}


def _delivered(client: NatsClient, stream: str, group: str) -> int:
    """Messages the group's member consumers delivered so far (redeliveries not counted)."""
    entry = run_sync(load_group(client, stream, group))
    total = 0
    for member in entry.config.members:
        consumer = member_consumer(entry, member)
        info = run_sync(client.api.consumer_info(consumer.stream, consumer.name))
        total += info["delivered"]["consumer_seq"] - info.get("num_redelivered", 0)
    return total


def _connector(
    spark: Any,
    client: NatsClient,
    url: str,
    stream: str,
    group: str,
    count: int,
    layout: str,
    cap: float | None,
) -> dict[str, Any]:
    """availableNow into noop with default options; a capped run is stopped and measured by
    what the server delivered."""
    options = {"consumerLayout": layout}
    with (
        tempfile.TemporaryDirectory(prefix="nats-spark-bench-") as checkpoint,
        ProcessSampler() as sampler,
    ):
        started = time.perf_counter()
        query = noop_query(
            reader(spark, url, stream, group, options), checkpoint, availableNow=True
        )
        if cap is None:
            query.awaitTermination()
        finished = cap is None or bool(query.awaitTermination(cap))
        elapsed = time.perf_counter() - started
        if finished:
            rows = sum(p["numInputRows"] for p in query.recentProgress)
        else:
            rows = _delivered(client, stream, group)
            query.stop()
    if finished and rows != count:
        raise RuntimeError(f"{layout} layout read {rows} rows, expected {count}")
    return {
        "layout": layout,
        "finished": bool(finished),
        "messages": rows,
        "seconds": round(elapsed, 1),
        "msgs_per_s": round(rows / elapsed),
        "server_cpu_us_per_msg": sampler.cpu_us_per_msg(max(rows, 1))["nats_server"],
    }


def _point(
    spark: Any,
    client: NatsClient,
    url: str,
    keys: int,
    size: int,
    count: int,
    layouts: list[str],
    cap: float,
) -> dict[str, Any]:
    stream = f"K{keys}S{size}M{count}"
    run_sync(create_stream(client, stream))
    run_sync(publish(client, stream, count, size, keys))
    point: dict[str, Any] = {"keys": keys, "payload": size, "messages": count}
    point["nats_py"] = _baseline(url, stream, count)
    emit("nats_py", {**point["nats_py"], "keys": keys, "payload": size})
    for layout in layouts:
        group = f"g{layout}"
        run_sync(create_group(client, stream, group, 4))
        limit = cap if layout == "member" else None
        figures = _connector(spark, client, url, stream, group, count, layout, limit)
        figures["ratio_to_nats_py"] = round(
            figures["msgs_per_s"] / point["nats_py"]["msgs_per_s"], 2
        )
        figures["server_cpu_vs_nats_py"] = round(
            figures["server_cpu_us_per_msg"] / point["nats_py"]["server_cpu_us_per_msg"], 2
        )
        point[layout] = figures
        emit("connector", {**figures, "keys": keys, "payload": size})
    run_sync(client.api.delete_stream(stream))  # keeps the disk and the next point's cache clean
    return point


def _table(points: list[dict[str, Any]], layouts: list[str]) -> str:
    head = "| keys | payload | messages | nats-py msg/s (server µs/msg) |"
    rule = "|---|---|---|---|"
    for layout in layouts:
        head += f" {layout} layout: msg/s, ratio, server µs/msg |"
        rule += "---|"
    lines = [head, rule]
    for p in points:
        base = p["nats_py"]
        line = (
            f"| {p['keys']:,} | {p['payload']} B | {p['messages']:,} | "
            f"{base['msgs_per_s']:,} ({base['server_cpu_us_per_msg']}) |"
        )
        for layout in layouts:
            f = p[layout]
            unfinished = "" if f["finished"] else f" (stopped after {f['seconds']:.0f} s)"
            line += (
                f" {f['msgs_per_s']:,}, **{f['ratio_to_nats_py']}x**, "
                f"{f['server_cpu_us_per_msg']}{unfinished} |"
            )
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    args = _args()
    layouts = args.layouts.split(",")
    sizes = {100: args.messages, 1024: args.messages_1k}
    points: list[dict[str, Any]] = []
    started = time.perf_counter()
    load = [round(x, 1) for x in psutil.getloadavg()]
    with EmbeddedServer() as server:
        client = run_sync(NatsClient.open(ConnectionSettings(servers=(server.url,))))
        spark = spark_session()
        try:
            # JVM warm-up, not reported (see bench/run.py).
            _point(spark, client, server.url, 64, 100, 50_000, ["partition"], args.member_seconds)
            for size in (int(s) for s in args.payloads.split(",")):
                for keys in (int(k) for k in args.keys.split(",")):
                    points.append(
                        _point(
                            spark,
                            client,
                            server.url,
                            keys,
                            size,
                            sizes[size],
                            layouts,
                            args.member_seconds,
                        )
                    )
            if args.catchup_messages:
                points.append(
                    _point(
                        spark,
                        client,
                        server.url,
                        args.catchup_keys,
                        100,
                        args.catchup_messages,
                        layouts,
                        args.member_seconds,
                    )
                )
        finally:
            spark.stop()
            run_sync(client.close())
        version = ".".join(map(str, server.version))
    summary = {
        "nats_server": version,
        "cpus": psutil.cpu_count(),
        "load_average_at_start": load,
        "seconds": round(time.perf_counter() - started),
        "points": points,
        "table": _table(points, layouts),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
