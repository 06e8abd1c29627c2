"""The driver's planner, pure: what each slot of a batch may take, limits, lag."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nats_spark.spark.group_source.offsets import MemberPlan
from nats_spark.spark.group_source.planner import (
    ConsumerLag,
    SlotState,
    apply_limit,
    lag_report,
    plan_slot,
    small_capacity,
)
from nats_spark.spark.group_source.targets import Slot
from nats_spark.spark.shared.options import parse_options

pytestmark = pytest.mark.unit

OPTIONS = parse_options({"servers": "nats://127.0.0.1:1", "stream": "S", "group": "g"})
SLOT = Slot("partition-0", "S", "g-partition-0", "pcg", "pinned_client", "m1", True)


def plan(state: SlotState, slot: Slot = SLOT, ours: int = 0, **kw) -> MemberPlan | None:
    return plan_slot(
        kw.pop("options", OPTIONS), slot, state, ours, kw.pop("own_pin", None), kw.pop("end", None)
    )


def test_takes_pending_and_others_redeliveries() -> None:
    state = SlotState(pending=100, ack_pending=30)
    assert plan(state, ours=10) == MemberPlan(limit=120, pending=100)  # 20 are another's
    assert state.status == "active"


def test_nothing_to_take_is_idle_unless_pinned() -> None:
    idle = SlotState()
    assert plan(idle) is None and idle.status == "idle"
    pinned = SlotState(pinned="p1")
    assert plan(pinned, own_pin="p1") is None and pinned.status == "pinned"


def test_another_clients_pin_means_standby() -> None:
    state = SlotState(pending=5, pinned="theirs")
    assert plan(state, own_pin="ours") is None and state.status == "standby"
    plain = replace(SLOT, policy="overflow")
    assert plan(SlotState(pending=5, pinned="theirs"), plain) is not None  # no pins there


def test_overflow_thresholds() -> None:
    options = replace(OPTIONS, min_pending=50)
    below = SlotState(pending=49)
    assert plan(below, options=options) is None and below.status == "below threshold"
    assert plan(SlotState(pending=50), options=options) == MemberPlan(50, 50)


def test_available_now_ends_at_its_sequence_and_skips_redeliveries() -> None:
    done = SlotState(pending=3, delivered_seq=900)
    assert plan(done, end=900) is None and done.status == "done"
    assert plan(SlotState(pending=3, ack_pending=7, delivered_seq=899), end=900).limit == 3


def test_capacity_per_partition_cap_and_parallel_readers() -> None:
    assert plan(SlotState(pending=100, max_ack_pending=40), ours=10).limit == 30
    assert plan(SlotState(pending=100, max_ack_pending=10), ours=10) is None
    capped = replace(OPTIONS, max_messages_per_partition=25)
    assert plan(SlotState(pending=100), options=capped).limit == 25
    assert plan(SlotState(pending=101), replace(SLOT, readers=2)).limit == 51


def test_small_capacity_is_explained() -> None:
    warning = small_capacity(OPTIONS, SLOT, SlotState(max_ack_pending=1))
    assert warning is not None and "allows 1 unacked messages" in warning
    assert small_capacity(OPTIONS, SLOT, SlotState(max_ack_pending=-1)) is None
    assert small_capacity(OPTIONS, SLOT, SlotState(max_ack_pending=100_000)) is None
    plain = replace(SLOT, partitioned=False)  # a user's own consumer: its limits are its own
    assert small_capacity(OPTIONS, plain, SlotState(max_ack_pending=1)) is None


@pytest.mark.parametrize("budget", [1, 7, 99, 100, 250])
def test_limit_shares_the_budget(budget: int) -> None:
    plans = {"a": MemberPlan(100), "b": MemberPlan(50), "c": MemberPlan(1)}
    shared = apply_limit(plans, budget)
    assert sum(p.limit for p in shared.values()) <= min(budget, 151)
    assert all(shared[name].limit <= plans[name].limit for name in shared)
    if budget >= len(plans):
        assert set(shared) == set(plans)  # every slot gets some
    assert apply_limit(plans, None) == plans


def test_lag_counts_each_consumer_once() -> None:
    state = SlotState(pending=100, ack_pending=30)
    report = lag_report(
        [
            ConsumerLag("m1", state, ours=10, planned=40),
            ConsumerLag("m1", SlotState(pending=5), ours=0, planned=0),
            ConsumerLag("m2", SlotState(ack_pending=3), ours=3, planned=0),
        ]
    )
    assert report["byMember"] == {
        "m1": {"pending": 105, "ackPending": 30, "behindLatest": 85},  # 100 + 20 - 40, + 5
        "m2": {"pending": 0, "ackPending": 3, "behindLatest": 0},  # its own batch's
    }
    assert report["total"] == {"pending": 105, "ackPending": 33, "behindLatest": 85}
