"""The readers' freeze of a Spark worker's imports (worker_gc), in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

SCRIPT = r"""
import gc
# a reader's imports, before it freezes
from nats_spark.spark.group_source.task.columns import SlotColumns
from nats_spark.spark.shared.worker_gc import freeze_imports
assert gc.get_freeze_count() == 0
freeze_imports()
frozen = gc.get_freeze_count()
made_since = [[i] for i in range(1000)]
freeze_imports()  # once per process: what tasks make later stays collectable
assert frozen > 1000 and gc.get_freeze_count() == frozen, (frozen, gc.get_freeze_count())
columns = SlotColumns("S", "m1", partitioned=True, include_headers=True)
columns.add(b"1.a", b"x", b"NATS/1.0\r\nA: 1\r\n\r\n", 1, 1, 1, 5)
tracked = len(gc.get_objects())
columns.record_batch()  # a read's first record batch leaves no new imports to walk
assert len(gc.get_objects()) - tracked < 1000, len(gc.get_objects()) - tracked
"""


def test_imports_are_frozen_once_per_process() -> None:
    subprocess.run([sys.executable, "-c", SCRIPT], check=True, timeout=60)
