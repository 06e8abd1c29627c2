"""Driver: keeps the messages of finished batches from being redelivered while their acks wait
for the next batch.

A batch's acks go out from the tasks of the batch after it, which Spark starts at the next
trigger. With a trigger interval longer than the ack wait the messages would come back to any
reader of the consumer (another client of an overflow consumer, a sibling slot) before they are
acked. Every sixth of the ack wait this keeper looks at the entries that are sealed and not acked
(their heads: O(slots)), and restarts the ack wait (`+WPI`) of those it found so at its previous
look too: within a third of the ack wait after the seal, which came at most a sixth after the
task's start or its last `+WPI` (`SlotReader.seal`). Only then does the driver read an entry's
deliveries: with a trigger shorter than a sixth of the ack wait it never does. `+WPI` is not an
ack, so it is safe before Spark commits.
"""

from __future__ import annotations

from collections.abc import Callable

from nats_spark.client import NatsClient
from nats_spark.jetstream.acks import InProgressKeeper
from nats_spark.spark.group_source.driver_ledger import DriverLedger
from nats_spark.spark.group_source.ledger import EntryState


class SealedKeeper(InProgressKeeper):
    def __init__(
        self, client_of: Callable[[], NatsClient], ledger: DriverLedger, ack_wait: float
    ) -> None:
        super().__init__(client_of().nc, ack_wait / 2, "sealed batches")  # a look per sixth
        self.client_of = client_of
        self.ledger = ledger
        self.sealed: set[tuple[int, str]] = set()  # entries sealed and not acked at the last look

    async def due(self) -> list[bytes]:
        ledger = self.ledger.ledger
        if ledger is None:
            return []
        self.nc = self.client_of().nc  # the driver may have replaced its connection
        sealed: set[tuple[int, str]] = set()
        subjects: list[bytes] = []
        for key, entry in list(self.ledger.entries.items()):
            if entry.head is not None and entry.head.state is EntryState.ACKED:
                continue
            found = await ledger.read_head(*key)
            if found is None or found[0].state is not EntryState.SEALED or not found[0].count:
                continue
            sealed.add(key)
            if key in self.sealed:
                subjects += (await ledger.read_recorded(found[0])).ack_subjects()
        self.sealed = sealed
        return subjects
