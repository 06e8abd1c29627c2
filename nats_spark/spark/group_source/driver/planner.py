"""The driver's planner: the next batch from what the driver knows of each slot (`SlotState`).

Pure: no I/O and no logging. The batch coordinator observes (consumer infos, the ledger), calls
these functions, persists their result and logs what changed; unit tests in
tests/spark/group_source/test_planner.py hold every planning rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nats_spark.spark.group_source.driver.offsets import SlotPlan
from nats_spark.spark.group_source.driver.targets import Slot
from nats_spark.spark.group_source.ledger_protocol import Horizon
from nats_spark.spark.group_source.options import SourceOptions

LAG_FIELDS = ("pending", "ackPending", "behindLatest")


@dataclass(frozen=True)
class ConsumerSeen:
    """What the last look at a slot's consumer (its info) showed."""

    pending: int = 0
    ack_pending: int = 0
    ack_floor: int = 0
    pinned: str | None = None  # the pin id the slot's priority group serves
    delivered_seq: int = 0
    max_ack_pending: int = -1
    ack_wait: float = 30.0


@dataclass(frozen=True)
class SlotState:
    """One slot as the driver knows it: its consumer, what the server showed, what this query
    holds of it (pin, unacked messages), and what the batch planned last made of it."""

    slot: Slot
    seen: ConsumerSeen | None = None  # None until the slot's consumer is looked at
    own_pin: str | None = None  # the pin id this query holds for the slot (its ledger's)
    ours: int = 0  # messages of the slot's consumer this query's ledger holds unacked
    acked_first: int = 0  # of `ours`, what the slot's next task acks before it pulls (committed)
    readable: bool = True  # the target's last resolve gave it to read
    end_seq: int | None = None  # an availableNow run's end: the stream's last sequence then
    # an availableNow run: seconds left of its wait for what the consumer holds beyond `ours`
    # (an earlier query's or a killed attempt's deliveries come back within the ack wait)
    others_due: float = 0.0
    status: str = "idle"  # for progress: pinned, active, idle, standby, below threshold, done
    warning: str | None = None  # for progress: why its batches stay small
    planned: int = 0  # what the batch planned last may take from it
    capacity_logged: bool = False  # its `warning` was logged (once per query)

    @property
    def name(self) -> str:
        return self.slot.name

    def revised(self, **changes: Any) -> SlotState:
        """This state with `changes`; itself when they change nothing (each trigger revises
        every slot's state, and most of them stay as they were)."""
        for name, value in changes.items():
            if getattr(self, name) != value:
                return replace(self, **changes)
        return self


@dataclass(frozen=True)
class BatchPlan:
    """The planner's answer: every slot's state as planned, and what the next batch's slots may take
    (empty: no batch with messages)."""

    states: dict[str, SlotState]
    slots: dict[str, SlotPlan]


@dataclass(frozen=True)
class SlotTask:
    """One input partition of a batch: its slot takes at most `limit` messages (0: it only
    acks), first acking its entries of the committed batches `acks`."""

    slot: str
    limit: int
    acks: tuple[int, ...] = ()


@dataclass(frozen=True)
class TaskPlan:
    tasks: list[SlotTask]
    driver_acks: list[str]  # slots the query no longer has: the driver acks their entries
    emptied: list[str]  # planned slots no longer read whose tasks took nothing


def over_thresholds(options: SourceOptions, seen: ConsumerSeen) -> bool:
    """Overflow pulls with thresholds are served only past one of them: below, a batch would
    only wait out its pull."""
    low_pending, low_acks = options.min_pending, options.min_ack_pending
    if not (low_pending or low_acks):
        return True
    return bool(
        (low_pending and seen.pending >= low_pending) or (low_acks and seen.ack_pending >= low_acks)
    )


def small_capacity(options: SourceOptions, state: SlotState) -> str | None:
    """Why each batch takes at most a few messages from a group consumer the source adopted (a
    Go member created it with a smaller max_ack_pending than the source's), or None."""
    capacity, slot = (state.seen or ConsumerSeen()).max_ack_pending, state.slot
    if not slot.partitioned or capacity <= 0 or capacity >= options.max_ack_pending:
        return None
    return (
        f"consumer {slot.consumer} allows {capacity} unacked messages (max_ack_pending), so "
        f"each batch takes at most {capacity} from it; raise its max_ack_pending, or delete "
        "it so that the source creates it with maxAckPending"
    )


