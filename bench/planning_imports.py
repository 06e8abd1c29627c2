"""What our modules cost the Python processes Spark starts to look a format up, create the
source and plan its read (none of which connects, but for nats-pcg's `schema()` at load(),
which checks the target on the server and is left out here): CPU seconds, in fresh interpreters, of
importing both `pyspark_*` modules, making a `nats-pcg` and a `nats` source, their stream
readers and pickling their `read`, after pyspark's own worker modules (imported there before
ours); with `--compare DIR`, alternately with the code of another checkout (e.g. `git archive`
of a base commit unpacked in DIR). Also prints which of `CLIENT` got imported (none should:
tests/spark/test_entry_points.py runs the same probe).

    python bench/planning_imports.py --runs 9 --compare /tmp/base
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What only a connection or a read needs: about 0.1 CPU-s a process (nats-py alone is 70 ms).
CLIENT = ("nats", "asyncio", "pyarrow.compute", "nats_spark.loop", "nats_spark.connect")

# As Spark's lookup_data_sources.py, create_data_source.py and plan_data_source_read.py do: the
# create process parses the options and pickles the source, the plan process unpickles it, makes
# the stream reader and pickles its `read` for the executors. The options name every enum.
# (A batch read's plan process asks the source for its partitions, which connects.)
PROBE = f"""
import json, pickle, sys, time
from types import SimpleNamespace
import pyspark.sql.worker.lookup_data_sources, pyspark.sql.worker.create_data_source
import pyspark.sql.worker.plan_data_source_read
from pyspark import cloudpickle

started = time.process_time()
import pyspark_nats, pyspark_nats_pcg
from nats_spark.spark.shared.schema import SCHEMA_FIELDS

options = {{
    "servers": "nats://127.0.0.1:1", "stream": "S", "group": "g", "groupType": "static",
    "consumerLayout": "partition", "startingPosition": "sequence:5", "domain": "hub",
}}
source = pickle.loads(pickle.dumps(pyspark_nats_pcg.DefaultSource(options)))
schema = SimpleNamespace(fields=[
    SimpleNamespace(name=name, dataType=SimpleNamespace(simpleString=lambda kind=kind: kind))
    for name, kind in SCHEMA_FIELDS
])
cloudpickle.dumps(source.streamReader(schema).read)
whole = pyspark_nats.DefaultSource({{"servers": "nats://127.0.0.1:1", "stream": "S"}})
whole = pickle.loads(pickle.dumps(whole))
cloudpickle.dumps(whole.streamReader(schema).read)
print(json.dumps({{
    "cpu_seconds": time.process_time() - started,
    "imported": [m for m in {CLIENT!r} if m in sys.modules],
}}))
"""


def run(root: Path) -> dict:
    """One fresh interpreter in `root` (first on its path, as the working directory)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="interpreters per checkout")
    parser.add_argument("--compare", type=Path, help="another checkout, run alternately")
    args = parser.parse_args()
    roots = {"this": ROOT, **({"compare": args.compare.resolve()} if args.compare else {})}
    results: dict[str, list[dict]] = {label: [] for label in roots}
    for _ in range(args.runs):
        for label, root in roots.items():
            results[label].append(run(root))
    for label, runs in results.items():
        cpu = sorted(r["cpu_seconds"] for r in runs)
        summary = {
            "checkout": label,
            "cpu_seconds_median": round(statistics.median(cpu), 3),
            "lowest": round(cpu[0], 3),
            "highest": round(cpu[-1], 3),
            "imported": runs[0]["imported"],
        }
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
