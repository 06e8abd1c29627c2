"""`make bench-latency`: how long a message takes from being stored to a `foreachBatch`'s hands,
and to its batch's commit, under a steady load, beside a tuned nats-py loop and Spark's own floor.

For each rate (`--rates`, msg/s published by `bench/steady_publisher.py`, 100 B over 1,000 keys),
each partition count (`--partitions`: a static group of 4 members over a stream of that many
partitions, one input partition per partition) and each trigger (`--triggers`, seconds;
0: batches back to back), one case of the connector (`nats-pcg`, its default options):

- a query whose `foreachBatch` collects the rows runs; a few messages prime it, then the load
  runs for `--warmup` + `--seconds`, and the messages stored after the warm-up are measured:
  **in hand** = when their batch's rows were collected − their stored timestamp; **committed** =
  when their batch's commit was logged (its trigger's start + `triggerExecution`, which ends
  with the commit log's write) − their stored timestamp; p50/p95/p99/max;
- per batch (p50 and p95 over the measured batches): Spark's progress phases, and ours from
  `bench/latency_sources.py`'s timed reader: the driver's `latestOffset` (planning; Spark's
  phase of that name is it plus the call to Python) and `partitions` (inside Spark's `addBatch`),
  the messages the driver's connection sent for them, the tasks (count, p50, longest and their
  sum: the reads' share of `addBatch` on the cores there are), and the requests the server saw
  while the batch ran (ledger reads and writes, pulls, the rest; per case also by request, a
  ledger one by the key it names: an entry's head, a chunk, or another key);
- the CPU per measured message by process kind (`bench/common.py`'s ProcessSampler).

Beside them, per rate, the tuned nats-py loop on the same server (pull `--nats-py-batch`, ack
each, a fetch waiting at most `--nats-py-timeout`; in hand = when the fetch returned, acked =
after its acks were flushed), and per partition count Spark's floor: a trivial Python streaming
source (`latency_floor`: every `latestOffset` one more, P input partitions of `--floor-rows`
rows) into the same `foreachBatch`, trigger 0, for `--floor-seconds`, run just before the first
connector case at P (after one such run at the smallest P that warms the JVM up).

Prints one JSON line per case, then a summary whose ratios name their case: connector p99 /
nats-py p99 (in hand) at the same rate, and connector batch ms / floor batch ms (p50) at the
same partition count. A quick run:

    python bench/latency.py --rates 500 --partitions 8 --triggers 0 --seconds 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats  # noqa: E402
import psutil  # noqa: E402
from nats.js.api import ConsumerConfig  # noqa: E402

from bench.common import ProcessSampler, create_group, create_stream, emit, publish  # noqa: E402
from bench.connector import reader, spark_session  # noqa: E402
from bench.latency_figures import (  # noqa: E402
    InHand,
    Probe,
    ServerRequests,
    batch_details,
    idle_polls,
    ms,
    progress_batches,
    summarize_batches,
)
from bench.latency_sources import PROBE_DIR, LatencyFloor, TimedNatsPcg  # noqa: E402
from bench.partition_loop import read_rounds  # noqa: E402
from nats_spark.client import NatsClient  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402
from nats_spark.spark.group_source.options import SourceOptions  # noqa: E402

PUBLISHER = str(Path(__file__).resolve().parent / "steady_publisher.py")
PRIME = 20  # messages read before the load starts: the query and its Python workers are up
FLOOR_WARM_BATCHES = 2  # the floor's first batches start the workers: not measured
SAMPLE_EVERY = 0.2


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="500,5000,20000", help="msgs/s published")
    parser.add_argument("--partitions", default="8,64,256", help="stream partitions")
    parser.add_argument("--triggers", default="0,1", help="processingTime, seconds")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured, per case")
    parser.add_argument("--warmup", type=float, default=10.0, help="load before measuring")
    parser.add_argument("--members", type=int, default=4, help="of the static group")
    parser.add_argument("--keys", type=int, default=1000, help="distinct subjects")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--nats-py-batch", type=int, default=500)
    parser.add_argument("--nats-py-timeout", type=float, default=0.05, help="seconds per fetch")
    parser.add_argument("--floor-rows", type=int, default=20, help="per input partition")
    parser.add_argument("--floor-seconds", type=float, default=20.0)
    parser.add_argument(
        "--floor-only",
        default="",
        help="comma-separated input-partition counts: run only Spark's floor at each",
    )
    parser.add_argument(
        "--partition-loop",
        action="store_true",
        help="beside each connector case, the nats-py loop reading each partition's consumer",
    )
    parser.add_argument("--drain-seconds", type=float, default=60.0, help="after the load")
    parser.add_argument("--per-batch", action="store_true", help="print each batch's figures")
    parser.add_argument(
        "--option", action="append", default=[], help="KEY=VALUE, a connector option"
    )
    return parser.parse_args()


def _numbers(text: str, kind: Callable[[str], Any]) -> list[Any]:
    return [kind(part) for part in text.split(",") if part]


def _until(done: Callable[[], bool], timeout: float, query: Any = None) -> bool:
    """Wait for `done` (polled) up to `timeout`; a query that failed raises its error."""
    deadline = time.time() + timeout
    while not done():
        if query is not None and not query.isActive:
            raise RuntimeError(f"query stopped: {query.exception()}")
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def _idle(query: Any) -> bool:
    """No batch runs, and the last trigger found no data."""
    status = query.status
    return not status["isTriggerActive"] and not status["isDataAvailable"]


@contextlib.contextmanager
def _running(df: Any, collector: InHand, trigger: float) -> Iterator[Any]:
    """A query of `df` into `collector` on a checkpoint of its own, stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="nats-spark-bench-") as checkpoint:
        writer = df.writeStream.foreachBatch(collector).option("checkpointLocation", checkpoint)
        query = writer.trigger(processingTime=f"{trigger} seconds").start()
        try:
            yield query
        finally:
            query.stop()


