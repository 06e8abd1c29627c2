"""A fresh job's fixed cost: CPU seconds by process kind of small fresh-process reads
(`bench/fresh_job.py`, as spark-submit runs a job), where start-up is nearly all of it; with
`--compare DIR`, alternately (ABBA) with the code of another checkout (e.g. `git archive` of a base
commit unpacked in DIR), so that a shared machine's drift falls on both alike.

    python bench/fresh_cost.py --messages 20000 --keys 1000 --rounds 2 --compare /tmp/base

Prints one JSON line per run, then per checkout each kind's median, lowest and highest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cases import MEMBERS, PAYLOAD, ROOT, fresh_read  # noqa: E402
from bench.common import create_group, create_stream, publish  # noqa: E402
from nats_spark.client import NatsClient  # noqa: E402
from nats_spark.connection import ConnectionSettings  # noqa: E402
from nats_spark.loop import run_sync  # noqa: E402
from nats_spark.server import EmbeddedServer  # noqa: E402


def spread(runs: list[dict[str, float]]) -> dict[str, list[float]]:
    """Each kind's [median, lowest, highest] CPU seconds over `runs`."""
    kinds = sorted({kind for run in runs for kind in run})
    return {
        kind: [
            round(statistics.median(values), 3),
            min(values),
            max(values),
        ]
        for kind in kinds
        for values in [[run.get(kind, 0.0) for run in runs]]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="100-byte messages")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct subjects")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each checkout")
    parser.add_argument("--compare", type=Path, help="another checkout, run alternately")
    args = parser.parse_args()
    roots = {"this": ROOT, **({"compare": args.compare.resolve()} if args.compare else {})}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in roots}
    with EmbeddedServer() as server:
        client = run_sync(NatsClient.open(ConnectionSettings(servers=(server.url,))))
        stream = "FRESHCOST"
        run_sync(create_stream(client, stream))
        run_sync(publish(client, stream, args.messages, PAYLOAD, args.keys))
        for round_ in range(args.rounds):
            order = list(roots.items())
            for label, root in order if round_ % 2 == 0 else reversed(order):  # ABBA
                group = f"{label}{round_}"
                run_sync(create_group(client, stream, group, MEMBERS))
                figures = fresh_read(server.url, stream, group, args.messages, {}, root)
                cpu = figures["cpu_seconds"]
                runs[label].append(cpu)
                print(json.dumps({"checkout": label, "round": round_, "cpu_seconds": cpu}))
        run_sync(client.close())
    print(json.dumps({label: spread(cpu) for label, cpu in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
