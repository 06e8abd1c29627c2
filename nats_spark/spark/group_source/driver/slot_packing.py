"""Which slots of a batch one task reads (option `maxTasksPerBatch`).

A task per slot costs Spark about 35 ms per Python task and us a connection's requests per slot;
packing the slots into fewer tasks sets a batch's cost by its work and the cluster instead of the
group's size. A re-run of a batch must emit the same rows under the same input partition and
row numbers (the nats sink's ids are batch/partition/row), so the packing is a function of the
batch's offset alone: its slots, their planned limits and its `tasks` count, all in the offset log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nats_spark.spark.group_source.driver.offsets import SourceOffset
from nats_spark.spark.group_source.packed_heads import SECTIONS_PER_KEY
from nats_spark.spark.group_source.slot_partition import PackedSlots, SlotPartition


def pack(offset: SourceOffset) -> list[list[str]]:
    """The planned slots of `offset` in `offset.tasks` groups (fewer when it has fewer slots),
    balanced by planned limit: the largest first, each to the group with the least so far
    (ties: by name, then the lowest group). Each group lists its slots by name."""
    count = min(offset.tasks, len(offset.slots))
    groups: list[list[str]] = [[] for _ in range(count)]
    loads = [0] * count
    for name, plan in sorted(offset.slots.items(), key=lambda item: (-item[1].limit, item[0])):
        least = loads.index(min(loads))
        groups[least].append(name)
        loads[least] += plan.limit
    return [sorted(group) for group in groups]


def layout(offset: SourceOffset) -> dict[str, int] | None:
    """Where batch `offset`'s heads are kept: by planned slot, the index of the packed key
    that holds its head (`packed_heads`): a key per task, of `SECTIONS_PER_KEY` slots at most
    (a task of more has several, its slots in their order); None when every head has a key of
    its own (offset version 1). Fixed for version 2: a batch run again finds its heads."""
    if not offset.packed_heads:
        return None
    runs = [
        group[start : start + SECTIONS_PER_KEY]
        for group in pack(offset)
        for start in range(0, len(group), SECTIONS_PER_KEY)
    ]
    return {slot: index for index, run in enumerate(runs) for slot in run}


def packed(offset: SourceOffset, partitions: Iterable[SlotPartition]) -> list[PackedSlots]:
    """The tasks of batch `offset` from its slots' input `partitions`: the planned slots as
    `pack` says (a group whose slots all dropped out stays, empty, so that the groups after it
    keep their index), then ack-only slots (nothing planned, so no rows) spread over them."""
    by_name: Mapping[str, SlotPartition] = {p.slot: p for p in partitions}
    groups = [[by_name[name] for name in group if name in by_name] for group in pack(offset)]
    extra = sorted(name for name in by_name if name not in offset.slots)
    if not groups and extra:
        groups = [[] for _ in range(min(max(offset.tasks, 1), len(extra)))]
    for index, name in enumerate(extra):
        groups[index % len(groups)].append(by_name[name])
    return [PackedSlots(tuple(group)) for group in groups]
