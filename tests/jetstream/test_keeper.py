"""What a task's `InProgressKeeper` knows of its deliveries' ack waits, pure: a give-back NAKs
only a delivery whose wait surely runs (`surely_running` of its `since`), since nats-server's
`processNak` gives back whatever delivery of the stream sequence is pending."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from nats_spark.jetstream import acks
from nats_spark.jetstream.acks import NAK_WITHIN, InProgressKeeper, surely_running
from nats_spark.loop import run_sync

pytestmark = pytest.mark.unit

WAIT = 4.0


def keeper(monkeypatch: pytest.MonkeyPatch) -> InProgressKeeper:
    """A keeper whose rounds are confirmed at once (no connection)."""

    async def confirmed(nc: object, commands: list[bytes], count: int) -> int:
        return count

    monkeypatch.setattr(acks, "send_acks", confirmed)
    return InProgressKeeper(SimpleNamespace(), WAIT, "slot")  # type: ignore[arg-type]


def round_at(kept: InProgressKeeper, now: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acks.clock, "monotonic", lambda: now)
    run_sync(kept.renew())


def test_a_delivery_is_surely_kept_while_more_than_half_its_wait_is_left() -> None:
    assert surely_running(10.0, 10.0 + WAIT * NAK_WITHIN - 0.01, WAIT)
    assert not surely_running(10.0, 10.0 + WAIT * NAK_WITHIN, WAIT)
    assert not surely_running(-math.inf, 0.0, WAIT)  # unknown: never


def test_a_confirmed_round_restarts_only_the_waits_that_surely_ran(monkeypatch):
    kept = keeper(monkeypatch)
    kept.hold([1], [b"$JS.ACK.S.C.1.1.1.0.0"], since=10.0)
    kept.hold([2], [b"$JS.ACK.S.C.1.2.2.0.0"], since=12.5)
    kept.hold([3], [b"$JS.ACK.S.C.1.3.3.0.0"], since=-math.inf)  # taken over
    round_at(kept, 13.0, monkeypatch)  # 1 had used 3 s of its 4 s: it may be another's now
    assert kept.since == {1: 10.0, 2: 13.0, 3: -math.inf}
    kept.redelivered(1, b"$JS.ACK.S.C.2.1.4.0.0", since=13.2)  # delivered to it again
    assert kept.since[1] == 13.2
    round_at(kept, 14.0, monkeypatch)
    assert kept.since == {1: 14.0, 2: 14.0, 3: -math.inf}
    kept.release([2])
    assert set(kept.since) == {1, 3}


def test_a_round_confirmed_after_a_delivery_came_again_keeps_that_delivery_s_start(monkeypatch):
    """A round sent at 4.5 is confirmed at 27.2 (its process stalled meanwhile), after 1 came
    again at 27.1: the round restarted the wait of whatever delivery of 1 was pending then, not
    the one of 27.1, whose wait began later. Dated back to 4.5, a give-back skipped its NAK as
    maybe run out, and 1 waited out its wait behind a newer message of its key (seed 264 of the
    worlds of mutant cancelled-record-leaves-its-chunks)."""
    kept = keeper(monkeypatch)
    kept.hold([1, 2], [b"$JS.ACK.S.C.1.1.1.0.0", b"$JS.ACK.S.C.1.2.2.0.0"], since=3.2)
    run_sync(kept.due())  # the round of 4.5 names both
    kept.redelivered(1, b"$JS.ACK.S.C.2.1.7.0.0", since=27.1)
    kept.restarted(4.5)
    assert kept.since == {1: 27.1, 2: 4.5}
    assert surely_running(kept.since[1], 27.4, WAIT)