def plan_slot(options: SourceOptions, state: SlotState) -> tuple[str, SlotPlan | None]:
    """The slot's status and what it may take in the next batch (None: nothing). What its
    consumer shows ack-pending beyond `state.ours` is another client's, or redeliveries to
    come; of its capacity, what the slot's task acks before it pulls is free again."""
    slot, seen, ours = state.slot, state.seen or ConsumerSeen(), state.ours
    if slot.policy == "pinned_client" and seen.pinned and seen.pinned != state.own_pin:
        return "standby", None
    if not over_thresholds(options, seen):
        return "below threshold", None
    others = max(seen.ack_pending - ours, 0)
    if state.end_seq is not None:
        if state.others_due <= 0:
            others = 0  # redeliveries that come after the run's wait for them are the next's
        if seen.delivered_seq >= state.end_seq and not others:
            return "done", None
    work = seen.pending + others
    capacity = seen.max_ack_pending
    if capacity and capacity > 0:
        work = min(work, capacity - ours + state.acked_first)
    if options.max_messages_per_partition:
        work = min(work, options.max_messages_per_partition)
    work = -(-work // slot.readers)  # parallel readers of one consumer share its backlog
    status = "pinned" if seen.pinned else "active"
    if work <= 0:
        return "idle" if seen.pinned is None else status, None
    return status, SlotPlan(limit=work, pending=seen.pending)


def apply_limit(plans: dict[str, SlotPlan], budget: int | None) -> dict[str, SlotPlan]:
    """Share a per-batch `budget` (maxMessagesPerTrigger) over the slots in proportion to what
    each may take, in slot-name order; each planned slot gets at least one while budget lasts."""
    if not budget or not plans:
        return plans
    total = sum(p.limit for p in plans.values())
    if total <= budget:
        return plans
    shares: dict[str, SlotPlan] = {}
    left = budget
    for i, (name, plan) in enumerate(sorted(plans.items())):
        rest = len(plans) - i
        share = max(1, min(plan.limit, plan.limit * budget // total, left - (rest - 1)))
        if left <= 0:
            break
        shares[name] = SlotPlan(limit=share, pending=plan.pending)
        left -= share
    return shares


def plan_batch(
    options: SourceOptions,
    states: Mapping[str, SlotState],
    max_rows: int | None,
    holds_back: Callable[[int], bool] | None,
) -> BatchPlan:
    """What the readable slots may take in the next batch: each by its state, then held back
    while trigger pacing waits for more (`holds_back` of the total; None in an availableNow run,
    which must end), then shared out within the read limit (Spark's `max_rows` and the
    maxMessagesPerTrigger option, the lower). Records of slots not read keep their status."""
    statuses: dict[str, tuple[str, str | None]] = {}
    plans: dict[str, SlotPlan] = {}
    for name, state in states.items():
        if state.readable:
            status, plan = plan_slot(options, state)
            statuses[name] = status, small_capacity(options, state)
            if plan is not None:
                plans[name] = plan
    if holds_back is not None and holds_back(sum(p.limit for p in plans.values())):
        plans = {}
    budgets = [v for v in (max_rows, options.max_messages_per_trigger) if v]
    plans = apply_limit(plans, min(budgets, default=None))
    planned = {
        name: state.revised(
            status=statuses[name][0] if name in statuses else state.status,
            warning=statuses[name][1] if name in statuses else state.warning,
            planned=plans[name].limit if name in plans else 0,
        )
        for name, state in states.items()
    }
    return BatchPlan(planned, plans)


def advances(plans: Mapping[str, SlotPlan], acks_waiting: bool) -> bool:
    """Whether `latestOffset` answers a new offset: for a batch with messages to take, or for
    one whose tasks ack what finished batches left (`acks_waiting`): Spark calls `commit` and
    plans a next batch only once the offset changed, so the acks of an idle stream's last
    batch would wait forever."""
    return bool(plans) or acks_waiting


def unacked_by_consumer(
    slots: Mapping[str, Slot], unacked: Iterable[tuple[str, int]]
) -> Callable[[Slot], int]:
    """By slot: messages of its consumer that this query's ledger holds and that are not acked
    yet. `unacked` is (slot name, count) per entry; an entry of a slot not in `slots` counts as
    of every slot's consumer (a slot never resolved since a restart could be any of them).
    Summed once per trigger: per slot, it was a walk over every entry (at 256 slots, a fifth of
    an idle trigger's planning)."""
    by_consumer: Counter[str] = Counter()
    anywhere = 0
    for name, count in unacked:
        known = slots.get(name)
        if known is None:
            anywhere += count
        else:
            by_consumer[known.consumer] += count
    return lambda slot: by_consumer[slot.consumer] + anywhere


def horizons(states: Iterable[SlotState], first_seqs: Mapping[str, int]) -> dict[str, Horizon]:
    """By slot: how far its consumer (its ack floor, durable consumers only) and its stream
    (`first_seqs` by stream) have moved."""
    return {
        r.name: Horizon(
            r.seen.ack_floor if r.seen is not None and r.slot.durable else 0,
            first_seqs.get(r.slot.stream, 0),
        )
        for r in states
    }


def plan_tasks(
    planned: Mapping[str, SlotPlan],
    due: Mapping[str, tuple[int, ...]],
    moved: Mapping[str, int | None],
    known: Iterable[str],
) -> TaskPlan:
    """The input partitions of a batch that plans `planned`, whose committed batches left the
    acks `due` (by slot: gens of entries not acked yet). A slot with acks due and nothing
    planned gets an ack-only partition, so its acks never wait for new messages; one the query
    no longer has (not in `known`) is acked by the driver. `moved`: planned slots of a layout
    the query has since left, with the count their entry recorded (None: no entry): only that
    may come back (a re-run of a batch planned before a restart)."""
    tasks, emptied = [], []
    for name, plan in sorted(planned.items()):
        limit = plan.limit
        if name in moved:
            recorded = moved[name]
            if recorded is None:
                emptied.append(name)
                if name not in due:
                    continue
            limit = recorded or 0
        tasks.append(SlotTask(name, limit, due.get(name, ())))
    have = set(known)
    driver_acks = []
    for name in sorted(set(due) - set(planned)):
        if name in have:
            tasks.append(SlotTask(name, 0, due[name]))
        else:
            driver_acks.append(name)
    return TaskPlan(tasks, driver_acks, emptied)


def readers_by_consumer(
    states: Mapping[str, SlotState], planned: Iterable[str]
) -> dict[str, tuple[str, ...]]:
    """The slots of a batch (`planned`) by the consumer they pull from, in name order: worked
    out once a batch (per slot, planning grew with the square of the slots)."""
    readers: dict[str, list[str]] = {}
    for name in sorted(planned):
        if name in states:
            readers.setdefault(states[name].slot.consumer, []).append(name)
    return {consumer: tuple(names) for consumer, names in readers.items()}


def siblings(readers: Mapping[str, tuple[str, ...]], slot: Slot) -> tuple[str, ...]:
    """The other slots of a batch that pull from `slot`'s consumer (`readers_by_consumer`)."""
    return tuple(other for other in readers.get(slot.consumer, ()) if other != slot.name)


def slots_report(states: Iterable[SlotState]) -> dict[str, dict]:
    """By slot looked at: its consumer's numbers and status for progress, and the member that
    owns it where that is not the slot itself (a partition of the partition layout)."""
    report = {}
    for state in sorted(states, key=lambda r: r.name):
        if state.seen is None:
            continue
        member = state.slot.member
        report[state.name] = {
            "pending": state.seen.pending,
            "ackPending": state.seen.ack_pending,
            "status": state.status,
            **({"member": member} if member is not None and member != state.name else {}),
            **({"warning": state.warning} if state.warning else {}),
        }
    return report


def lag_report(states: Iterable[SlotState]) -> dict[str, dict]:
    """By member and in total over the readable slots, each consumer counted once: `pending`
    (not delivered yet), `ackPending` (delivered, not acked) and `behindLatest` (neither acked
    nor taken by the batch planned last: what later batches still have to read)."""
    consumers: dict[tuple[str, str], list[SlotState]] = {}
    for state in sorted(states, key=lambda r: r.name):
        if state.readable and state.seen is not None:
            consumers.setdefault((state.slot.stream, state.slot.consumer), []).append(state)
    by_member: dict[str, dict[str, int]] = {}
    for readers in consumers.values():
        first = readers[0]
        seen, planned = first.seen or ConsumerSeen(), sum(r.planned for r in readers)
        others = max(seen.ack_pending - first.ours, 0)
        into = by_member.setdefault(
            first.slot.member or first.slot.consumer, dict.fromkeys(LAG_FIELDS, 0)
        )
        into["pending"] += seen.pending
        into["ackPending"] += seen.ack_pending
        into["behindLatest"] += max(seen.pending + others - planned, 0)
    total = {key: sum(lag[key] for lag in by_member.values()) for key in LAG_FIELDS}
    return {"total": total, "byMember": dict(sorted(by_member.items()))}
