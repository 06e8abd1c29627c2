"""A query runs for weeks: what it writes to the ledger bucket per batch is removed again, and a
batch's work does not grow with the batches before it. The coordinator and its packed tasks,
driven as Spark calls them, on a real server, batch after batch (with an idle trigger now and
then): the bucket's stored messages (heads, chunks, the pointer, markers), the driver's
entries, the pointer's size and the ledger requests per batch stay where they were after the
first batches."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from spark_helpers import publish, static_group, unacked, wait_until

from bench.packed_planning import BucketOps
from nats_spark.loop import run_sync
from nats_spark.spark.group_source import ledger_protocol
from nats_spark.spark.group_source.driver.batch_coordinator import BatchCoordinator
from nats_spark.spark.group_source.ledger import pointer_key
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.group_source.slot_partition import PackedSlots
from nats_spark.spark.group_source.task.slot_reader import read_packed

TRIGGERS = 100
PARTITIONS = 8
PER_BATCH = 3 * PARTITIONS  # messages published before each busy trigger
IDLE_EVERY = 10  # every tenth trigger finds nothing new
EARLY, LATE = slice(20, 50), slice(70, TRIGGERS)  # after the first batches; the run's last


@dataclass
class Trigger:
    """What one trigger left: the ledger requests it sent, and the state after its commit."""

    requests: int
    stored: int  # messages the bucket's stream holds
    entries: int  # the driver's ledger entries
    pointer: int  # bytes of the target's pointer


def test_a_long_run_leaves_the_ledger_and_a_batch_s_work_as_they_were(
    client, nats_url, unique, monkeypatch
):
    # Entries settle once the consumers' ack floors pass them (not 10 s later): what the
    # bucket holds then depends on the batches, not on how fast this machine runs them.
    monkeypatch.setattr(ledger_protocol, "SETTLE_SECONDS", 0.0)
    stream, bucket = f"LONG{unique}", f"L{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=PARTITIONS)
    options = {"servers": nats_url, "stream": stream, "group": "g", "maxTasksPerBatch": "2"}
    reader = BatchCoordinator(parse_options({**options, "ledgerBucket": bucket}))
    triggers: list[Trigger] = []
    rows: list[int] = []
    published = 0
    ops = BucketOps()  # the ledger's requests, by kind
    try:
        end = run_sync(reader.initial_offset())
        kv = run_sync(client.target.js.key_value(bucket))
        for index in range(TRIGGERS + 1):  # the last one acks the last batch
            if index % IDLE_EVERY != IDLE_EVERY - 1 and index < TRIGGERS:
                publish(client, stream, PER_BATCH, start=published)
                published += PER_BATCH
            ops.take()
            start, end = end, run_sync(reader.latest_offset(end, None))
            if end is not start:
                for task in run_sync(reader.input_partitions(start, end)):
                    assert isinstance(task, PackedSlots)
                    rows += [
                        s for b in read_packed(task) for s in b.column("stream_seq").to_pylist()
                    ]
                run_sync(reader.commit(end))
            stored = run_sync(client.api.stream_info(f"KV_{bucket}"))["state"]["messages"]
            requests = sum(ops.take().values())
            pointer = run_sync(kv.get(pointer_key(stream, "g"))).value or b""
            triggers.append(Trigger(requests, stored, len(reader.ledger.entries), len(pointer)))
        wait_until(lambda: unacked(client, stream, "g") == 0, 30, "every message acked")
    finally:
        ops.remove()
        run_sync(reader.close())
    assert sorted(rows) == list(range(1, published + 1)), "a message was lost or read twice"

    early, late = triggers[EARLY], triggers[LATE]
    busy = [index % IDLE_EVERY != IDLE_EVERY - 1 for index in range(TRIGGERS)]
    early_busy = [t.requests for t, b in zip(early, busy[EARLY], strict=True) if b]
    late_busy = [t.requests for t, b in zip(late, busy[LATE], strict=True) if b]
    # A leak of one key a batch would add 30 over the late triggers: the slack is under that.
    for what, slack in (("stored", PARTITIONS), ("entries", PARTITIONS), ("pointer", 64)):
        before = max(getattr(t, what) for t in early)
        after = max(getattr(t, what) for t in late)
        assert after <= before + slack, f"{what} grew from {before} to {after} over the run"
    # Once the last batch is acked and settled: the pointer and the driver's presence record.
    assert triggers[-1].stored <= 2 and triggers[-1].entries == 0, triggers[-1]
    assert statistics.mean(late_busy) <= statistics.mean(early_busy) * 1.1 + 2, (
        early_busy,
        late_busy,
    )
