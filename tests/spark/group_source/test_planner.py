"""The driver's planner, pure: a case per planning rule (what each slot of a batch may take,
pins, thresholds, availableNow, limits, pacing, the batch's input partitions and their acks,
layouts and slots that come and go, lag)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nats_spark.spark.group_source.driver.offsets import SlotPlan
from nats_spark.spark.group_source.driver.planner import (
    ConsumerSeen,
    SlotState,
    SlotTask,
    advances,
    apply_limit,
    horizons,
    lag_report,
    plan_batch,
    plan_slot,
    plan_tasks,
    readers_by_consumer,
    siblings,
    slots_report,
    small_capacity,
    unacked_by_consumer,
)
from nats_spark.spark.group_source.driver.targets import Slot
from nats_spark.spark.group_source.ledger_protocol import Horizon
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.shared.pacing import TriggerPacing

pytestmark = pytest.mark.unit

OPTIONS = parse_options({"servers": "nats://127.0.0.1:1", "stream": "S", "group": "g"})
SLOT = Slot("partition-0", "S", "g-partition-0", "pcg", "pinned_client", "m1", True)


def state(slot: Slot = SLOT, **seen: object) -> SlotState:
    """`slot`'s state after a look at its consumer that showed `seen`."""
    return SlotState(slot, ConsumerSeen(**seen))  # type: ignore[arg-type]


def plan(rec: SlotState, options=OPTIONS) -> SlotPlan | None:
    return plan_slot(options, rec)[1]


def partition_slot(p: int, member: str, consumer: str | None = None) -> Slot:
    return Slot(
        f"partition-{p}", "S", consumer or f"g-partition-{p}", "pcg", "pinned_client", member, True
    )


def plain_slots(count: int, policy: str = "overflow") -> list[Slot]:
    """The `numPartitions` readers of one plain consumer."""
    return [
        Slot(f"c#{i}", "S", "c", "grp", policy, None, False, readers=count) for i in range(count)
    ]


def by_name(*states: SlotState) -> dict[str, SlotState]:
    return {r.name: r for r in states}


# What one slot may take


def test_takes_pending_and_others_redeliveries() -> None:
    rec = replace(state(pending=100, ack_pending=30), ours=10)
    assert plan_slot(OPTIONS, rec) == ("active", SlotPlan(limit=120, pending=100))  # 20: another's


def test_nothing_to_take_is_idle_unless_pinned() -> None:
    assert plan_slot(OPTIONS, state()) == ("idle", None)
    pinned = replace(state(pinned="p1"), own_pin="p1")
    assert plan_slot(OPTIONS, pinned) == ("pinned", None)


def test_own_pin_is_read_and_another_clients_pin_means_standby() -> None:
    ours = replace(state(pending=5, pinned="ours"), own_pin="ours")
    assert plan_slot(OPTIONS, ours) == ("pinned", SlotPlan(5, 5))
    theirs = replace(state(pending=5, pinned="theirs"), own_pin="ours")
    assert plan_slot(OPTIONS, theirs) == ("standby", None)
    assert plan_slot(OPTIONS, replace(theirs, own_pin=None))[0] == "standby"  # none of ours yet
    overflow = replace(theirs, slot=replace(SLOT, policy="overflow"))
    assert plan(overflow) is not None  # only pinned_client has pins to respect


@pytest.mark.parametrize(
    ("option", "pending", "ack_pending", "served"),
    [
        ({"min_pending": 50}, 49, 0, False),
        ({"min_pending": 50}, 50, 0, True),
        ({"min_ack_pending": 10}, 5, 9, False),
        ({"min_ack_pending": 10}, 5, 10, True),
        ({"min_pending": 50, "min_ack_pending": 10}, 5, 10, True),  # past either one
    ],
)
def test_overflow_thresholds(option: dict, pending: int, ack_pending: int, served: bool) -> None:
    options = replace(OPTIONS, **option)
    status, planned = plan_slot(options, state(pending=pending, ack_pending=ack_pending))
    assert (planned is not None) == served
    assert (status == "below threshold") != served


def test_available_now_ends_at_its_sequence_and_skips_redeliveries() -> None:
    done = replace(state(pending=3, delivered_seq=900), end_seq=900)
    assert plan_slot(OPTIONS, done) == ("done", None)
    going = replace(state(pending=3, ack_pending=7, delivered_seq=899), end_seq=900)
    assert plan(going) == SlotPlan(3, 3)  # the run's wait for the 7 ack-pending is over


def test_available_now_waits_for_what_others_hold_while_its_wait_lasts() -> None:
    """Ack-pending beyond `ours` (an earlier query's, a killed attempt's) is read while the
    run's wait for it lasts, also past the run's end sequence; then the slot is done."""
    held = replace(state(ack_pending=7, delivered_seq=900), end_seq=900, ours=2)
    assert plan(replace(held, others_due=12.0)) == SlotPlan(5, 0)
    assert plan_slot(OPTIONS, held) == ("done", None)
    assert plan_slot(OPTIONS, replace(held, ours=7, others_due=12.0)) == ("done", None)


