"""What `bench/latency.py` notes during a case, and the figures it makes of them: latencies from
the stored timestamp, Spark's progress phases per batch and ours (driver calls, the server
requests seen during the batch, task times)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import percentile
from nats_spark.client import NatsClient

QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
PHASES = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")
OURS = (
    "latest_offset_ms",
    "partitions_ms",
    "driver_messages_sent",
    "tasks",
    "task_ms_p50",
    "task_ms_max",
    "task_ms_sum",
)


def ms(seconds: list[float]) -> dict[str, float | None]:
    """p50, p95, p99 and max of `seconds`, in milliseconds (None when there are none)."""
    if not seconds:
        return {name: None for name, _ in (*QUANTILES, ("max", 1))}
    figures = {name: round(percentile(seconds, q) * 1000, 1) for name, q in QUANTILES}
    return {**figures, "max": round(max(seconds) * 1000, 1)}


def p50_p95(values: list[float]) -> list[float | None]:
    if not values:
        return [None, None]
    return [round(percentile(values, 0.5), 1), round(percentile(values, 0.95), 1)]


@dataclass
class Handed:
    """One batch as `foreachBatch` saw it: when it was called, when the rows were in hand, and
    each row's stored timestamp (epoch seconds)."""

    called: float
    in_hand: float
    stored: list[float]


class InHand:
    """The `foreachBatch` function of a case: collects each batch's rows (as a user's function
    that needs them would) and notes when they were in hand, and each row's stored time: the
    connector's `timestamp` column, or the floor's `arrived` (`stored="arrived"`)."""

    def __init__(self, stored: str) -> None:
        self.stored = stored
        self.batches: dict[int, Handed] = {}
        self.rows = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        called = time.time()
        if self.stored == "arrived":
            rows = df.collect()
            stored = [row.arrived for row in rows]
        else:
            rows = df.selectExpr("*", "unix_micros(timestamp) AS stored_us").collect()
            stored = [row.stored_us / 1e6 for row in rows]
        self.batches[batch_id] = Handed(called, time.time(), stored)
        self.rows += len(rows)


def ledger_key_kind(key: str) -> str:
    """What a ledger key is: an entry's `head` (lineage.gen.slot), one of its `chunk`s
    (lineage.gen.slot.attempt.n), or `other` (a target's pointer, a driver's presence)."""
    tokens = key.split(".")
    if len(tokens) >= 3 and tokens[1].isdigit():
        return "head" if len(tokens) == 3 else "chunk"
    return "other"


