"""A retry's take-over of an open ledger entry, on a real server: it keeps what the attempt before
it recorded from redelivery for the whole attempt, not only once it seals."""

from __future__ import annotations

import dataclasses

from spark_helpers import Slot, publish, seqs_of

from nats_spark.client import close_shared_clients
from nats_spark.spark.group_source.ledger import EntryState
from nats_spark.spark.group_source.task.slot_reader import read_slot


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
