"""What a schedule must keep (DESIGN section 3), checked as it runs and once it is quiet.

- no message in two committed batches of one checkpoint (a query started on a new checkpoint
  may emit again what an earlier one committed and never acked: Spark's outputs are per
  checkpoint);
- once quiet: every message of the stream in a committed batch, none left unacked, and no
  ledger entry of a lineage the pointer does not name (nothing would ever act on it again);
- no ack before a batch that emitted the message is committed (its rows are in the sink);
- a batch run again yields the same rows in the same order (per slot) as every earlier run
  whose rows could have reached the sink (all its tasks finished);
- per key (subject), committed rows follow stream order (README guarantee 4), except in its two
  cases (`lateness.py`): a task attempt died holding deliveries it had not recorded, or a
  give-back's driver died between removing entries and giving their deliveries back. Such a
  break is counted apart (`order_breaks`, by cause in `order_reasons`), any other fails.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from tests.simulation.jetstream import Consumer, Stream, deliveries_of
from tests.simulation.lateness import Attempts, GiveBacks

Rows = dict[str, list[int]]  # by slot: stream sequences, in the order emitted


@dataclass
class Observed:
    stream: Stream
    key_order: bool  # whether per-key order is promised (not for readers sharing a consumer)
    give_backs: GiveBacks  # the world's give-backs, watched
    sink: dict[int, Rows] = field(default_factory=dict)  # by batch id: what the sink holds
    runs: dict[int, Rows] = field(default_factory=dict)  # by batch id: its first full run
    in_sink: dict[int, int] = field(default_factory=dict)  # stream seq -> batch id
    earlier_sinks: list[dict[int, Rows]] = field(default_factory=list)  # of earlier checkpoints
    ever_in_sink: set[int] = field(default_factory=set)  # stream seqs, in any checkpoint's sink
    attempts: Attempts = field(default_factory=Attempts)
    problems: list[str] = field(default_factory=list)  # broken guarantees
    order_breaks: list[str] = field(default_factory=list)  # per-key order, the README's case
    order_reasons: Counter[str] = field(default_factory=Counter)  # by what explains them

    def problem(self, kind: str, detail: str) -> None:
        self.problems.append(f"{kind}: {detail}")

    def new_checkpoint(self) -> None:
        """The next query run starts on a new checkpoint: its batch ids and sink are its own."""
        self.earlier_sinks.append(self.sink)
        self.sink, self.runs, self.in_sink = {}, {}, {}

    def full_run(self, batch: int, rows: Rows) -> None:
        """Every task of a run of `batch` finished with `rows`: they could reach the sink."""
        rows = {slot: seqs for slot, seqs in rows.items() if seqs}
        first = self.runs.setdefault(batch, rows)
        if first != rows:
            self.problem("re-run differs", f"batch {batch} first emitted {first}, now {rows}")

    def sink_write(self, batch: int, rows: Rows) -> None:
        """The sink commits `batch` (once: an exactly-once sink skips a batch id it has)."""
        if batch in self.sink:
            return
        self.sink[batch] = rows
        for seqs in rows.values():
            for seq in seqs:
                if seq in self.in_sink:
                    self.problem(
                        "emitted twice", f"message {seq} in batches {self.in_sink[seq]} and {batch}"
                    )
                else:
                    self.in_sink[seq] = batch
                self.ever_in_sink.add(seq)

    def acked(self, consumer: str, seq: int) -> None:
        if seq not in self.ever_in_sink:
            self.problem("acked before commit", f"message {seq} of {consumer}")

    def check_quiet(self, consumers: list[Consumer]) -> None:
        missing = [m.seq for m in self.stream.messages if m.seq not in self.ever_in_sink]
        if missing:
            self.problem("not in any committed batch", f"messages {missing}")
        for consumer in consumers:
            unacked = sorted(consumer.pending)
            if unacked or consumer.num_pending():
                self.problem(
                    "left unacked",
                    f"{consumer.name}: ack pending {unacked}, "
                    f"{consumer.num_pending()} never delivered",
                )
        if self.key_order:
            self._check_key_order(consumers)

    def check_ledger_quiet(self, stored: Mapping[str, tuple[bytes, int]]) -> None:
        """`stored`: the ledger bucket's keys and values. An entry of a lineage that neither is
        the pointer's nor is named by it as replaced is never acked, given back or removed; a
        chunk whose entry is gone, never removed."""
        named = set[str]()
        for key, (value, _) in stored.items():
            if key.startswith("query."):
                pointer = json.loads(value)
                named |= {pointer["lineage"], *pointer.get("replaced", [])}
        heads = [key for key in stored if not key.startswith("query.") and key.count(".") == 2]
        left = sorted(key for key in heads if key.split(".")[0] not in named)
        if left:
            self.problem("ledger entries left behind", ", ".join(left))
        chunks = [key for key in stored if not key.startswith("query.") and key.count(".") > 2]
        orphans = sorted(key for key in chunks if key.rsplit(".", 2)[0] not in stored)
        if orphans:
            self.problem("ledger chunks left behind (their entry is gone)", ", ".join(orphans))

    def check_live_lineage(self, stored: Mapping[str, tuple[bytes, int]], committed: int) -> None:
        """Once the last run stopped with gen `committed` committed: no entry of the pointer's
        lineage is left OPEN (a committed batch has none, and no attempt of one will seal it: a
        restart counts its messages as the query's own for good, and never acks nor settles
        it), nor SEALED past `committed` (no batch will replay or ack it)."""
        pointers = [json.loads(value) for key, (value, _) in stored.items() if key[:6] == "query."]
        live = pointers[0]["lineage"] if pointers else None
        left = []
        for key, (value, _) in stored.items():
            lineage, _, rest = key.partition(".")
            if lineage != live or rest.count(".") != 1:
                continue
            state = json.loads(value)["state"]
            if state == "open" or (state == "sealed" and int(rest.split(".")[0]) > committed):
                left.append(f"{key} ({state})")
        if left:
            self.problem("ledger entries of the live lineage left behind", ", ".join(sorted(left)))

    def _check_key_order(self, consumers: list[Consumer]) -> None:
        for sink in [*self.earlier_sinks, self.sink]:
            self._check_key_order_in(sink, consumers)

    def _check_key_order_in(self, sink: dict[int, Rows], consumers: list[Consumer]) -> None:
        last: dict[str, int] = {}
        for batch in sorted(sink):
            for seqs in sink[batch].values():
                for seq in seqs:
                    key = self.stream.messages[seq - 1].subject
                    if last.get(key, 0) > seq:
                        self._order_break(seq, key, last[key], batch, consumers)
                    last[key] = max(last.get(key, 0), seq)

    def _order_break(
        self, seq: int, key: str, newer: int, batch: int, consumers: list[Consumer]
    ) -> None:
        detail = f"{key}: message {seq} after {newer} (batch {batch})"
        deliveries = deliveries_of(consumers, self.stream.messages[seq - 1])
        why = self.attempts.why_late(seq, deliveries) or self.give_backs.why_late(deliveries)
        if why is None:
            self.problem("key order", f"{detail}, neither of the README's first two cases")
            return
        self.order_breaks.append(f"key order: {detail}")
        self.order_reasons[why] += 1
