"""Garbage collection in Spark's Python workers.

A reused worker runs a full collection after every task (pyspark's `daemon.py`), and a full
collection walks every object the worker holds: mostly what its imports left (pyspark, pyarrow,
pandas, nats-py; about 85,000 objects, 40 ms of CPU per collection on a loaded 2-core machine),
for each task of each batch. The connector's readers freeze those once per worker process, before
their first read: later collections walk only what tasks create since.
"""

from __future__ import annotations

import gc
import os

import pyarrow as pa

_frozen_in: int | None = None  # the pid that froze: a forked child freezes its own


def freeze_imports() -> None:
    """Exempt what this process holds now from later collections; once per process. pyarrow
    imports pandas (when installed) the first time it converts a Python object, which a read
    does: that happens here first, so pandas' ~29,000 objects are frozen too."""
    global _frozen_in
    if _frozen_in != os.getpid():
        _frozen_in = os.getpid()
        pa.scalar(0)
        gc.freeze()
