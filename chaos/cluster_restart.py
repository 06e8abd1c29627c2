"""The three-node fail-and-restart scenario, run many times: the job reads an elastic group
(everything replicated three times) through a TCP proxy per server; mid-stream the leader of one
of its consumers is killed -9 and restarted; the job, restarted whenever a fault fails its query,
must commit every message exactly once and ack them all. Prints one line per run and a JSON
summary; exit code 1 if any run lost, duplicated or left a message unacked.

    .venv/bin/python chaos/cluster_restart.py --runs 20 [--messages 1500] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from nats.errors import Error as NatsError

from chaos.run import (
    WORK_QUEUE,
    Job,
    Nats,
    create_group,
    group_consumers,
    log,
    retried,
    send_numbered,
)
from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.loop import Blocking, run_sync


def publish(client: Blocking[NatsClient], count: int, start: int = 0) -> None:
    """`send_numbered`, sent again while the stream elects a leader (within 3 minutes)."""
    deadline = time.monotonic() + 180
    while True:
        try:
            run_sync(send_numbered(client.target, count, start), timeout=60)
            return
        except (NatsError, TimeoutError):  # no leader yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def work_queue_state(client: Blocking[NatsClient]) -> dict[str, int]:
    return retried(lambda: run_sync(client.api.stream_info(WORK_QUEUE), timeout=5))["state"]


@dataclass
class RunResult:
    run: int
    killed: str
    published: int
    committed: int
    lost: int
    duplicated: int
    unacked: int
    job_starts: int
    seconds: float

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.duplicated or self.unacked)


def one_run(number: int, args: argparse.Namespace, folder: Path) -> RunResult:
    nats = Nats(cluster=True)
    client = open_blocking(
        ConnectionSettings(servers=tuple(nats.direct_urls.split(",")), name="cluster-restart")
    )
    job = Job(nats.proxied_urls, folder, per_trigger=args.per_trigger)
    began = time.monotonic()
    try:
        retried(lambda: run_sync(client.api.account_info()))
        retried(lambda: create_group(client, 3))
        publish(client, args.messages)
        job.start()
        # Mid-stream: some of the backlog acked, some still held in the work queue.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            state = work_queue_state(client)
            if state["first_seq"] > 50 and state["messages"] > 0:
                break
            time.sleep(0.1)
        consumer = retried(lambda: group_consumers(client)[0])
        info = retried(lambda: run_sync(client.api.consumer_info(WORK_QUEUE, consumer)))
        leader = info["cluster"]["leader"]
        nats.server_named(leader).kill()
        time.sleep(3)  # a replica takes over
        nats.server_named(leader).start()
        publish(client, args.tail, start=args.messages)
        total = args.messages + args.tail
        deadline = time.monotonic() + args.timeout
        left = -1
        while time.monotonic() < deadline:
            if not job.running:
                log(f"run {number}: the job ended (its query failed): restarting it")
                job.start()
            left = work_queue_state(client)["messages"]
            if left == 0 and len(set(job.committed())) >= total:
                break
            time.sleep(1)
    finally:
        job.stop()
        run_sync(client.target.close())
        nats.close()
    rows = job.committed()
    return RunResult(
        run=number,
        killed=f"{leader}, leader of {consumer}",
        published=total,
        committed=len(rows),
        lost=len(set(range(total)) - set(rows)),
        duplicated=len(rows) - len(set(rows)),
        unacked=left,
        job_starts=job.starts,
        seconds=round(time.monotonic() - began, 1),
    )


def main() -> int:
    # SIGTERM ends the run through its cleanup (job, servers), like Ctrl-C
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--messages", type=int, default=1500, help="backlog before the kill")
    parser.add_argument("--tail", type=int, default=500, help="published after the restart")
    parser.add_argument(
        "--per-trigger", type=int, default=100, help="maxMessagesPerTrigger: batches mid-stream"
    )
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per run to finish")
    parser.add_argument("--keep", help="keep every run's job log, output and checkpoint here")
    args = parser.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="nats-spark-cluster-"))
    results = []
    for number in range(1, args.runs + 1):
        folder = root / f"run{number}"
        folder.mkdir(parents=True, exist_ok=True)
        result = one_run(number, args, folder)
        results.append(result)
        log(json.dumps(asdict(result)))
        if not result.failed and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    failed = [r.run for r in results if r.failed]
    summary = {
        "runs": len(results),
        "failed_runs": failed,
        "lost": sum(r.lost for r in results),
        "duplicated": sum(r.duplicated for r in results),
        "job_restarts": sum(r.job_starts - 1 for r in results),
        "seconds_max": max(r.seconds for r in results),
    }
    print(json.dumps(summary))
    if failed:
        print(f"failed runs' job logs, output and checkpoints are in {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
