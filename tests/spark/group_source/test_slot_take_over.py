"""A retry's take-over of an open ledger entry, on a real server: it keeps what the attempt before
it recorded from redelivery for the whole attempt, not only once it seals, and the attempt it
took the entry from gives none of that back."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from spark_helpers import Slot, publish, puller, rest, seqs, seqs_of, wait_until

from nats_spark.client import close_shared_clients, shared_client
from nats_spark.jetstream.acks import NAK
from nats_spark.loop import run_sync
from nats_spark.pcg.consumers import PRIORITY_GROUP
from nats_spark.spark.group_source.ledger import EntryState, TakenOver
from nats_spark.spark.group_source.task.slot_reader import SlotReader, read_slot


def test_a_retry_keeps_what_it_took_over_while_it_pulls(client, settings, unique) -> None:
    """The first attempt records messages 1-3 and is closed mid-batch (its entry released, what
    it recorded left pending); the retry takes the entry over, replays them and pulls for more
    for `fetchTimeout` (3 s), three times the consumer's 1 s ack wait. The server never
    delivers them again: the retry restarted their wait at the take-over and kept it since.
    Without that (a retry that keeps only what it pulls) all three come back during its pulls."""
    slot = Slot(client, settings, unique)
    publish(client, slot.stream, 3)
    partition = dataclasses.replace(slot.partition(1, limit=10), ack_wait=1.0)  # the consumer's
    try:
        first = read_slot(partition)
        assert next(first).column("stream_seq").to_pylist() == [1, 2, 3]
        first.close()  # recorded, then closed before the seal: the entry is released
        assert slot.ledger_head(1).released
        rows = seqs_of(read_slot(partition))
        info = slot.info()
    finally:
        close_shared_clients()
    assert rows == [1, 2, 3]
    assert slot.entry(1)[0].state == EntryState.SEALED
    assert info["delivered"]["consumer_seq"] == 3 and info["num_redelivered"] == 0, info


def test_an_attempt_that_lost_its_entry_to_a_retry_gives_back_none_of_it(
    client, settings, unique, short_holds
) -> None:
    """Seed 851 of the simulation, on a real server. An attempt reads an overflow consumer
    another client reads too, three messages a pull: it records 1-6 and hands out 1-3, then
    stands still (its process paused) while a retry takes its entry over. It wakes, takes 7-9,
    and message 2 comes to it again (there its wait ran out during the pause; here it is NAKed
    by hand); its write of 7-9 finds the entry taken. It gives back 7-9, which no entry
    recorded, and not message 2: the retry keeps it with what the entry holds, and a NAK would
    hand it to the other client while the retry emits it."""
    slot = Slot(client, settings, unique)
    shared = slot.overflow_consumer(ack_wait=6.0)
    first_batch = dataclasses.replace(
        slot.partition(1, limit=60), consumer=shared, ack_wait=6.0, pin_id=None
    )
    partition = dataclasses.replace(
        first_batch, reading=dataclasses.replace(first_batch.reading, fetch_batch_size=3)
    )
    publish(client, slot.stream, 9)
    attempt = SlotReader(partition, shared_client(partition.reading.connection))
    run_sync(attempt.begin())
    batches = attempt.pull_record_batches()
    assert seqs(run_sync(anext(batches))) == [1, 2, 3]  # 4-6 recorded as they leave
    attempt.handing_out = True  # paused with its rows out: it renews its head no more

    retry = SlotReader(partition, shared_client(partition.reading.connection))
    run_sync(retry.begin())  # takes the entry over once its head stood still
    assert retry.entry.recorded_earlier.stream_seq == [1, 2, 3, 4, 5, 6]
    naked: list[Any] = []  # the server's advisory, sent as it queues the redelivery

    async def note(msg: Any) -> None:
        naked.append(msg)

    advisories = f"$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.{slot.stream}.{shared}"
    run_sync(client.target.nc.subscribe(advisories, cb=note))
    run_sync(client.target.nc.publish(attempt.keeper.held[2].decode(), NAK))
    wait_until(lambda: naked, 10, "the server's NAK of message 2")
    with pytest.raises(TakenOver) as lost:
        rest(batches)  # 4-6 out; 7-9 taken, and 2 again
    assert lost.value.holder == retry.entry.head.attempt
    assert 2 in attempt.keeper.again, "message 2 did not come to the attempt again"

    other = puller(client, slot.stream, shared, PRIORITY_GROUP)
    try:
        taken = [m.metadata.sequence.stream for m in other.fetch(10, expires=1.0).messages]
    finally:
        run_sync(other.target.close())
        close_shared_clients()
    assert taken == [7, 8, 9], f"the other client got {taken}: only 7-9 were given back"
