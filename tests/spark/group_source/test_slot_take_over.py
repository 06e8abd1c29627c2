"""A retry's take-over of an open ledger entry, on a real server: it keeps what the attempt before
it recorded from redelivery for the whole attempt, not only once it seals, and the attempt it
took the entry from gives none of that back; a retry whose entry a new checkpoint's give-back
removed gives back what came to it again."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any

import pytest
from spark_helpers import (
    Slot,
    publish,
    puller,
    rest,
    seqs,
    seqs_of,
    unkept,
    wait_until,
    waiting_pull_sent,
)

from nats_spark import clock
from nats_spark.client import close_shared_clients, shared_client
from nats_spark.jetstream.acks import NAK
from nats_spark.loop import event_loop, run_sync
from nats_spark.pcg.consumers import PRIORITY_GROUP
from nats_spark.spark.group_source import ledger_protocol
from nats_spark.spark.group_source.ledger import EntryState, LedgerConflict, TakenOver
from nats_spark.spark.group_source.task.slot_reader import SlotReader, read_slot, slot_batches


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


@pytest.mark.parametrize("stall", [0.0, 16.0], ids=["at-once", "past-half-its-wait"])
def test_a_retry_whose_entry_was_given_back_gives_back_what_came_to_it_again(
    client, settings, unique, stall
) -> None:
    """Closed hole 162 of the simulation (`give_back_came_again`), on a real server. The first
    attempt records 1-3 (keys k0-k2) of an overflow consumer with a 30 s ack wait and is closed
    before the seal; a retry takes the entry over and, having taken nothing itself, pulls and
    waits. Meanwhile a new checkpoint's driver gives the entry back (`ledger_protocol.give_back`:
    it removes the entry and NAKs 1-3), and the server delivers 1-3 again to the retry's waiting
    pull, which keeps them as come again. Its read ends, and its seal finds the entry removed,
    kept by no attempt: it NAKs 1-3 (`give_back_came_again`), and the next reader of the
    consumer gets them at once, before 4, published on k0 after 1. Without it they wait out their
    30 s ack wait, and the reader gets 4 alone, ahead of 1 (mutant came-again-kept-at-a-lost-seal).
    Not after a stall: a retry whose clock moved 16 s (more than half the wait) past the pull
    that took them again NAKs none, as their wait may have run out and the server delivered them
    to another reader since (`surely_running`); the reader then gets 4 alone.
    A retry is the attempt staged: only an attempt that has taken nothing itself sends a waiting
    pull, the one request a real server holds open for the give-back's redeliveries."""
    slot = Slot(client, settings, unique)
    shared = slot.overflow_consumer(ack_wait=30.0)
    batch = dataclasses.replace(
        slot.partition(1, limit=10), consumer=shared, ack_wait=30.0, pin_id=None
    )
    # a waiting pull of 3 ends once the 3 redeliveries came, not at its expiry
    reading = dataclasses.replace(batch.reading, fetch_batch_size=3, fetch_timeout=5.0)
    partition = dataclasses.replace(batch, reading=reading)
    publish(client, slot.stream, 3)
    other = puller(client, slot.stream, shared, PRIORITY_GROUP)
    real_clock = clock.use(time.monotonic)  # the one in use, put back at the end
    try:
        first = read_slot(partition)
        assert seqs(next(first)) == [1, 2, 3]
        first.close()  # recorded, then closed before the seal: the entry is released
        retry = SlotReader(partition, shared_client(partition.reading.connection))

        async def read() -> list[int]:
            async with contextlib.aclosing(slot_batches(retry)) as batches:
                return [seq async for batch in batches for seq in seqs(batch)]

        with waiting_pull_sent(client, slot.stream, shared) as waiting:
            retried = asyncio.run_coroutine_threadsafe(read(), event_loop())
            assert waiting.wait(30), "the retry sent no waiting pull"
            clock.use(lambda: time.monotonic() + stall)  # after the pull's sending
            keys = [(partition.gen, partition.slot)]
            given_back = ledger_protocol.give_back(client.target, slot.ledger, keys, unkept)
            assert run_sync(given_back) == 3
            with pytest.raises(LedgerConflict, match="removed"):
                retried.result(30)
        assert retry.keeper.again == {1, 2, 3}, "the give-back's NAKs did not reach the retry"
        publish(client, slot.stream, 1, start=37)  # 4, on k0 as 1
        taken = [m.metadata.sequence.stream for m in other.fetch(10, expires=1.0).messages]
    finally:
        clock.use(real_clock)
        run_sync(other.target.close())
        close_shared_clients()
    given_back_seqs = [] if stall else [1, 2, 3]
    assert taken == [*given_back_seqs, 4], f"the next reader got {taken}"
