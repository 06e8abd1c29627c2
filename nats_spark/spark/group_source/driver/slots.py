"""What a query reads, as the driver resolved it: its slots (one input partition each per batch),
and what the query holds on the server, to tell its own doing from another client's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.pcg.consumers import PRIORITY_GROUP


@dataclass(frozen=True)
class Slot:
    name: str
    stream: str
    consumer: str
    priority_group: str | None
    policy: str
    member: str | None
    partitioned: bool
    readers: int = 1  # slots pulling from the same consumer
    # False for consumers the source recreates (elastic members): a new consumer's ack floor
    # says nothing about messages the old one delivered.
    durable: bool = True


@dataclass(frozen=True)
class Held:
    """What this query holds on the server: the pin ids it (or the target's previous query) got,
    and by slot the messages its ledger records as taken and not yet acked. What a consumer
    shows beyond that is another client's doing."""

    pins: frozenset[str] = frozenset()
    unacked: Mapping[str, int] = field(default_factory=dict)

    def other_reader(self, slot: str, info: ConsumerInfo, reading: bool) -> str | None:
        """Why another client seems to read the consumer of `slot` (None when nothing shows
        one); `reading`: this query pulls from it itself, so waiting pulls may be its own."""
        pin = info.pinned_id(PRIORITY_GROUP)
        if pin and pin not in self.pins:
            return "pinned by another client"
        waiting = info.num_waiting
        if waiting and not reading:
            return f"{waiting} pull request(s) waiting"
        extra = info.num_ack_pending - self.unacked.get(slot, 0)
        if extra > 0:
            return f"{extra} message(s) ack-pending"
        return None
