"""Driver: keeps the messages of finished batches from being redelivered while their acks wait
for the next batch.

A batch's acks go out from the tasks of the batch after it, which Spark starts once the batch
has ended and is committed; with a long batch or a trigger interval longer than the ack wait the
messages would come back to any reader of the consumer (another client of an overflow consumer,
a sibling slot) before they are acked. Every twelfth of the ack wait this keeper looks at the
entries not known to be acked and restarts the ack wait (`+WPI`) of the sealed ones whose wait
would have less than a third left at its next look (two thirds under a short ack wait, where a
look delayed by a busy machine matters more).

It keeps, per entry, the earliest its wait may have started, and reads an entry's head only once
that bound says it may be due: a batch acked by the next one within about half an ack wait is
never read here. The bound: an entry's wait started no earlier than a sixth of the ack wait
before its seal (`SlotReader.seal`), and its seal came after the last look it was missing from
or the last read that found it open; after a restart, or once another lineage is adopted, any
entry may be due. A sealed entry stays sealed until acked, so it is read again only when due,
and only then are its deliveries read. `+WPI` is not an ack, so it is safe before Spark
commits.

It keeps the entries an attempt released holding what it recorded (`awaits_taker`) the same
way, until an attempt takes them over: the releasing attempt restarted their wait as it let them
go, and nothing else keeps them while no attempt of their task runs. The full read of a batch
that a job of the user's read first starts only once that job has ended, which an early-stopped
task's sibling may hold up past the ack wait; another client of an overflow consumer then got
a message the batch committed (seeds 280 and 735 of the slow-ledger worlds with early stops and
a 4 s wait). A `+WPI` that comes after a taker took one over only keeps it longer.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from nats_spark import clock
from nats_spark.client import NatsClient
from nats_spark.jetstream.acks import (
    IN_PROGRESS,
    RESTART_AFTER,
    SHORT_ACK_WAIT,
    InProgressKeeper,
)
from nats_spark.spark.group_source import ledger_protocol as protocol
from nats_spark.spark.group_source.driver.driver_ledger import DriverEntry, DriverLedger
from nats_spark.spark.group_source.ledger import EntryHead, read_all_deliveries, read_heads

_LOOKS = 12  # looks per ack wait
_LEFT = 1 / 3  # of the ack wait, what an entry's wait keeps at least at every look
_LEFT_SHORT = 2 / 3  # the same under a short ack wait


class SealedKeeper(InProgressKeeper):
    def __init__(
        self, client_of: Callable[[], NatsClient], driver_ledger: DriverLedger, ack_wait: float
    ) -> None:
        super().__init__(client_of().nc, ack_wait, "sealed batches")
        self.client_of = client_of
        self.driver_ledger = driver_ledger
        self.shorten(ack_wait)
        self.lineage: str | None = None  # whose entries `started` is about
        self.looked = -math.inf  # when the previous look was (none yet: any entry may be due)
        # Entries not known acked at the last look: the earliest their ack wait may have started.
        self.started: dict[tuple[int, str], float] = {}
        # What the round in progress restarts: how much earlier than the round its wait may
        # start once the round is confirmed (a released entry's taker may seal it after the
        # head was read, with waits up to a sixth of the ack wait older: `SlotReader.seal`).
        self.restarting: dict[tuple[int, str], float] = {}

    def shorten(self, ack_wait: float) -> None:
        """Keep entries under `ack_wait` from the next round on (a consumer with a shorter one
        came into view)."""
        self.wait = ack_wait
        self.left = ack_wait * (_LEFT_SHORT if ack_wait < SHORT_ACK_WAIT else _LEFT)
        # `InProgressKeeper` runs a round every third of the wait it is given.
        self.ack_wait = ack_wait * 3 / _LOOKS

    async def due(self) -> tuple[list[bytes], int]:
        ledger = self.driver_ledger.ledger
        if ledger is None:
            return [], 0
        if ledger.lineage != self.lineage:  # its entries are new to this keeper
            self.lineage, self.looked, self.started = ledger.lineage, -math.inf, {}
        self.nc = self.client_of().nc  # the driver may have replaced its connection
        now = clock.monotonic()
        sealed_after = self.looked - self.wait * RESTART_AFTER  # an entry missing then
        started: dict[tuple[int, str], float] = {}
        due: list[tuple[tuple[int, str], DriverEntry]] = []
        for key, entry in list(self.driver_ledger.entries.items()):
            if protocol.known_acked(entry.head):
                continue
            started[key] = since = self.started.get(key, sealed_after)
            if self._due(since, now):
                due.append((key, entry))
        # The heads of all due entries at once, then the deliveries of those to restart at once:
        # a round of many slots or big entries must still end well within the wait it keeps.
        found = await read_heads(ledger, [key for key, _ in due])
        self.restarting, kept = {}, list[EntryHead]()
        for (key, entry), head_found in zip(due, found, strict=True):
            head = None if head_found is None else head_found[0]
            if head is not None and protocol.awaits_taker(head):
                self.restarting[key] = self.wait * RESTART_AFTER
                kept.append(head)
            elif head is None or not protocol.content_fixed(head):
                started[key] = now - self.wait * RESTART_AFTER  # it seals later, if ever
            elif protocol.known_acked(head):
                del started[key]
                self.driver_ledger.loaded(entry, head)  # nor is it read again, here or by planning
            elif not protocol.awaits_acks(head):
                started[key] = math.inf  # sealed empty: nothing to keep
            else:
                self.restarting[key] = 0.0
                kept.append(head)
        commands, count = list[bytes](), 0
        for deliveries in await read_all_deliveries(ledger, kept):
            commands += deliveries.ack_commands(IN_PROGRESS)
            count += len(deliveries)
        self.started, self.looked = started, now
        return commands, count

    def _due(self, started: float, now: float) -> bool:
        """Whether the wait of an entry that started no earlier than `started` would have less
        than `left` at the next look."""
        return started + self.wait - (now + self.wait / _LOOKS) < self.left

    async def renew(self) -> None:
        confirmed = self.renewed
        await super().renew()
        if self.renewed != confirmed:  # the round went out and the server has it
            for key, earlier in self.restarting.items():
                if key in self.started:
                    self.started[key] = self.renewed - earlier
