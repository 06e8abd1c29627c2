"""How large a slot task's record batches get, on a real server: each is what one pull delivered,
and a pull is capped at a record batch's bounds (rows and bytes), whatever `fetchBatchSize` asks,
so a worker holds at most that much at a time."""

from __future__ import annotations

import dataclasses

from spark_helpers import Slot, publish, seqs_of

from nats_spark.client import close_shared_clients
from nats_spark.jetstream.api import to_nanos
from nats_spark.loop import run_sync
from nats_spark.pcg.consumers import ensure_group_consumer, member_consumer
from nats_spark.pcg.store import load_group
from nats_spark.spark.group_source.task.slot_reader import read_slot
from nats_spark.spark.shared.columns import BATCH_BYTES, BATCH_ROWS

LARGE = 700_000  # bytes: under nats-server's default max payload (1 MB)


def test_record_batches_stay_within_their_rows_and_bytes(client, settings, unique) -> None:
    slot = Slot(client, settings, unique)
    # Room for more than a record batch's rows in flight (the slot's consumer allows 1,000).
    run_sync(client.target.api.delete_consumer(slot.stream, slot.consumer.name))
    entry = run_sync(load_group(client.target, slot.stream, "g"))
    roomy = {"ack_wait": to_nanos(30), "max_ack_pending": 100_000}
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1", roomy)))
    small = BATCH_ROWS + 600
    publish(client, slot.stream, small)
    for n in range(8):
        run_sync(client.target.js.publish(f"{slot.stream}.large", bytes([n]) * LARGE))
    partition = slot.partition(1, limit=small + 8)
    wide = dataclasses.replace(partition.reading, fetch_batch_size=100_000, fetch_timeout=1.0)
    try:
        batches = list(read_slot(dataclasses.replace(partition, reading=wide)))
    finally:
        close_shared_clients()
    assert seqs_of(iter(batches)) == list(range(1, small + 9))
    assert max(batch.num_rows for batch in batches) <= BATCH_ROWS
    payloads = [batch.column("data").nbytes for batch in batches]
    assert max(payloads) <= BATCH_BYTES + LARGE, payloads
    assert sum(1 for batch in batches if batch.num_rows < BATCH_ROWS) >= 2  # the large ones split