def test_capacity_per_partition_cap_and_parallel_readers() -> None:
    assert plan(replace(state(pending=100, max_ack_pending=40), ours=10)) == SlotPlan(30, 100)
    assert plan(replace(state(pending=100, max_ack_pending=10), ours=10)) is None  # full
    # What the slot's task acks before it pulls (a committed batch's) is capacity again.
    full = replace(state(pending=100, max_ack_pending=40), ours=40)
    assert plan(replace(full, acked_first=40)) == SlotPlan(40, 100)
    assert plan(replace(full, acked_first=30)) == SlotPlan(30, 100)  # 10 not committed yet
    capped = replace(OPTIONS, max_messages_per_partition=25)
    assert plan(state(pending=100), capped) == SlotPlan(25, 100)
    assert plan(state(replace(SLOT, readers=2), pending=101)) == SlotPlan(51, 101)


def test_small_capacity_is_explained() -> None:
    warning = small_capacity(OPTIONS, state(max_ack_pending=1))
    assert warning is not None and "allows 1 unacked messages" in warning
    assert small_capacity(OPTIONS, state(max_ack_pending=-1)) is None
    assert small_capacity(OPTIONS, state(max_ack_pending=100_000)) is None
    plain = replace(SLOT, partitioned=False)  # a user's own consumer: its limits are its own
    assert small_capacity(OPTIONS, state(plain, max_ack_pending=1)) is None


# The batch: limits, pacing, slots not read


@pytest.mark.parametrize("budget", [1, 2, 7, 99, 100, 250])
def test_limit_shares_the_budget(budget: int) -> None:
    plans = {"a": SlotPlan(100), "b": SlotPlan(50), "c": SlotPlan(1)}
    shared = apply_limit(plans, budget)
    wanted = min(budget, 151)
    assert (
        wanted - len(plans) < sum(p.limit for p in shared.values()) <= wanted
    )  # shares round down
    assert all(0 < shared[name].limit <= plans[name].limit for name in shared)
    if budget >= len(plans):
        assert set(shared) == set(plans)  # every slot gets some
    else:
        assert list(shared) == sorted(plans)[:budget]  # in slot-name order
    assert apply_limit(plans, None) == plans


@pytest.mark.parametrize(
    ("max_rows", "per_trigger", "total"),
    [(None, None, 30), (12, None, 12), (None, 9, 9), (12, 9, 9), (6, 9, 6)],
)
def test_read_limit_is_the_lower_of_spark_and_the_option(
    max_rows: int | None, per_trigger: int | None, total: int
) -> None:
    options = replace(OPTIONS, max_messages_per_trigger=per_trigger)
    states = by_name(
        state(partition_slot(0, "m1"), pending=20), state(partition_slot(1, "m1"), pending=10)
    )
    planned = plan_batch(options, states, max_rows, None)
    assert sum(p.limit for p in planned.slots.values()) == total
    assert {n: r.planned for n, r in planned.states.items()} == {
        n: p.limit for n, p in planned.slots.items()
    }


def test_pacing_holds_the_batch_back_but_not_an_available_now_run() -> None:
    now = [0.0]
    pacing = TriggerPacing(100, 60.0, clock=lambda: now[0])
    states = by_name(state(pending=40))
    held = plan_batch(OPTIONS, states, None, pacing.holds_back)
    assert held.slots == {} and held.states[SLOT.name].planned == 0
    assert held.states[SLOT.name].status == "active"  # it has work; the batch waits for more
    now[0] = 60.0  # maxTriggerDelay passed: whatever is there goes
    assert plan_batch(OPTIONS, states, None, pacing.holds_back).slots == {
        SLOT.name: SlotPlan(40, 40)
    }
    now[0] = 0.0
    run = by_name(replace(state(pending=40), end_seq=1000))
    assert plan_batch(OPTIONS, run, None, None).slots == {SLOT.name: SlotPlan(40, 40)}


def test_slots_no_longer_read_are_not_planned_and_keep_their_status() -> None:
    gone = replace(
        state(partition_slot(1, "m2"), pending=50), readable=False, status="pinned", planned=7
    )
    planned = plan_batch(OPTIONS, by_name(state(pending=5), gone), None, None)
    assert set(planned.slots) == {SLOT.name}
    assert planned.states[gone.name] == replace(gone, planned=0)


def test_a_plan_that_changes_nothing_keeps_the_states_as_they_were() -> None:
    """Every trigger plans every slot: a state that stays the same is not copied."""
    states = by_name(state(pending=5), state(partition_slot(1, "m2")))
    first = plan_batch(OPTIONS, states, None, None)
    again = plan_batch(OPTIONS, first.states, None, None)
    assert all(again.states[name] is first.states[name] for name in states)
    idle = first.states["partition-1"]
    assert idle.revised(status=idle.status, planned=0) is idle
    assert idle.revised(planned=3) == replace(idle, planned=3)