class Load:
    """`bench/steady_publisher.py` publishing for `warmup` + `seconds`; measured: what is stored
    from the end of the warm-up to the end of the load."""

    def __init__(self, url: str, stream: str, rate: int, args: argparse.Namespace) -> None:
        seconds = args.warmup + args.seconds
        command = [PUBLISHER, url, stream, str(rate), str(seconds), str(args.keys), str(args.size)]
        self.process = subprocess.Popen([sys.executable, *command], stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        started = json.loads(self.process.stdout.readline())["started"]  # Python's start is out
        self.measure_from = started + args.warmup
        self.measure_to = started + seconds
        self.published = self.reached = 0  # the rate reached: below `rate` if it fell behind

    def running(self) -> bool:
        return self.process.poll() is None

    def measure(self) -> ProcessSampler:
        """Wait out the warm-up, then sample the processes until the load ends."""
        time.sleep(max(0.0, self.measure_from - time.time()))
        with ProcessSampler(SAMPLE_EVERY) as sampler:
            self.finish()
        return sampler

    def finish(self) -> None:
        out, _ = self.process.communicate()
        if self.process.returncode:
            raise RuntimeError(f"the publisher failed ({self.process.returncode})")
        ended = json.loads(out)
        self.published, self.reached = ended["published"], ended["msgs_per_s"]

    def measured(self, stored: float) -> bool:
        return self.measure_from <= stored <= self.measure_to


def _latencies(load: Load, times: list[tuple[float, float, float]]) -> dict[str, Any]:
    """In hand and committed (or acked) latencies of the measured messages; `times`: (stored,
    in hand, committed) per message."""
    measured = [t for t in times if load.measured(t[0])]
    return {
        "published_msgs_per_s": load.reached,
        "messages": len(measured),
        "in_hand_ms": ms([hand - stored for stored, hand, _ in measured]),
        "committed_ms": ms([done - stored for stored, _, done in measured]),
    }


def _cpu(sampler: ProcessSampler, messages: int) -> dict[str, Any]:
    return {"cpu_us_per_msg": sampler.cpu_us_per_msg(max(1, messages))}


def nats_py_case(url: str, client: NatsClient, rate: int, args: argparse.Namespace) -> dict:
    """The tuned nats-py loop under the same load: fetch, ack each, flush the acks."""
    stream = f"NATSPY{rate}"
    run_sync(create_stream(client, stream))

    async def run() -> tuple[Load, ProcessSampler, list[tuple[float, float, float]], int]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        config = ConsumerConfig(durable_name="loop", ack_policy="explicit", max_ack_pending=-1)
        await js.add_consumer(stream, config)
        sub = await js.pull_subscribe_bind("loop", stream)
        load = Load(url, stream, rate, args)
        sampler = ProcessSampler(SAMPLE_EVERY)  # the loop is this process: driver_python
        times: list[tuple[float, float, float]] = []
        fetches, sampling, deadline = 0, False, None
        while deadline is None or (len(times) < load.published and time.time() < deadline):
            if not sampling and time.time() >= load.measure_from:
                sampler.__enter__()
                sampling = True
            if deadline is None and not load.running():
                load.finish()
                if sampling:
                    sampler.__exit__()
                deadline = time.time() + args.drain_seconds
            try:
                messages = await sub.fetch(args.nats_py_batch, timeout=args.nats_py_timeout)
            except TimeoutError:  # nats-py's are TimeoutErrors too
                continue
            in_hand = time.time()
            for msg in messages:
                await msg.ack()
            await nc.flush()
            acked = time.time()
            fetches += 1
            times += [(m.metadata.timestamp.timestamp(), in_hand, acked) for m in messages]
        await nc.close()
        return load, sampler, times, fetches

    load, sampler, times, fetches = run_sync(run())
    run_sync(client.api.delete_stream(stream))
    figures = _latencies(load, times)
    figures["acked_ms"] = figures.pop("committed_ms")
    return {
        "case": {"kind": "nats_py", "rate": rate},
        "fetch": {"batch": args.nats_py_batch, "timeout_s": args.nats_py_timeout},
        **figures,
        "kept_up": len(times) >= load.published,
        "fetches_with_messages": fetches,
        **_cpu(sampler, figures["messages"]),
    }


def partition_loop_case(
    url: str, client: NatsClient, case: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """The tuned nats-py loop reading each partition through its own consumer, a round every
    trigger (`bench/partition_loop.py`), under the same load as the connector's case."""
    rate, partitions, trigger = case["rate"], case["partitions"], case["trigger"]
    stream = f"LOOP{rate}P{partitions}"
    run_sync(create_stream(client, stream, partitions))
    load = Load(url, stream, rate, args)
    sampler = ProcessSampler(SAMPLE_EVERY)  # the loop is this process: driver_python
    state: dict[str, Any] = {"sampling": False, "deadline": None}

    def until(read: int) -> bool:
        if not state["sampling"] and time.time() >= load.measure_from:
            sampler.__enter__()
            state["sampling"] = True
        if state["deadline"] is None and not load.running():
            load.finish()
            if state["sampling"]:
                sampler.__exit__()
            state["deadline"] = time.time() + args.drain_seconds
        deadline = state["deadline"]
        return deadline is not None and (read >= load.published or time.time() >= deadline)

    times, rounds = run_sync(
        read_rounds(url, stream, partitions, trigger, args.nats_py_batch, until)
    )
    run_sync(client.api.delete_stream(stream))
    figures = _latencies(load, times)
    figures["acked_ms"] = figures.pop("committed_ms")
    return {
        "case": {"kind": "partition_loop", **case},
        **figures,
        "kept_up": len(times) >= load.published,
        "round_ms": ms(rounds),
        **_cpu(sampler, figures["messages"]),
    }


def floor_case(spark: Any, partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    """Spark's floor at `partitions` input partitions: batches back to back, nothing to read.

    Its source is halted and the query left to go idle before it is stopped: a stop that
    interrupts the `foreachBatch`'s `collect()` makes Spark match its interruption regex
    (`StreamExecution.PROXY_ERROR`, one recursion a character) against the long Py4J error,
    and the stream execution thread dies of a `StackOverflowError`."""
    halted = tempfile.TemporaryDirectory(prefix="nats-spark-floor-")
    halt = Path(halted.name, "halt")
    df = spark.readStream.format("latency_floor").option("partitions", partitions)
    df = df.option("rows", args.floor_rows).option("halt", str(halt)).load()
    collector = InHand(stored="arrived")
    with halted, _running(df, collector, 0) as query:
        _until(lambda: len(collector.batches) >= FLOOR_WARM_BATCHES, 300, query)
        started, before = time.time(), len(collector.batches)
        with ProcessSampler(SAMPLE_EVERY) as sampler:
            _until(lambda: time.time() - started >= args.floor_seconds, args.floor_seconds + 1)
            _until(lambda: len(collector.batches) >= before + 3, 300, query)
            measured = len(collector.batches) - before
        halt.touch()
        _until(lambda: _idle(query), 300, query)
    progress = progress_batches(query)
    warm = {b: p for b, p in progress.items() if p["started"] >= started}
    details = batch_details(warm, collector.batches, None, None)
    spent = sampler.cpu_seconds()
    handed = [collector.batches[batch] for batch in warm]
    arrived = [hand.in_hand - at for hand in handed for at in hand.stored]
    return {
        "case": {"kind": "spark_floor", "partitions": partitions, "trigger": 0},
        "rows_per_partition": args.floor_rows,
        "in_hand_ms": ms(arrived),
        **summarize_batches(details),
        "cpu_ms_per_batch": {k: round(v / max(1, measured) * 1000) for k, v in spent.items()},
    }


def connector_case(
    spark: Any,
    client: NatsClient,
    url: str,
    case: dict[str, Any],
    args: argparse.Namespace,
    probe_dir: Path,
) -> dict[str, Any]:
    rate, partitions, trigger = case["rate"], case["partitions"], case["trigger"]
    stream = f"LAT{rate}P{partitions}T{str(trigger).replace('.', '_')}"
    members = min(args.members, partitions)
    options = dict(option.split("=", 1) for option in args.option)
    run_sync(create_stream(client, stream, partitions))
    run_sync(create_group(client, stream, "g", members, partitions))
    bucket = options.get("ledgerBucket", SourceOptions.ledger_bucket)
    requests = ServerRequests(client, bucket, stream)
    collector = InHand(stored="timestamp")
    df = reader(spark, url, stream, "g", options, source=TimedNatsPcg.name())
    with _running(df, collector, trigger) as query:
        run_sync(publish(client, stream, PRIME, args.size, args.keys))
        _until(lambda: collector.rows >= PRIME, 300, query)
        run_sync(requests.start())
        try:
            load = Load(url, stream, rate, args)
            sampler = load.measure()
            expected = PRIME + load.published
            kept_up = _until(lambda: collector.rows >= expected, args.drain_seconds, query)
            last = max(collector.batches)
            _until(lambda: any(p["batchId"] == last for p in query.recentProgress), 30, query)
            # stopped once idle, as the floor is (`floor_case`): its last acks' batch ran
            _until(lambda: _idle(query), 60, query)
        finally:
            run_sync(requests.stop())
    progress = progress_batches(query)
    run_sync(client.api.delete_stream(stream))
    probe = Probe.take(probe_dir)
    times = [
        (stored, hand.in_hand, progress[batch]["committed"])
        for batch, hand in collector.batches.items()
        if batch in progress
        for stored in hand.stored
    ]
    measured = {b: p for b, p in progress.items() if p["started"] >= load.measure_from}
    details = batch_details(measured, collector.batches, probe, requests)
    if args.per_batch:
        for detail in details:
            emit("latency_batch", {"case": case, **detail})
    figures = _latencies(load, times)
    return {
        "case": {"kind": "connector", **case, "members": members},
        **figures,
        "kept_up": kept_up,
        **summarize_batches(details),
        "server_requests_per_batch": requests.per_window(
            [(p["started"], p["committed"]) for p in measured.values()]
        ),
        "driver_idle_polls": idle_polls(probe, load.measure_from, load.measure_to),
        **_cpu(sampler, figures["messages"]),
    }


def _name(case: dict[str, Any]) -> str:
    kind = case["kind"]
    if kind == "nats_py":
        return f"nats-py, {case['rate']:,} msg/s"
    if kind == "partition_loop":
        rate, partitions, trigger = case["rate"], case["partitions"], case["trigger"]
        return (
            f"nats-py per partition, {rate:,} msg/s, {partitions} partitions, trigger {trigger:g} s"
        )
    if kind == "spark_floor":
        return f"Spark floor, {case['partitions']} input partitions, trigger 0 s"
    partitions, trigger = case["partitions"], case["trigger"]
    return f"{case['rate']:,} msg/s, {partitions} partitions, trigger {trigger:g} s"


def input_partitions(partitions: int, options: list[str] | None) -> int:
    """The input partitions (Spark tasks) of a batch over `partitions` slots: fewer where
    `maxTasksPerBatch` packs them, the count Spark's floor is measured at."""
    packed = [int(o.split("=", 1)[1]) for o in options or [] if o.startswith("maxTasksPerBatch=")]
    return min([partitions, *packed])


def summary(results: list[dict[str, Any]], options: list[str] | None) -> list[dict[str, Any]]:
    """The ratios, each naming its case; a connector's batch and in-hand p99 beside Spark's
    floor at as many tasks."""
    done = [r for r in results if "error" not in r]
    by_rate = {r["case"]["rate"]: r for r in done if r["case"]["kind"] == "nats_py"}
    floors = {r["case"]["partitions"]: r for r in done if r["case"]["kind"] == "spark_floor"}
    loops = {
        (r["case"]["rate"], r["case"]["partitions"], r["case"]["trigger"]): r
        for r in done
        if r["case"]["kind"] == "partition_loop"
    }
    ratios: list[dict[str, Any]] = [
        {"case": _name(r["case"]), "error": r["error"]} for r in results if "error" in r
    ]
    for result in (r for r in done if r["case"]["kind"] == "connector"):
        case = result["case"]
        line: dict[str, Any] = {"case": _name(case), "kept_up": result["kept_up"]}
        nats_py = by_rate.get(case["rate"])
        p99 = result["in_hand_ms"]["p99"]
        floor = floors.get(input_partitions(case["partitions"], options))
        if nats_py and p99 is not None and nats_py["in_hand_ms"]["p99"]:
            line["p99_in_hand_ms"] = [p99, nats_py["in_hand_ms"]["p99"]]
            line["p99_vs_nats_py"] = round(p99 / nats_py["in_hand_ms"]["p99"], 1)
        floor_p99 = floor["in_hand_ms"]["p99"] if floor else None
        if p99 is not None and floor_p99:
            # the floor's messages arrive evenly and its batches run back to back: at any
            # trigger, no Python source with as many tasks has them in hand sooner
            line["p99_in_hand_ms_vs_spark_floor"] = [p99, floor_p99]
        batch_ms = result["batch_ms"][0]
        if floor and batch_ms is not None and floor["batch_ms"][0]:
            line["batch_ms_p50"] = [batch_ms, floor["batch_ms"][0]]
            line["batch_ms_vs_spark_floor"] = round(batch_ms / floor["batch_ms"][0], 1)
        loop = loops.get((case["rate"], case["partitions"], case["trigger"]))
        if loop and batch_ms is not None and loop["round_ms"]["p50"]:
            # the server's per-consumer work is in both: what the connector adds per partition
            line["batch_ms_p50_vs_partition_loop_round"] = [batch_ms, loop["round_ms"]["p50"]]
        ratios.append(line)
    return ratios


def main() -> None:
    args = _args()
    rates, partition_counts = _numbers(args.rates, int), _numbers(args.partitions, int)
    triggers = _numbers(args.triggers, float)
    started = time.time()
    header = {
        "cpus": psutil.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 1) for x in psutil.getloadavg()],
        "settings": vars(args),
    }
    results = []
    probes = tempfile.TemporaryDirectory(prefix="nats-spark-latency-probe-")
    with probes, EmbeddedServer() as server:
        probe_dir = Path(probes.name)
        os.environ[PROBE_DIR] = probes.name  # before the JVM starts: its processes inherit it
        url = server.url
        header["nats_server"] = ".".join(map(str, server.version))
        emit("latency_settings", header)
        client = run_sync(NatsClient.open(ConnectionSettings(servers=(url,))))
        spark = spark_session()
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        spark.dataSource.register(TimedNatsPcg)
        spark.dataSource.register(LatencyFloor)
        try:
            # Warms the JVM up, not reported: a fresh JVM's first queries run several times slower.
            floor_case(spark, input_partitions(min(partition_counts), args.option), args)
            floored: set[int] = set()

            def run(case: Callable[..., dict[str, Any]], named: dict[str, Any], *on: Any) -> None:
                """Run the case `named`, print its figures with its wall time, keep them."""
                case_started = time.time()
                try:
                    figures = case(*on)
                except Exception as error:  # one case failing (a loaded machine's timeouts)
                    figures = {"case": named, "error": str(error).splitlines()[0]}
                results.append({**figures, "wall_seconds": round(time.time() - case_started)})
                emit("latency_case", results[-1])

            for tasks in _numbers(args.floor_only, int) if args.floor_only else []:
                floor = {"kind": "spark_floor", "partitions": tasks, "trigger": 0}
                run(floor_case, floor, spark, tasks, args)
            for rate in [] if args.floor_only else rates:
                run(nats_py_case, {"kind": "nats_py", "rate": rate}, url, client, rate, args)
                for partitions in partition_counts:
                    tasks = input_partitions(partitions, args.option)
                    if tasks not in floored:  # beside the first cases at this count
                        floor = {"kind": "spark_floor", "partitions": tasks, "trigger": 0}
                        run(floor_case, floor, spark, tasks, args)
                        floored.add(tasks)
                    for trigger in triggers:
                        case = {"rate": rate, "partitions": partitions, "trigger": trigger}
                        named = {"kind": "connector", **case}
                        run(connector_case, named, spark, client, url, case, args, probe_dir)
                        if args.partition_loop:
                            looped = {"kind": "partition_loop", **case}
                            run(partition_loop_case, looped, url, client, case, args)
        finally:
            spark.stop()
            run_sync(client.close())
    ratios = summary(results, args.option)
    total = {
        "ratios": ratios,
        "total_seconds": round(time.time() - started),
        "load_average_at_end": [round(x, 1) for x in psutil.getloadavg()],
    }
    print(json.dumps({"bench": "latency_summary", **total}, indent=2), flush=True)


if __name__ == "__main__":
    main()
