"""What each consumer a query reads must stay for exactly once, checked on every consumer info the
driver gets: when the target resolves (before the first message is taken) and at each batch's
planning (an edit or a recreation while the query runs stops it before its next batch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nats_spark.errors import ConfigurationError, consumer_created_again
from nats_spark.jetstream.replies import ConsumerInfo, created_later


def check_config(stream: str, name: str, config: Mapping[str, Any]) -> None:
    """Refuse a consumer config under which messages could be lost: acks other than explicit
    (the source acks only committed batches), `max_deliver` (a message delivered that many times
    leaves the consumer, and the source has messages redelivered: what a failed or restarted
    batch took comes back, given-back messages are NAKed) and `headers_only` (no data)."""
    if config.get("ack_policy", "explicit") != "explicit":
        raise ConfigurationError(
            f"consumer {name!r} has ack policy {config.get('ack_policy')!r}; the source needs "
            "explicit acks to ack only committed batches: use a consumer with ack_policy "
            "explicit"
        )
    max_deliver = int(config.get("max_deliver") or -1)
    if max_deliver > 0:
        raise ConfigurationError(
            f"consumer {name!r} on stream {stream!r} has max_deliver={max_deliver}: a message "
            "delivered that many times leaves the consumer unread, and the source has messages "
            "redelivered (what a failed or restarted batch took), so messages would be lost; "
            f"set it to -1: nats consumer edit {stream} {name} --max-deliver=-1"
        )
    if config.get("headers_only"):
        raise ConfigurationError(
            f"consumer {name!r} on stream {stream!r} has headers_only: its messages come "
            "without their data, which the source would commit as empty; turn it off: "
            f"nats consumer edit {stream} {name} --no-headers-only"
        )


@dataclass(frozen=True)
class Sighting:
    created: str  # when the server created the consumer (RFC 3339): its identity
    ack_floor: int  # the stream sequence up to which it had everything acked
    delivered: int = 0  # the consumer sequence of its last delivery (0: not known)


class SeenConsumers:
    """The consumers a query reads as it last saw them, by (stream, name). A consumer created
    again since (deleted, then created by someone, or by a Go member healing itself) has the same
    name but delivers from its own start: what the old one delivered and the query committed
    comes again. Where the ledger's dedupe no longer holds those, they would be emitted twice.

    The sightings outlive the driver in the ledger's pointer (`stored`, `remember`), so a
    consumer created again while no query ran is told apart by the next run as well."""

    def __init__(self) -> None:
        self.sightings: dict[tuple[str, str], Sighting] = {}
        # As the query's previous driver last saw them, until this one has looked at them.
        self.remembered: dict[tuple[str, str], Sighting] = {}

    def remember(self, stored: Mapping[str, Mapping[str, Sequence[Any]]]) -> None:
        """Take the sightings a previous driver of the query `stored` (the pointer's)."""
        self.remembered = {
            (stream, name): Sighting(str(created), int(floor))
            for stream, names in stored.items()
            for name, (created, floor) in names.items()
        }

    def stored(self) -> dict[str, dict[str, list[Any]]]:
        """By stream and name: [created, ack floor] of each consumer, as the pointer keeps them
        (a remembered one not looked at yet as it was remembered: it is still to be checked)."""
        kept: dict[str, dict[str, list[Any]]] = {}
        for (stream, name), sighting in {**self.sightings, **self.remembered}.items():
            kept.setdefault(stream, {})[name] = [sighting.created, sighting.ack_floor]
        return kept

    def record(self, stream: str, name: str, info: ConsumerInfo, placed: bool = True) -> None:
        """A consumer the query found or (re)created itself: checked, and its identity kept.
        `placed`: the query created it where it chose (not one it found or took as it is), so
        a remembered sighting no longer applies."""
        check_config(stream, name, info.config)
        if placed:
            self.remembered.pop((stream, name), None)
        self.sightings[stream, name] = Sighting(
            info.get("created") or "", info.ack_floor_seq, info.delivered_consumer_seq
        )

    def look(self, stream: str, name: str, info: ConsumerInfo, recreation: str | None) -> None:
        """Check a consumer seen at planning and keep it; `recreation`: how to go on when it was
        created again since it was last seen (None: a new one is exact, take it)."""
        remembered = self.remembered.get((stream, name))
        before = self.last_seen(stream, name)
        created = info.get("created") or ""
        if recreation is not None and before is not None and created_later(created, before.created):
            when = "while the query was stopped" if remembered else "while the query ran"
            evidence = f"created {before.created}, now {created}"
            raise consumer_created_again(stream, name, when, evidence, recreation)
        self.record(stream, name, info)

    def next_after_acked(self, stream: str, name: str) -> int:
        """The stream sequence right after everything the consumer had acked when last seen: a
        new consumer starting there reads nothing the query committed and settled, and what
        the query took after it is in the ledger, which drops its redeliveries."""
        before = self.last_seen(stream, name)
        return (before.ack_floor if before else 0) + 1

    def last_seen(self, stream: str, name: str) -> Sighting | None:
        """As the previous driver remembered it until this one looked, else as this one saw it."""
        return self.remembered.get((stream, name)) or self.sightings.get((stream, name))
