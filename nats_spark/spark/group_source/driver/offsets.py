"""The source's offset: which batch generation of which query lineage, and what it planned.

Offsets are not positions: a pull consumer has none that a client can seek to. An offset names a
batch (`lineage`, `gen`); what that batch took from NATS is recorded in the ack ledger under the
same names, which is what makes a re-run of a logged batch replay exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nats_spark.errors import foreign_checkpoint

# 2: a packed batch whose slots' heads are kept together, a key per task (`packed_heads`); a
# release that knows only 1 refuses it rather than run it again with a key per head.
OFFSET_VERSIONS = (1, 2)


@dataclass(frozen=True)
class SlotPlan:
    """What one slot of a batch may take: at most `limit` messages (`pending`: what its consumer
    showed undelivered when the batch was planned, for progress)."""

    limit: int
    pending: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "pending": self.pending}


@dataclass(frozen=True)
class SourceOffset:
    """A batch: its lineage and gen, and what each of its slots may take (stored under
    `members`, the name checkpoints have always had). `tasks`: how many input partitions the
    batch's slots are packed into (`slot_packing`), fixed here so that a re-run packs the same
    way; 0 (absent, as in every offset before packing): one input partition per slot.
    `packed_heads` (version 2): the heads of a task's slots are kept in one key of the task's
    (`slot_packing.layout`); a packed batch of version 1, logged before, keeps a key per head
    when it runs again."""

    lineage: str
    gen: int
    slots: dict[str, SlotPlan] = field(default_factory=dict)
    tasks: int = 0
    packed_heads: bool = False

    @classmethod
    def initial(cls, lineage: str) -> SourceOffset:
        return cls(lineage=lineage, gen=0)

    def to_json(self) -> dict[str, Any]:
        """The dict Spark stores (it serializes with sorted keys and compares the strings)."""
        return {
            "v": 2 if self.packed_heads else 1,
            "lineage": self.lineage,
            "gen": self.gen,
            "members": {name: plan.to_json() for name, plan in sorted(self.slots.items())},
            **({"tasks": self.tasks} if self.tasks else {}),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any] | str) -> SourceOffset:
        data = json.loads(value) if isinstance(value, str) else value
        if data.get("v") not in OFFSET_VERSIONS or "lineage" not in data:
            raise foreign_checkpoint(data, "this version of nats-pcg")
        slots = {
            name: SlotPlan(plan["limit"], plan.get("pending", 0))
            for name, plan in data.get("members", {}).items()
        }
        tasks = int(data.get("tasks", 0))
        return cls(data["lineage"], int(data["gen"]), slots, tasks, data["v"] == 2)
