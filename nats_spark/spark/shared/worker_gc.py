"""Garbage collection in Spark's Python workers.

A reused worker runs a full collection after every task (pyspark's `daemon.py`), and a full
collection walks every object the worker holds: mostly what its imports left (pyspark, pyarrow,
nats-py; tens of thousands of objects, 40 ms of CPU per collection on a loaded 2-core machine),
for each task of each batch. The connector's readers freeze those once per worker process, before
their first read: later collections walk only what tasks create since. (Their columns are built
from buffers, so pyarrow never imports pandas into a worker: see `columns`.)
"""

from __future__ import annotations

import gc
import os

_frozen_in: int | None = None  # the pid that froze: a forked child freezes its own


def freeze_imports() -> None:
    """Exempt what this process holds now from later collections; once per process."""
    global _frozen_in
    if _frozen_in != os.getpid():
        _frozen_in = os.getpid()
        gc.freeze()