def test_small_capacity_warning_comes_with_the_plan() -> None:
    planned = plan_batch(OPTIONS, by_name(state(pending=5, max_ack_pending=2)), None, None)
    assert planned.slots[SLOT.name] == SlotPlan(2, 5)
    assert "allows 2 unacked" in (planned.states[SLOT.name].warning or "")


def test_a_new_offset_only_for_messages_or_acks_waiting() -> None:
    assert advances({"a": SlotPlan(1)}, acks_waiting=False)
    assert advances({}, acks_waiting=True)  # an idle batch so that its tasks ack
    assert not advances({}, acks_waiting=False)  # the same offset: Spark plans no batch


# What this query holds, horizons


def test_unacked_of_a_consumer_counts_its_slots_and_unknown_ones() -> None:
    a, b = plain_slots(2)
    other = partition_slot(3, "m2")
    slots = {s.name: s for s in (a, b, other)}
    unacked = [(a.name, 4), (b.name, 5), (other.name, 100), ("since-restart", 7)]
    ours = unacked_by_consumer(slots, unacked)
    assert ours(a) == 16  # both readers', and the unknown one
    assert ours(other) == 107


def test_horizons_use_the_ack_floor_of_durable_consumers_only() -> None:
    elastic = replace(partition_slot(1, "m1", "m1"), name="m1", durable=False)
    states = [
        state(ack_floor=40),
        state(elastic, ack_floor=40),
        SlotState(partition_slot(2, "m2")),
    ]
    assert horizons(states, {"S": 7}) == {
        SLOT.name: Horizon(40, 7),
        "m1": Horizon(0, 7),  # a recreated consumer's floor says nothing of the old one's
        "partition-2": Horizon(0, 7),  # not looked at yet
    }


# The batch's input partitions


def test_an_idle_slot_with_acks_due_gets_an_ack_only_partition() -> None:
    plan = plan_tasks({"a": SlotPlan(10)}, {"a": (3,), "b": (2, 3)}, {}, known={"a", "b"})
    assert plan.tasks == [SlotTask("a", 10, (3,)), SlotTask("b", 0, (2, 3))]
    assert plan.driver_acks == [] and plan.emptied == []


def test_acks_of_a_slot_the_query_no_longer_has_go_from_the_driver() -> None:
    plan = plan_tasks({}, {"c#3": (4,)}, {}, known=set())
    assert plan.tasks == [] and plan.driver_acks == ["c#3"]


def test_a_slot_planned_before_a_layout_move_takes_only_what_it_recorded() -> None:
    planned = {"m1": SlotPlan(100), "m2": SlotPlan(100), "m3": SlotPlan(100)}
    moved = {"m1": 40, "m2": None, "m3": None}  # m2, m3: their tasks never ran
    plan = plan_tasks(planned, {"m3": (5,)}, moved, known=set(planned))
    assert plan.tasks == [SlotTask("m1", 40), SlotTask("m3", 0, (5,))]
    assert plan.emptied == ["m2", "m3"]


def test_siblings_are_the_other_slots_of_the_batch_on_the_same_consumer() -> None:
    a, b, c = plain_slots(3)
    states = by_name(*(SlotState(s) for s in (a, b, c, SLOT)))
    readers = readers_by_consumer(states, [a.name, b.name, SLOT.name])  # c is not planned
    assert siblings(readers, a) == (b.name,)
    assert siblings(readers_by_consumer(states, [a.name, SLOT.name]), SLOT) == ()


# Progress


def test_progress_names_the_owning_member_of_a_partition_slot() -> None:
    member_layout = replace(SLOT, name="m1", consumer="g-m1")
    states = [
        replace(state(pending=3, ack_pending=1), status="pinned", warning="small"),
        replace(state(member_layout, pending=2), status="active"),
        SlotState(partition_slot(9, "m9")),  # not looked at: not reported
    ]
    assert slots_report(states) == {
        "m1": {"pending": 2, "ackPending": 0, "status": "active"},
        "partition-0": {
            "pending": 3,
            "ackPending": 1,
            "status": "pinned",
            "member": "m1",
            "warning": "small",
        },
    }


def test_lag_counts_each_consumer_once() -> None:
    a, b = plain_slots(2)
    states = [
        replace(state(pending=100, ack_pending=30), ours=10, planned=40),
        replace(state(partition_slot(1, "m1"), pending=5)),
        replace(state(partition_slot(2, "m2"), ack_pending=3), ours=3),
        replace(state(a, pending=20, ack_pending=2), ours=2, planned=5),
        replace(state(b, pending=20, ack_pending=2), ours=2, planned=5),  # the same consumer
        replace(state(partition_slot(7, "m7"), pending=99), readable=False),  # not read now
    ]
    report = lag_report(states)
    assert report["byMember"] == {
        "c": {"pending": 20, "ackPending": 2, "behindLatest": 10},  # 20 - 5 - 5
        "m1": {"pending": 105, "ackPending": 30, "behindLatest": 85},  # 100 + 20 - 40, + 5
        "m2": {"pending": 0, "ackPending": 3, "behindLatest": 0},  # its own batch's
    }
    assert report["total"] == {"pending": 125, "ackPending": 35, "behindLatest": 95}
