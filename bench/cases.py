"""The two cases users run, each at two run sizes, against a tuned nats-py loop (run by
`bench/run.py`, so by `make bench`).

For each key count (distinct subjects, 100 B payloads) two file streams of N and 4N messages
are read to the end by
- nats-py: a fetch+ack loop on an unfiltered durable consumer with max_ack_pending unbounded, at
  the best of a few fetch sizes (each tried on the N stream; timed from its connect);
- the connector in the bench's warm Spark session (availableNow into `noop`; what a
  long-running query does per message, Spark's query start included), each run just after a
  short read that starts the session's Python workers (Spark stops those idle for a minute);
- the connector in a fresh process (`bench/fresh_job.py`, as spark-submit runs a job: Python,
  JVM and query start-up included, timed from the process start to the end of its query).
Printed beside throughput and each ratio's settings: CPU seconds by process kind at each size
and the marginal CPU per message between them ((4N - N) / 3N: fixed costs cancel), the driver's
CPU (the streaming source runner, where Spark plans and commits) at both sizes, the bytes
written to the ledger bucket's stream per message, the pickled input partitions of a
planned batch at both sizes, and a reader's CPU per message stage by stage on one synthetic pull
(`bench/stages.py`), to set beside the Python workers' marginal figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.baseline import nats_py_pull_loop
from bench.common import (
    PARTITIONS,
    ProcessSampler,
    WrittenBytes,
    create_group,
    create_stream,
    emit,
    publish,
)
from bench.connector import available_now
from bench.read_path import planned_batch_bytes
from bench.stages import stages
from nats_spark.client import NatsClient
from nats_spark.loop import run_sync
from nats_spark.spark.group_source.options import SourceOptions

MEMBERS = 4
PAYLOAD = 100
WARM_UP_MESSAGES = 2_000  # read before each warm run, so that Spark's Python workers are up
ROOT = Path(__file__).resolve().parent.parent
SPARK_FLOOR = str(Path(__file__).resolve().parent / "spark_floor.py")
SAMPLE_EVERY = 0.1  # seconds between CPU samples: what a process ending between them loses


def _nats_py(url: str, stream: str, count: int, fetch: int, durable: str) -> dict[str, Any]:
    with ProcessSampler(SAMPLE_EVERY) as sampler:
        figures = run_sync(
            nats_py_pull_loop(url, stream, count, durable, fetch, max_ack_pending=-1)
        )
    return {**figures, "fetch": fetch, "cpu_us_per_msg": sampler.cpu_us_per_msg(count)}


def _ledger_writes(
    client: NatsClient, options: dict[str, Any], run: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """`run`'s figures, with what it wrote to the ledger bucket's stream per message."""
    bucket = options.get("ledgerBucket", SourceOptions.ledger_bucket)
    written = WrittenBytes(client, f"$KV.{bucket}.>")
    run_sync(written.start())
    try:
        figures = run()
    finally:
        run_sync(written.stop())
    messages = figures["messages"]
    return {
        **figures,
        "ledger_writes": written.messages,
        "ledger_bytes_per_msg": round(written.bytes / messages, 2),
    }


def fresh_read(
    url: str, stream: str, group: str, count: int, options: dict[str, Any], root: Path = ROOT
) -> dict:
    """The read as a job of its own, with the code in the checkout `root` (its working directory
    and on PYTHONPATH, which Spark's Python workers inherit); nats-server's CPU from this
    process's sampler (the job's own tree does not hold the server)."""
    job_script = str(root / "bench" / "fresh_job.py")
    command = [sys.executable, job_script, url, stream, group, str(count), json.dumps(options)]
    path = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    figures: dict[str, Any] | None = None
    with ProcessSampler(SAMPLE_EVERY) as around:
        started = time.perf_counter()
        job = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        assert job.stdout is not None
        for line in job.stdout:
            if line.startswith("{"):
                seconds = time.perf_counter() - started
                figures = json.loads(line)
                break
        job.wait(timeout=600)
    if figures is None:
        raise RuntimeError(f"the fresh job for {stream} ended ({job.returncode}) without figures")
    cpu = {**figures.pop("job_cpu_seconds"), "nats_server": around.cpu_seconds()["nats_server"]}
    cpu["total"] = round(sum(v for k, v in cpu.items() if k != "total"), 3)
    return {
        **figures,
        "query_seconds": figures["seconds"],
        "seconds": round(seconds, 2),
        "msgs_per_s": round(count / seconds),
        "cpu_seconds": cpu,
        "cpu_us_per_msg": {kind: round(s / count * 1e6, 1) for kind, s in cpu.items()},
    }


def spark_floor() -> dict[str, Any]:
    """`bench/spark_floor.py`'s figures: Spark's own fresh start with a trivial Python source."""
    done = subprocess.run(
        [sys.executable, SPARK_FLOOR], stdout=subprocess.PIPE, text=True, check=True, timeout=600
    )
    return dict(json.loads(next(line for line in done.stdout.splitlines() if line[:1] == "{")))


def _marginal(small: dict[str, float], large: dict[str, float], n: int) -> dict[str, float]:
    """CPU µs per message between a run of `n` messages and one of `4n`, by process kind."""
    kinds = sorted(set(small) | set(large))
    return {k: round((large.get(k, 0.0) - small.get(k, 0.0)) / (3 * n) * 1e6, 2) for k in kinds}


def _settings(keys: int, count: int, case: str, options: dict[str, Any], fetch: int) -> str:
    return (
        f"{keys:,} keys, {PAYLOAD} B, {count:,} messages, {PARTITIONS} partitions / {MEMBERS} "
        f"members, local[2], availableNow into noop, {case}, options {options or 'default'}; "
        f"nats-py: fetch {fetch}, max_ack_pending unbounded, unfiltered durable, explicit acks, "
        "timed from its connect"
    )


def cases(
    spark: Any,
    client: NatsClient,
    url: str,
    keys: int,
    n: int,
    fetch_sizes: list[int],
    options: dict[str, Any],
    floor: dict[str, Any],
) -> dict[str, Any]:
    """Both cases at `keys` distinct subjects, on streams of `n` and `4n` messages; `floor` is
    `spark_floor()`, which bounds what a fresh process can reach."""
    sizes = {"N": n, "4N": 4 * n}
    streams = {size: f"CASE{keys}K{count}" for size, count in sizes.items()}
    for size, count in sizes.items():
        run_sync(create_stream(client, streams[size]))
        run_sync(publish(client, streams[size], count, PAYLOAD, keys))

    tried = {fetch: _nats_py(url, streams["N"], n, fetch, f"try{fetch}") for fetch in fetch_sizes}
    fetch = max(tried, key=lambda f: tried[f]["msgs_per_s"])
    nats_py = {"N": tried[fetch], "4N": _nats_py(url, streams["4N"], 4 * n, fetch, "best")}
    emit(
        "nats_py_tuned",
        {
            "keys": keys,
            "fetch_sizes_tried_msgs_per_s": {f: r["msgs_per_s"] for f, r in tried.items()},
            "chosen_fetch": fetch,
            "max_ack_pending": -1,
            **{size: nats_py[size] for size in sizes},
        },
    )

    # Spark stops Python workers idle for a minute (the nats-py runs take longer): a short read
    # first starts them, so a warm run pays no worker's start, as a running stream's batches do.
    warm_up = f"CASE{keys}WARMUP"
    run_sync(create_stream(client, warm_up))
    run_sync(publish(client, warm_up, WARM_UP_MESSAGES, PAYLOAD, keys))
    runs: dict[str, dict[str, dict[str, Any]]] = {"warm": {}, "fresh": {}}
    for size, count in sizes.items():
        stream = streams[size]
        run_sync(create_group(client, warm_up, f"warm{size}", MEMBERS))
        available_now(spark, url, warm_up, f"warm{size}", WARM_UP_MESSAGES, options)
        run_sync(create_group(client, stream, "warm", MEMBERS))
        runs["warm"][size] = _ledger_writes(
            client,
            options,
            lambda s=stream, c=count: available_now(
                spark, url, s, "warm", c, options, SAMPLE_EVERY
            ),
        )
        emit("case_warm", {"keys": keys, "size": size, **runs["warm"][size]})
        run_sync(create_group(client, stream, "fresh", MEMBERS))
        runs["fresh"][size] = _ledger_writes(
            client, options, lambda s=stream, c=count: fresh_read(url, s, "fresh", c, options)
        )
        emit("case_fresh", {"keys": keys, "size": size, **runs["fresh"][size]})

    planned = {}
    for size in sizes:
        run_sync(create_group(client, streams[size], "plan", MEMBERS))
        planned[size] = planned_batch_bytes(url, client, streams[size], "plan", keys, **options)
    for stream in [*streams.values(), warm_up]:
        run_sync(client.api.delete_stream(stream))

    figures: dict[str, Any] = {
        "keys": keys,
        "payload": PAYLOAD,
        "messages": sizes,
        "nats_py_fetch": fetch,
        "nats_py": {
            size: {k: nats_py[size][k] for k in ("msgs_per_s", "cpu_us_per_msg")} for size in sizes
        },
    }
    for case, by_size in runs.items():
        figures[case] = {
            "ratio_to_nats_py": {
                size: {
                    "ratio": round(by_size[size]["msgs_per_s"] / nats_py[size]["msgs_per_s"], 2),
                    "connector_msgs_per_s": by_size[size]["msgs_per_s"],
                    "nats_py_msgs_per_s": nats_py[size]["msgs_per_s"],
                    "settings": _settings(keys, count, f"{case} session", options, fetch)
                    if case == "warm"
                    else _settings(keys, count, "fresh process", options, fetch),
                }
                for size, count in sizes.items()
            },
            "seconds": {size: by_size[size]["seconds"] for size in sizes},
            "cpu_seconds": {size: by_size[size]["cpu_seconds"] for size in sizes},
            "marginal_cpu_us_per_msg": _marginal(
                by_size["N"]["cpu_seconds"], by_size["4N"]["cpu_seconds"], n
            ),
            "cpu_us_per_msg": {size: by_size[size]["cpu_us_per_msg"] for size in sizes},
            "driver_cpu_seconds": {
                size: by_size[size]["cpu_seconds"].get("source_runner", 0.0) for size in sizes
            },
            "ledger_bytes_per_msg": {size: by_size[size]["ledger_bytes_per_msg"] for size in sizes},
        }
        driver = figures[case]["driver_cpu_seconds"]
        figures[case]["driver_cpu_4N_over_N"] = (
            round(driver["4N"] / driver["N"], 2) if driver["N"] else None
        )
        figures[case]["driver_cpu_us_per_msg"] = {
            size: round(driver[size] / count * 1e6, 2) for size, count in sizes.items()
        }
    figures["planned_batch_bytes"] = planned
    figures["stages_cpu_us_per_msg"] = stages(4096, keys, PAYLOAD, read=32768, rounds=7)
    floor_read = floor["one_row_python_source_read"]
    server_us = figures["warm"]["marginal_cpu_us_per_msg"].get("nats_server", 0.0)
    cores = os.cpu_count() or 1
    figures["fresh"]["spark_floor_seconds"] = floor_read["seconds"]
    # A fresh job cannot end before Spark has started and run one Python source's task, nor
    # before the machine's cores have done that start's CPU and nats-server's per message for
    # this read's consumers (the warm case's marginal): the best ratio a connector costing
    # nothing could reach in a fresh process here.
    figures["fresh"]["ratio_bound"] = {
        size: round(
            count
            / nats_py[size]["msgs_per_s"]
            / max(
                floor_read["seconds"],
                (floor_read["cpu_seconds"]["total"] + server_us * count / 1e6) / cores,
            ),
            2,
        )
        for size, count in sizes.items()
    }
    return figures
