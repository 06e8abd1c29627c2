"""Run schedules of the ack-ledger simulation.

    python -m tests.simulation --seeds 0-100000 [--jobs 2]   # a range; prints each failing seed
    python -m tests.simulation --seed 1234 [--verbose]       # one, with its schedule
    python -m tests.simulation --seeds 0-2000 --speculation 0.1  # spark.speculation on

A failing seed is reproduced by the second form; --verbose prints every scheduling point too.
--spark and --without change what the seed drew (the same draws follow), to see what a failure
rests on: e.g. a seed that passes with --spark 4.2+ failed on the call order of 4.0/4.1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

from tests.simulation.spark import V40, V42
from tests.simulation.world import Result, run_schedule, run_schedules

FAULTS = {  # --without <name>: the setup field set to 0
    "lost-answers": "lost_answer",
    "sink-failures": "sink_failure",
    "server-restarts": "restart_after_acks",
    "purges": "purges",
}


def seed_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def _summary(result: Result) -> str:
    findings = result.problems or result.order_breaks
    return f"seed {result.seed} (Spark {result.setup.version}): {findings[0]}"


# The families of worlds a run may ask for (`Setup`'s overrides that are never drawn), each a
# flag of its own: `--stalling-executors` for `stalling_executors`.
WORLDS = {
    "packed": "both slots read by one task (maxTasksPerBatch=1)",
    "stalling_executors": "executors pause: often shortly, and for ack waits after which Spark "
    "lost the attempt",
    "other_client": "another client reads the query's overflow consumer and acks what it takes",
    "replaced_mid_batch": "a query stopped mid-batch is replaced at once by one on a new "
    "checkpoint",
    "removals_return": "the server's restarts are unclean and bring back removed ledger keys",
    "recreate_consumer": "a consumer is deleted and created again (DeliverAll) while the query "
    "reads it",
    "floor_from_zero": "nats-server 2.11-2.12: a new consumer reports its ack floor as 0 until "
    "an ack",
    "follows_advice": "an operator does what a refusal of a consumer created again says",
    "early_stops": "a job reads a batch's tasks first and Spark stops them after their first rows",
    "fresh_executors": "each task attempt runs in a new executor process, which read no entry yet",
}


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.simulation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, help="run this seed only and print its schedule")
    parser.add_argument("--seeds", type=seed_range, default=range(0, 1000), help="e.g. 0-100000")
    parser.add_argument("--jobs", type=int, default=1, help="processes for a range")
    parser.add_argument("--verbose", action="store_true", help="print every scheduling point")
    parser.add_argument("--spark", choices=(V40, V42), help="this Spark's call order")
    parser.add_argument(
        "--without", action="append", default=[], choices=FAULTS, help="turn a fault off"
    )
    parser.add_argument(
        "--strict-order",
        action="store_true",
        help="per-key order breaks of the README's first two cases fail too",
    )
    for world, help in WORLDS.items():
        parser.add_argument(f"--{world.replace('_', '-')}", action="store_true", help=help)
    parser.add_argument(
        "--chaos-waits", type=float, help="how long the chaotic phase lasts, in ack waits"
    )
    parser.add_argument(
        "--speculation",
        type=float,
        help="spark.speculation on: a copy of a task attempt running this many seconds",
    )
    parser.add_argument(
        "--slow-ledger",
        type=float,
        help="the answers to task attempts' ledger requests take up to this many ack waits",
    )
    args = parser.parse_args()
    overrides: dict[str, Any] = {FAULTS[name]: 0.0 for name in args.without}
    if args.speculation is not None:
        overrides["speculation"] = args.speculation
    if args.chaos_waits is not None:
        overrides["chaos_waits"] = args.chaos_waits
    if args.slow_ledger is not None:
        overrides["slow_ledger"] = args.slow_ledger
    if args.spark:
        overrides["version"] = args.spark
    overrides.update({world: True for world in WORLDS if getattr(args, world)})
    if args.seed is not None:
        result = run_schedule(args.seed, verbose=args.verbose, **overrides)
        if not args.verbose:
            print("\n".join(result.trace))
        print(f"seed {args.seed}: {result.setup}")
        for problem in result.problems:
            print(f"PROBLEM {problem}")
        for order_break in result.order_breaks:
            print(f"ORDER {order_break}")
        for why, count in sorted(result.order_reasons.items()):
            print(f"ORDER {count}: {why}")
        for why, count in sorted(result.let_out.items()):
            print(f"LET OUT {count} committed to the other client: {why}")
        return 1 if result.problems or (args.strict_order and result.order_breaks) else 0
    failed = broke_order = 0
    reasons, let_out = Counter[str](), Counter[str]()
    started = time.monotonic()
    for result in run_schedules(args.seeds, args.jobs, **overrides):
        reasons += result.order_reasons
        let_out += result.let_out
        if result.problems:
            failed += 1
            print(_summary(result), flush=True)
        elif result.order_breaks:
            broke_order += 1
            print(_summary(result), flush=True)
    took = time.monotonic() - started
    count = len(args.seeds)
    print(
        f"{count} schedules: {failed} broke a guarantee, {broke_order} broke per-key order only "
        "as the README allows; "
        f"{took:.1f}s ({count / took:.0f} schedules/s)"
    )
    if reasons:
        ends = ", ".join(f"{breaks} {why}" for why, breaks in reasons.most_common())
        print(f"per-key order breaks, by what left the late message to its ack wait: {ends}")
    for why, count in let_out.most_common():
        print(f"LET OUT {count} committed to the other client: {why}")
    return 1 if failed or (args.strict_order and broke_order) else 0


if __name__ == "__main__":
    sys.exit(main())
