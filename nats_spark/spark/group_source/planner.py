"""The driver's planner: what each slot of the next batch may take, from what the server showed.

Pure: no I/O and no logging (the offset reader observes the consumers, logs and persists); unit
tests in tests/spark/group_source/test_planner.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats_spark.spark.group_source.offsets import MemberPlan
from nats_spark.spark.group_source.targets import Slot
from nats_spark.spark.shared.options import SourceOptions

LAG_FIELDS = ("pending", "ackPending", "behindLatest")


@dataclass
class SlotState:
    """What the last look at a slot's consumer showed, and what planning made of it (`status`,
    `warning`: for progress)."""

    pending: int = 0
    ack_pending: int = 0
    ack_floor: int = 0
    pinned: str | None = None
    delivered_seq: int = 0
    max_ack_pending: int = -1
    ack_wait: float = 30.0
    status: str = "idle"
    warning: str | None = None


def over_thresholds(options: SourceOptions, state: SlotState) -> bool:
    """Overflow pulls with thresholds are served only past one of them: below, a batch would
    only wait out its pull."""
    low_pending, low_acks = options.min_pending, options.min_ack_pending
    if not (low_pending or low_acks):
        return True
    return bool(
        (low_pending and state.pending >= low_pending)
        or (low_acks and state.ack_pending >= low_acks)
    )


def small_capacity(options: SourceOptions, slot: Slot, state: SlotState) -> str | None:
    """Why each batch takes at most a few messages from a group consumer the source adopted (a
    Go member created it with a smaller max_ack_pending than the source's), or None."""
    capacity = state.max_ack_pending
    if not slot.partitioned or capacity <= 0 or capacity >= options.max_ack_pending:
        return None
    return (
        f"consumer {slot.consumer} allows {capacity} unacked messages (max_ack_pending), so "
        f"each batch takes at most {capacity} from it; raise its max_ack_pending, or delete "
        "it so that the source creates it with maxAckPending"
    )


def plan_slot(
    options: SourceOptions,
    slot: Slot,
    state: SlotState,
    ours: int,
    own_pin: str | None,
    available_now_seq: int | None,
) -> MemberPlan | None:
    """What `slot` may take in the next batch (None: nothing), setting `state.status`.

    `ours`: messages of the slot's consumer this query's ledger holds unacked; what the consumer
    shows ack-pending beyond that is another client's, or redeliveries to come. `own_pin`: the
    pin id this query holds for the slot. `available_now_seq`: an availableNow run's end.
    """
    if slot.policy == "pinned_client" and state.pinned and state.pinned != own_pin:
        state.status = "standby"
        return None
    if not over_thresholds(options, state):
        state.status = "below threshold"
        return None
    others = max(state.ack_pending - ours, 0)
    if available_now_seq is not None:
        if state.delivered_seq >= available_now_seq:
            state.status = "done"
            return None
        others = 0  # redeliveries may come too late for this run
    work = state.pending + others
    capacity = state.max_ack_pending
    if capacity and capacity > 0:
        work = min(work, capacity - ours)
    if options.max_messages_per_partition:
        work = min(work, options.max_messages_per_partition)
    work = -(-work // slot.readers)  # parallel readers of one consumer share its backlog
    state.status = "pinned" if state.pinned else "active"
    if work <= 0:
        state.status = "idle" if state.pinned is None else state.status
        return None
    return MemberPlan(limit=work, pending=state.pending)


def apply_limit(plans: dict[str, MemberPlan], budget: int | None) -> dict[str, MemberPlan]:
    """Share a per-batch `budget` (maxMessagesPerTrigger) over the slots in proportion to what
    each may take, in slot-name order; each planned slot gets at least one while budget lasts."""
    if not budget or not plans:
        return plans
    total = sum(p.limit for p in plans.values())
    if total <= budget:
        return plans
    shares: dict[str, MemberPlan] = {}
    left = budget
    for i, (name, plan) in enumerate(sorted(plans.items())):
        rest = len(plans) - i
        share = max(1, min(plan.limit, plan.limit * budget // total, left - (rest - 1)))
        if left <= 0:
            break
        shares[name] = MemberPlan(limit=share, pending=plan.pending)
        left -= share
    return shares


@dataclass(frozen=True)
class ConsumerLag:
    """One consumer's numbers for the lag report; `planned`: what its slots may take in the
    batch planned last."""

    owner: str  # the member it belongs to (a plain consumer: its own name)
    state: SlotState
    ours: int
    planned: int


def lag_report(consumers: list[ConsumerLag]) -> dict[str, dict]:
    """By member and in total, each consumer counted once: `pending` (not delivered yet),
    `ackPending` (delivered, not acked) and `behindLatest` (neither acked nor taken by the
    batch planned last: what later batches still have to read)."""
    by_member: dict[str, dict[str, int]] = {}
    for c in consumers:
        others = max(c.state.ack_pending - c.ours, 0)
        into = by_member.setdefault(c.owner, dict.fromkeys(LAG_FIELDS, 0))
        into["pending"] += c.state.pending
        into["ackPending"] += c.state.ack_pending
        into["behindLatest"] += max(c.state.pending + others - c.planned, 0)
    total = {key: sum(lag[key] for lag in by_member.values()) for key in LAG_FIELDS}
    return {"total": total, "byMember": dict(sorted(by_member.items()))}
