"""What the source's driver and tasks take from the process they run in, in one object their
entry points (`BatchCoordinator`, `SlotReader`) take: new ids (a query lineage, a driver, a task
attempt), the worker process's memory of entries' sequences (`SeenEntries`), and the give-back
of earlier queries' entries. The source runs on `PROCESS`, the process's own; the protocol
simulation (tests/simulation) passes a `Runtime` of each simulated world's: ids drawn from its
seed, a memory of its own, a give-back it watches."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from nats_spark.client import NatsClient
from nats_spark.spark.group_source import ledger_protocol
from nats_spark.spark.group_source.ledger import Ledger

_KEPT_ENTRIES = 4096  # entries' sequences a worker keeps between tasks

EntryKey = tuple[str, str, int, str]  # bucket, lineage, gen, slot
GiveBack = Callable[
    [
        NatsClient,
        Ledger,
        list[tuple[int, str]],
        Callable[[ledger_protocol.Marks], Awaitable[None]],
    ],
    Awaitable[int],
]


class SeenEntries:
    """The stream sequences of settled-or-sealed entries a process has read, by entry: sealed
    entries never change, so a worker's tasks read each once (`SlotHistory`)."""

    def __init__(self) -> None:
        self.entries: OrderedDict[EntryKey, tuple[int, ...]] = OrderedDict()

    def get(self, key: EntryKey) -> tuple[int, ...] | None:
        return self.entries.get(key)

    def put(self, key: EntryKey, seqs: tuple[int, ...]) -> None:
        self.entries[key] = seqs
        while len(self.entries) > _KEPT_ENTRIES:
            self.entries.popitem(last=False)


def _new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Runtime:
    new_id: Callable[[], str] = _new_id  # 32 hex digits, never the same twice
    seen_entries: SeenEntries = field(default_factory=SeenEntries)
    give_back: GiveBack = ledger_protocol.give_back


PROCESS = Runtime()  # the one of this process: its worker's tasks share its `seen_entries`