class ServerRequests:
    """Every JetStream API request and ledger bucket write on the server while started, with the
    time it was seen, by kind: `kv_read` (a get, info or listing of the ledger bucket),
    `kv_write` (a put, delete or purge of it), `pull` (a pull request of the case's stream) and
    `js_api` (the rest: stream and consumer infos, the group's configuration), and by what it
    asked (the API's verb and `ledger`, `stream` or the stream it named). A plain subscription
    sees them as the server does (no permissions here)."""

    def __init__(self, client: NatsClient, bucket: str, stream: str) -> None:
        self.client, self.bucket, self.stream = client, bucket, stream
        self.seen: list[tuple[float, str, str]] = []  # time, kind, what
        self._subs: list[Any] = []

    def _what(self, msg: Any) -> tuple[str, str]:
        if msg.subject.startswith("$KV."):
            operation = (msg.headers or {}).get("KV-Operation", "PUT")
            key = msg.subject.split(".", 2)[2]
            return "kv_write", f"{operation} ledger {ledger_key_kind(key)}"
        tokens = msg.subject.split(".")[2:]  # after $JS.API: the verb, then a stream's name
        at = 3 if tokens[1:2] and tokens[1] in ("MSG", "DURABLE", "LEADER", "PEER") else 2
        verb = ".".join(tokens[:at])
        names = {f"KV_{self.bucket}": "ledger", self.stream: "stream"}
        named = names.get(tokens[at], tokens[at]) if at < len(tokens) else ""
        if named == "ledger":
            purge = verb in ("STREAM.PURGE", "STREAM.MSG.DELETE")
            if verb == "STREAM.MSG.GET":
                wanted = json.loads(msg.data or b"{}").get("last_by_subj", "")
                return "kv_read", f"{verb} ledger {ledger_key_kind(wanted.split('.', 2)[-1])}"
            return ("kv_write" if purge else "kv_read"), f"{verb} ledger"
        return ("pull" if verb == "CONSUMER.MSG.NEXT" else "js_api"), f"{verb} {named}".strip()

    async def _note(self, msg: Any) -> None:
        self.seen.append((time.time(), *self._what(msg)))

    async def start(self) -> None:
        for subject in ("$JS.API.>", f"$KV.{self.bucket}.>"):
            sub = await self.client.nc.subscribe(subject, cb=self._note, pending_msgs_limit=-1)
            self._subs.append(sub)

    async def stop(self) -> None:
        await self.client.nc.flush()
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()

    def between(self, start: float, end: float) -> dict[str, int]:
        """The requests seen from `start` to `end`, by kind."""
        counts = {"kv_read": 0, "kv_write": 0, "pull": 0, "js_api": 0}
        for at, kind, _ in self.seen:
            if start <= at <= end:
                counts[kind] += 1
        return counts

    def per_window(self, windows: list[tuple[float, float]]) -> dict[str, float]:
        """The mean count per window of each request asked in `windows`."""
        counts: dict[str, int] = {}
        for at, _, what in self.seen:
            if any(start <= at <= end for start, end in windows):
                counts[what] = counts.get(what, 0) + 1
        return {what: round(n / len(windows), 1) for what, n in sorted(counts.items()) if windows}


@dataclass
class Probe:
    """The notes of `bench/latency_sources.py`'s timed reader, taken from its directory (and
    removed there, for the next case)."""

    driver: list[dict[str, Any]] = field(default_factory=list)
    tasks: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def take(cls, folder: Path) -> Probe:
        probe = cls()
        for path in sorted(folder.glob("*.jsonl")):
            notes = [json.loads(line) for line in path.read_text().splitlines() if line]
            (probe.driver if path.name.startswith("driver-") else probe.tasks).extend(notes)
            path.unlink()
        probe.driver.sort(key=lambda note: note["started"])
        return probe

    def planning(self) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
        """The `latestOffset` call that planned each gen, and the calls that planned nothing
        (the answer was the gen before: an idle poll)."""
        planned: dict[int, dict[str, Any]] = {}
        idle = []
        for note in self.driver:
            if note["call"] == "latestOffset":
                if note["gen"] in planned:
                    idle.append(note)
                else:
                    planned[note["gen"]] = note
        return planned, idle

    def calls(self, call: str) -> dict[int, dict[str, Any]]:
        return {note["gen"]: note for note in self.driver if note["call"] == call}

    def tasks_of(self, gen: int) -> list[dict[str, Any]]:
        return [task for task in self.tasks if task["gen"] == gen]


def _took(note: dict[str, Any] | None) -> float | None:
    return None if note is None else round((note["ended"] - note["started"]) * 1000, 1)


def progress_batches(query: Any) -> dict[int, dict[str, Any]]:
    """Spark's progress of each batch that read rows, by batch id, with its trigger's start and
    the time its commit was logged (epoch seconds; the commit log's write ends the batch's
    `triggerExecution`)."""
    batches = {}
    for progress in query.recentProgress:
        if not progress["numInputRows"]:
            continue
        started = datetime.fromisoformat(progress["timestamp"]).timestamp()
        durations = dict(progress["durationMs"])
        end = progress["sources"][0]["endOffset"]
        batches[progress["batchId"]] = {
            "started": started,
            "committed": started + durations.get("triggerExecution", 0) / 1000,
            "rows": progress["numInputRows"],
            "durations": durations,
            "end": json.loads(end) if isinstance(end, str) else end,
        }
    return batches


