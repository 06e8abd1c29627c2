"""Packed tasks read against a real server, driven through the offset reader as Spark calls it:
every slot's rows once, and the next batch's ack-only tasks ack them all."""

from __future__ import annotations

from spark_helpers import publish, static_group, unacked, wait_until

from nats_spark.loop import run_sync
from nats_spark.spark.group_source.driver.offset_reader import OffsetReader
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.group_source.slot_partition import PackedSlots
from nats_spark.spark.group_source.task.partition_reader import read_packed


def test_a_packed_task_reads_its_slots_slot_by_slot(client, nats_url, unique):
    stream = f"PACK{unique}"
    static_group(client, stream, "g", ["m1", "m2"], partitions=4)
    publish(client, stream, 200)
    options = {"servers": nats_url, "stream": stream, "group": "g", "maxTasksPerBatch": "2"}
    reader = OffsetReader(parse_options({**options, "ledgerBucket": f"L{unique}"}))
    try:
        start = run_sync(reader.initial_offset())
        end = run_sync(reader.latest_offset(start, None))
        tasks = run_sync(reader.input_partitions(start, end))
        assert len(tasks) == 2 and all(isinstance(t, PackedSlots) for t in tasks)
        seqs: list[int] = []
        for task in tasks:
            assert isinstance(task, PackedSlots)
            assert len(task.slots) == 2
            seqs += [s for b in read_packed(task) for s in b.column("stream_seq").to_pylist()]
        assert sorted(seqs) == list(range(1, 201))
        following = run_sync(reader.latest_offset(end, None))
        for task in run_sync(reader.input_partitions(end, following)):
            assert isinstance(task, PackedSlots)
            assert list(read_packed(task)) == []  # ack-only
        wait_until(lambda: unacked(client, stream, "g") == 0, 30, "acks")
    finally:
        run_sync(reader.close())
