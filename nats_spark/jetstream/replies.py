"""Typed views of the JetStream API's replies: the server's JSON names are read here and nowhere
else (its error codes are in `nats_spark.errors`, beside the API error).

`ConsumerInfo` and `StreamInfo` stay the dicts the server sent (callers that pass a config on
or print it keep doing so), with typed properties for what the connector reads.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

NANOS = 1_000_000_000


class ConsumerInfo(dict[str, Any]):
    """A `CONSUMER.INFO` (or `CONSUMER.CREATE`) reply."""

    @property
    def config(self) -> dict[str, Any]:
        return self.get("config") or {}

    @property
    def num_pending(self) -> int:
        """Messages the consumer has not delivered yet."""
        return int(self.get("num_pending", 0))

    @property
    def num_ack_pending(self) -> int:
        """Messages delivered and not acked yet."""
        return int(self.get("num_ack_pending", 0))

    @property
    def num_waiting(self) -> int:
        """Pull requests waiting on the consumer."""
        return int(self.get("num_waiting", 0))

    @property
    def ack_floor_seq(self) -> int:
        """The stream sequence up to which everything is acked: the consumer delivers nothing
        at or below it again. With nothing pending (each delivery acked, or none made yet) that
        is the last delivered, or the sequence before a new consumer's start, as nats-server
        2.15 reports it; 2.11 and 2.12 report 0 until the first ack (created to start at 31:
        floor 0, delivered 30), which read as is would take the consumer for one that goes
        back. With deliveries not acked yet, the start it was created at still bounds it
        (`opt_start_seq`: the server starts there, or at the stream's first sequence when later;
        seed 669 of the simulation's worlds on 2.11-2.12 whose operator follows a refusal's
        advice: the refused run's last attempt pulled from the consumer created where the
        refusal said, before the next run looked at it)."""
        floor = self.get("ack_floor") or {}
        stream_floor = max(int(floor.get("stream_seq", 0)), self.opt_start_seq - 1)
        if int(floor.get("consumer_seq", 0)) == self.delivered_consumer_seq:
            return max(stream_floor, self.delivered_seq)
        return stream_floor

    @property
    def opt_start_seq(self) -> int:
        """The stream sequence a consumer created `by_start_sequence` starts at (0: none)."""
        return int(self.config.get("opt_start_seq") or 0)

    @property
    def delivered_seq(self) -> int:
        """The stream sequence of the last message delivered."""
        return int((self.get("delivered") or {}).get("stream_seq", 0))

    @property
    def delivered_consumer_seq(self) -> int:
        """The consumer sequence of the last delivery."""
        return int((self.get("delivered") or {}).get("consumer_seq", 0))

    @property
    def last_active(self) -> str | None:
        """When the consumer last delivered a message (RFC 3339), if ever."""
        return (self.get("delivered") or {}).get("last_active")

    @property
    def ack_wait(self) -> float:
        """Seconds (the server's default is 30 s)."""
        return float(self.config.get("ack_wait", 30 * NANOS)) / NANOS

    @property
    def max_ack_pending(self) -> int:
        """-1: unlimited."""
        return int(self.config.get("max_ack_pending", -1))

    def pinned_id(self, group: str) -> str | None:
        """The pin id the server holds for priority group `group`, if any."""
        for state in self.get("priority_groups") or ():
            if state.get("group") == group:
                return state.get("pinned_client_id") or None
        return None


class StreamInfo(dict[str, Any]):
    """A `STREAM.INFO` (or `STREAM.CREATE`) reply."""

    @property
    def config(self) -> dict[str, Any]:
        return self.get("config") or {}

    @property
    def first_seq(self) -> int:
        return int((self.get("state") or {}).get("first_seq", 0))

    @property
    def last_seq(self) -> int:
        return int((self.get("state") or {}).get("last_seq", 0))

    @property
    def replicas(self) -> int:
        return int(self.config.get("num_replicas", 1))

    @property
    def allow_direct(self) -> bool:
        return bool(self.config.get("allow_direct"))

    @property
    def allow_atomic(self) -> bool:
        """Atomic batch publish (nats-server 2.12+)."""
        return bool(self.config.get("allow_atomic"))

    @property
    def max_age(self) -> float:
        """Seconds (0: messages never expire by age)."""
        return float(self.config.get("max_age", 0)) / NANOS

    @property
    def duplicate_window(self) -> float:
        """Seconds (0: the server's default applies)."""
        return float(self.config.get("duplicate_window", 0)) / NANOS


def created_later(created: str, seen: str) -> bool:
    """Whether a consumer's `created` (RFC 3339) is later than the one seen: it was deleted and
    created again since. Only later: the reply to a create that updated an existing consumer may
    name the update's time, which the consumer's info then does not (seen after a restart from
    an older store)."""
    if not created or not seen:
        return False
    return datetime.fromisoformat(created) > datetime.fromisoformat(seen)