def batch_details(
    progress: dict[int, dict[str, Any]],
    handed: dict[int, Handed],
    probe: Probe | None,
    requests: ServerRequests | None,
) -> list[dict[str, Any]]:
    """One dict per batch: Spark's phases, when its rows were in hand and committed (ms from
    its trigger's start) and, for the connector, ours: the driver's planning and its messages
    to the server, its tasks, and the requests the server saw during the batch."""
    planned, _ = probe.planning() if probe else ({}, [])
    partitions = probe.calls("partitions") if probe else {}
    details = []
    for batch_id, batch in sorted(progress.items()):
        started, durations = batch["started"], batch["durations"]
        detail: dict[str, Any] = {
            "batch": batch_id,
            "started": started,
            "rows": batch["rows"],
            "trigger_ms": durations.get("triggerExecution"),
            "phases_ms": {phase: durations.get(phase, 0) for phase in PHASES},
        }
        if batch_id in handed:
            hand = handed[batch_id]
            detail["in_hand_ms"] = round((hand.in_hand - started) * 1000, 1)
            detail["collect_ms"] = round((hand.in_hand - hand.called) * 1000, 1)
        detail["committed_ms"] = round((batch["committed"] - started) * 1000, 1)
        gen = batch["end"].get("gen") if isinstance(batch["end"], dict) else None
        if probe is not None and gen is not None:
            tasks = probe.tasks_of(gen)
            took = [task["ended"] - task["started"] for task in tasks]
            plan, parts = planned.get(gen), partitions.get(gen)
            detail["ours"] = {
                "gen": gen,
                "latest_offset_ms": _took(plan),
                "partitions_ms": _took(parts),
                "driver_messages_sent": sum(n["sent"] for n in (plan, parts) if n is not None),
                "tasks": len(tasks),
                "task_ms_p50": round(percentile(took, 0.5) * 1000, 1) if took else None,
                "task_ms_max": round(max(took) * 1000, 1) if took else None,
                "task_ms_sum": round(sum(took) * 1000, 1),
            }
            if requests is not None:
                detail["ours"]["server_requests"] = requests.between(started, batch["committed"])
        details.append(detail)
    return details


def summarize_batches(details: list[dict[str, Any]]) -> dict[str, Any]:
    """p50 and p95 over the batches of each figure `batch_details` gives."""

    def column(get: Any) -> list[float]:
        return [value for d in details if (value := get(d)) is not None]

    figures: dict[str, Any] = {
        "batches": len(details),
        "rows_per_batch": p50_p95(column(lambda d: d["rows"])),
        "batch_ms": p50_p95(column(lambda d: d["trigger_ms"])),
        "in_hand_ms_from_trigger": p50_p95(column(lambda d: d.get("in_hand_ms"))),
        "collect_ms": p50_p95(column(lambda d: d.get("collect_ms"))),
        "spark_phases_ms": {
            phase: p50_p95(column(lambda d, p=phase: d["phases_ms"][p])) for phase in PHASES
        },
    }
    if any("ours" in d for d in details):
        ours = [d["ours"] for d in details if "ours" in d]
        figures["ours"] = {
            name: p50_p95([o[name] for o in ours if o[name] is not None]) for name in OURS
        }
        if "server_requests" in ours[0]:
            figures["ours"]["server_requests"] = {
                kind: p50_p95([o["server_requests"][kind] for o in ours])
                for kind in ours[0]["server_requests"]
            }
    return figures


def idle_polls(probe: Probe, start: float, end: float) -> dict[str, Any]:
    """The driver's `latestOffset` calls that planned nothing, between `start` and `end`."""
    _, idle = probe.planning()
    took = [n["ended"] - n["started"] for n in idle if start <= n["started"] <= end]
    return {"calls": len(took), "ms": p50_p95([t * 1000 for t in took])}
