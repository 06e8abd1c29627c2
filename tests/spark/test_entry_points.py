"""What Spark's short-lived Python processes import: the modules Spark looks the formats up in."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.planning_imports import ROOT, run

pytestmark = pytest.mark.unit

# Only the driver's calls of a streaming query and the executors' reads need these; the
# processes that look a format up, create it or plan a batch read must not pay their imports.
HEAVY = (
    "pyarrow",
    "zstandard",
    "nats_spark.client",
    "nats_spark.spark.group_source.driver.batch_coordinator",
    "nats_spark.spark.group_source.task.slot_reader",
    "nats_spark.spark.group_source.ledger",
    "nats_spark.spark.stream_source.stream_range",
    "nats_spark.spark.sink.writers",
)


def test_looking_the_formats_up_imports_neither_half():
    """Making the sources, as Spark's lookup and create processes do (both formats' `schema()`,
    which Spark calls at a read's load(), checks the target on the server: that connects, on
    purpose)."""
    probe = (
        "import json, sys, pyspark_nats, pyspark_nats_pcg\n"
        "d = pyspark_nats_pcg.DefaultSource({'servers': 'nats://127.0.0.1:1', 'stream': 'S', "
        "'group': 'g'})\n"
        "pyspark_nats.DefaultSource({})\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(loaded) == []


def test_each_half_is_imported_where_it_is_used():
    """The stream reader reaches its driver half on first use, its read its executor half."""
    probe = (
        "import json, sys, pyspark_nats_pcg\n"
        "from nats_spark.spark.group_source.source import NatsPcgStreamReader\n"
        "from nats_spark.spark.group_source.options import parse_options\n"
        "r = NatsPcgStreamReader(parse_options({'servers': 'nats://127.0.0.1:1', "
        "'stream': 'S', 'group': 'g'}))\n"
        "before = 'nats_spark.spark.group_source.driver.batch_coordinator' in sys.modules\n"
        "try:\n    r.offsets\nexcept Exception:\n    pass\n"
        "print(json.dumps([before, "
        "'nats_spark.spark.group_source.driver.batch_coordinator' in sys.modules]))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(loaded) == [False, True]


def test_creating_and_planning_a_read_imports_no_client():
    """Spark's lookup, create and plan processes never connect: `bench.planning_imports`' probe
    does what they do, and none of nats-py, asyncio, pyarrow.compute or our client gets
    imported."""
    assert run(ROOT)["imported"] == []
