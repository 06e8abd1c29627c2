"""Packing a batch's slots into fewer tasks (option maxTasksPerBatch): fixed by the offset alone,
so that a re-run packs as the first run did, and the offsets of a query without the option are
what they were before packing."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from nats_spark.errors import ConfigurationError
from nats_spark.spark.group_source.driver.offsets import SlotPlan, SourceOffset
from nats_spark.spark.group_source.driver.slot_packing import layout, pack, packed
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.group_source.packed_heads import SECTIONS_PER_KEY
from tests.spark.group_source.test_ledger_entries import input_partition

pytestmark = pytest.mark.unit


def offset(tasks: int, **limits: int) -> SourceOffset:
    return SourceOffset("L", 3, {name: SlotPlan(limit) for name, limit in limits.items()}, tasks)


def test_slots_are_packed_by_planned_limit_into_at_most_the_tasks_asked():
    batch = offset(2, a=10, b=40, c=30, d=20)
    assert pack(batch) == [["a", "b"], ["c", "d"]]  # 40+10 and 30+20
    assert pack(offset(8, a=1, b=2)) == [["b"], ["a"]]  # no more tasks than slots
    assert pack(offset(1, b=2, a=1, c=0)) == [["a", "b", "c"]]  # by name within a task
    assert pack(offset(3, a=5, b=5, c=5, d=5, e=5)) == [["a", "d"], ["b", "e"], ["c"]]


def test_a_rerun_packs_the_same_whatever_else_it_has():
    """The first run has an ack-only slot and every planned one; the re-run lost one planned
    slot (of a layout left since, it took nothing) and has no acks due: the tasks that have rows
    keep their index and their slots' order."""
    batch = offset(2, a=10, b=40, c=30, d=20)
    first = packed(batch, [input_partition("L", 3, s) for s in ("a", "b", "c", "d", "z")])
    again = packed(batch, [input_partition("L", 3, s) for s in ("b", "c", "d")])
    assert [[p.slot for p in task.slots] for task in first] == [["a", "b", "z"], ["c", "d"]]
    assert [[p.slot for p in task.slots] for task in again] == [["b"], ["c", "d"]]
    only_acks = packed(offset(2), [input_partition("L", 3, s, limit=0) for s in ("x", "y", "z")])
    assert [[p.slot for p in task.slots] for task in only_acks] == [["x", "z"], ["y"]]


def test_offsets_keep_their_form_without_packing():
    """Spark compares the offsets' JSON: a query without the option writes what it wrote before,
    and an offset of a checkpoint written before packing reads as a task per slot."""
    before = {"v": 1, "lineage": "L", "gen": 3, "members": {"a": {"limit": 5, "pending": 0}}}
    assert SourceOffset.from_json(before).to_json() == before
    assert SourceOffset.from_json(json.dumps(before)).tasks == 0
    with_tasks = offset(4, a=5)
    assert with_tasks.to_json()["tasks"] == 4
    assert SourceOffset.from_json(with_tasks.to_json()) == with_tasks


def test_max_tasks_per_batch_is_a_positive_count():
    base = {"servers": "nats://h:4222", "stream": "S", "group": "g"}
    assert parse_options(base).max_tasks_per_batch is None
    assert parse_options({**base, "maxTasksPerBatch": "8"}).max_tasks_per_batch == 8
    with pytest.raises(ConfigurationError, match="maxTasksPerBatch"):
        parse_options({**base, "maxTasksPerBatch": "0"})


def test_a_packed_batch_keeps_its_heads_in_a_key_per_task_of_128_at_most():
    """Offset version 2 (`packed_heads`): each planned slot's head is in its task's key, a task
    of more than `SECTIONS_PER_KEY` slots has several keys; the layout is the offset's alone
    (a re-run finds the heads the first run wrote), and an offset logged as version 1 keeps a
    key per head when it runs again."""
    limits = {f"s{i:03}": 1 for i in range(300)}
    batch = replace(offset(2, **limits), packed_heads=True)
    found = layout(batch)
    assert found is not None and set(found) == set(limits)
    groups = pack(batch)
    for group in groups:
        keys = {found[slot] for slot in group}
        assert len(keys) == -(-len(group) // SECTIONS_PER_KEY)  # its own keys, 128 at most each
        assert all(
            found[slot] == found[group[0]] + position // SECTIONS_PER_KEY
            for position, slot in enumerate(group)
        )
    assert sorted(Counter(found.values()).values()) == [22, 22, 128, 128]
    again = SourceOffset.from_json(json.loads(json.dumps(batch.to_json())))
    assert again.to_json()["v"] == 2 and layout(again) == found
    logged_before = SourceOffset.from_json({**batch.to_json(), "v": 1})
    assert logged_before.tasks == 2 and layout(logged_before) is None
    assert layout(offset(2, a=1, b=1)) is None  # planned without packed heads
