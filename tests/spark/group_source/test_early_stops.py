"""A batch whose tasks Spark stops early, with a real Spark session and server: the notebook
pattern of a foreachBatch that first asks `df.isEmpty()` and then reads the whole batch.

Spark 4.0, 4.1 and 4.3 stop such a task by closing its Python worker's socket once the limit is
met (the task completion listener of `BasePythonRunner.compute` stops the worker, which was not
released: its output was not read to the end). The worker notices at its next write (it flushes
every 64 KiB: a task whose rows fit runs to its end), and the `finally` of `worker.py`'s
`process` closes the output iterator, which closes the reader's generator in the process
(`_drive`'s `finally`): the task's slots give back what they did not record and release their
entries, and the batch's second read takes those over at once. A packed task's slots are
cancelled mid-step: one cancelled in its seal's write, or while it awaited its keeper's end,
left its entry held, and the second read stood by `HOLD_QUIET` for it (1 packed run in 2-3)."""

from __future__ import annotations

import time
from collections import Counter
from functools import partial

import pytest
from spark_helpers import (
    assert_exactly_once,
    foreach_batches,
    publish,
    settled,
    source,
    static_group,
    wait_until,
)

from nats_spark.client import NatsClient
from nats_spark.loop import run_sync
from nats_spark.spark.group_source.ledger import EntryState, Ledger, read_head
from nats_spark.spark.group_source.ledger_protocol import HOLD_QUIET

pytestmark = pytest.mark.spark

MESSAGES, PARTITIONS = 2400, 4
# Rows of ~400 bytes pulled 100 at a time: each task hands Spark many record batches, far more
# than the 64 KiB its worker buffers, so that Spark has the first rows long before the last.
PAD, FETCH = 300, 100


async def newest_entries(client: NatsClient, bucket: str) -> Counter[str]:
    """The entries of the newest batch in the ledger, by state: `held` (OPEN, not released: a
    read of the batch stands by for it until it goes quiet), `released` (OPEN, given up by a
    stopped attempt: taken over at once), or their state's name."""
    kv = await Ledger.bucket(client, bucket, create=False)
    lineages = {k.split(".")[0] for k in await kv.keys_matching("*.*.*") if k[:6] != "query."}
    entries = [
        (ledger, gen, slot)
        for ledger in map(partial(Ledger, kv), lineages)
        for gen, slot in await ledger.heads()
    ]  # a packed key's heads too
    newest = max((gen for _, gen, _ in entries), default=0)
    states: Counter[str] = Counter()
    for ledger, gen, slot in entries:
        if gen == newest and (found := await read_head(ledger, gen, slot)) is not None:
            head = found[0]
            if head.state is not EntryState.OPEN:
                states[head.state.name.lower()] += 1
            else:
                states["released" if head.released else "held"] += 1
    return states


# What it rests on is how Spark stops a task, so it runs on the older Sparks too (4.0 and 4.1
# share `BasePythonRunner` and `worker.py`: 4.0 stands for both).
@pytest.mark.compat("4.0")
@pytest.mark.parametrize("packing", [{}, {"maxTasksPerBatch": 1}], ids=["", "packed"])
def test_a_batch_read_after_is_empty_is_read_whole_and_at_once(
    spark, client, nats_url, unique, tmp_path, packing
):
    """foreachBatch asks `isEmpty()` (Spark stops its tasks after their first rows), then
    collects the batch: every message once, all acked at the end, and after the first read
    no entry of the batch is left held by a stopped task (the second read would stand by
    `HOLD_QUIET` for it), so the second read does not wait for one to go quiet."""
    stream, bucket = f"EARLY{unique}", f"L{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=PARTITIONS)
    publish(client, stream, MESSAGES, pad=PAD)
    seen: list[int] = []
    timings: list[tuple[float, float, float]] = []  # isEmpty, until none held, collect (s)
    after_first: list[Counter[str]] = []  # the batch's entries once none is held

    def first_checked_then_read(batch, batch_id):
        began = time.monotonic()
        if batch.isEmpty():
            return
        checked = time.monotonic()
        entries = lambda: run_sync(newest_entries(client.target, bucket))  # noqa: E731
        after_first.append(
            wait_until(
                lambda: (found := entries())["held"] == 0 and found,
                HOLD_QUIET,
                "the stopped tasks to let go of their entries",
                every=0.05,
            )
        )
        let_go = time.monotonic()
        seen.extend(int(row.data) for row in batch.select("data").collect())
        timings.append((checked - began, let_go - checked, time.monotonic() - let_go))

    df = source(
        spark,
        nats_url,
        stream,
        "g",
        ledgerBucket=bucket,
        fetchBatchSize=FETCH,
        maxMessagesPerTrigger=MESSAGES // 2,
        **packing,
    )
    query = foreach_batches(df, first_checked_then_read, tmp_path / "cp", "300 milliseconds")
    try:
        read = lambda: len(seen) >= MESSAGES or not query.isActive  # noqa: E731
        wait_until(read, 180, f"{MESSAGES} rows")
        assert query.exception() is None
        wait_until(lambda: settled(client, stream), 60, "all acked")
    finally:
        query.stop()
    print(f"batches (isEmpty s, until none held s, collect s): {timings}; entries {after_first}")
    assert_exactly_once(seen, MESSAGES)
    assert len(timings) >= 2
