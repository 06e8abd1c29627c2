"""Kill sweep: the driver killed -9 at seeded points spread over every phase of a batch.

A streaming job reads an elastic group (keyed messages over hundreds of subjects, six partitions)
into another stream with the `nats` sink, whose message ids drop what a re-run batch publishes
again, while messages are published. Each round starts the job from its checkpoint and kills its
driver (the job's process group: the Python driver and its JVM) with kill -9 in a batch phase the
seed draws: planning (commit log of the batch before, until its offset), offset logged, acking
(its tasks ack the committed entries), claiming (ledger heads created, pulls recorded), sealing,
commit (every slot sealed, until Spark's commit log). The seed also draws which batch of the run
and how far into the phase: a fraction of how long that phase took in earlier batches. In some
rounds a Python worker of the executor is killed -9 first (Spark retries its task). The phases are
watched from outside: the checkpoint's `offsets` and `commits` dirs, the ledger heads as they are
written (`$KV.<bucket>.>`) and the acks (`$JS.ACK.>`).

A quarter of the rounds stop the job (SIGTERM to its process group, as a supervisor stops it: the
source's acks at stop run) at the drawn point instead of killing it.

After the rounds, publishing stops and a last run of the job goes on until the group is idle
(its work queue empty: every message committed and acked), then stops. The target
stream must then hold every published message once, the group's consumers nothing unacked, and
the rows of each key must follow stream order (inversions: rows stored after a later message of
their key). The report is one line of JSON. A failing sweep prints the seed and the command that
repeats its kill points, the ledger's heads and the consumers' delivered and ack floor, and keeps
its work dir (job log, checkpoint).

    .venv/bin/python chaos/sweep.py --rounds 8 [--seed N] [--keys 500] [--rate 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from chaos.run import (
    WORK_QUEUE,
    Job,
    Publisher,
    create_group,
    group_consumers,
    log,
    retried,
)
from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.jetstream.api import NANOS
from nats_spark.loop import Blocking, run_sync
from nats_spark.server import EmbeddedServer
from nats_spark.spark.group_source.ledger import key_token
from nats_spark.spark.group_source.options import SourceOptions

PHASES = ("planning", "offset logged", "acking", "claiming", "sealing", "commit")
TARGET = "SINK"
BUCKET = SourceOptions.ledger_bucket
# Each phase's usual time from an event that begins it to the job's next event, until the sweep
# has seen its own (medians measured on a busy 2-core machine)
USUAL_SECONDS = {
    "planning": 0.08,
    "offset logged": 0.18,
    "acking": 0.002,
    "claiming": 0.003,
    "sealing": 0.08,
    "commit": 1.0,
}
STOPS = 0.25  # of the rounds end with an orderly stop (its acks at stop) instead of kill -9
STOP_SECONDS = 60.0  # an orderly stop's time before kill -9
WORKER_KILL_WINDOW = 0.5  # seconds after the first claim of a batch: its tasks run
MAX_RESTARTS = 3  # a job that keeps failing by itself in a round ends the sweep


@dataclass(frozen=True)
class Logged:
    """A batch as its offset log entry names it: the source's lineage, gen and planned slots
    (their ledger key tokens)."""

    lineage: str
    gen: int
    slots: frozenset[str]


def batch_ids(folder: Path) -> list[int]:
    """The batch ids of a checkpoint log dir (Spark writes each file atomically by rename)."""
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def read_logged(path: Path) -> Logged:
    """Offset log file: a version line, the batch metadata, then one line per source."""
    offset = json.loads(path.read_text().splitlines()[2])
    slots = frozenset(key_token(name) for name, plan in offset["members"].items() if plan["limit"])
    return Logged(offset["lineage"], int(offset["gen"]), slots)


@dataclass
class Trigger:
    """Kill the process group `pid` `delay` seconds after the `nth` event of `phase` in
    `batch`: planning (the commit log entry of the batch before), offset logged (its offset log
    entry), acking (an ack published after it), claiming (a ledger head of its gen created),
    sealing (one sealed), commit (the last of its planned slots sealed). Fired from the thread
    that sees the event, so that phases of a few milliseconds can be hit."""

    phase: str
    batch: int
    fraction: float  # which event: `nth` is drawn from the count expected, once it is known
    delay: float
    pid: int
    stop: bool = False  # SIGTERM (an orderly stop) instead of SIGKILL
    nth: int = 0  # 0 until the batch's offset is read
    count: int = 0
    fired: float | None = None

    def fire(self) -> None:
        if self.fired is None:
            self.fired = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM if self.stop else signal.SIGKILL)


class Timeline:
    """The job's batches as seen from outside (times are time.monotonic()): the checkpoint's
    log dirs (polled), ledger head writes and acks (subscribed); kills at an armed `Trigger`."""

    def __init__(self, client: Blocking[NatsClient], checkpoint: Path) -> None:
        self.client = client
        self.checkpoint = checkpoint
        self.files: dict[tuple[str, int], float] = {}  # (log dir, batch): when first seen
        self.logged: dict[int, Logged] = {}
        # (lineage, gen): (time, slot token, state, count) of every head write, in order
        self.heads: dict[tuple[str, int], list[tuple[float, str, str, int]]] = {}
        self.acks: list[float] = []
        self.trigger: Trigger | None = None
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def start(self) -> None:
        async def on_head(msg: Any) -> None:
            tokens = msg.subject.split(".")[2:]
            if len(tokens) != 3 or tokens[0] == "query" or not msg.data:
                return  # a chunk, the pointer, or a delete marker
            head = json.loads(msg.data)
            with self.lock:
                entry = self.heads.setdefault((tokens[0], int(tokens[1])), [])
                entry.append((time.monotonic(), tokens[2], head["state"], head["count"]))
                self._head_written(tokens[0], int(tokens[1]), head)

        async def on_ack(msg: Any) -> None:
            if msg.data == b"+ACK":  # not +WPI, which only restarts the ack wait
                with self.lock:
                    self.acks.append(time.monotonic())
                    trigger = self.trigger
                    if trigger is not None:
                        self._event("acking", trigger.batch)

        nc = self.client.target.nc
        run_sync(nc.subscribe(f"$KV.{BUCKET}.>", cb=on_head))
        run_sync(nc.subscribe("$JS.ACK.>", cb=on_ack))
        self.thread.start()

    def arm(self, trigger: Trigger) -> None:
        with self.lock:
            self.trigger = trigger
            if trigger.phase in PHASES[:2]:
                trigger.nth = 1  # the batch's one log entry before, or its own
            elif ("offsets", trigger.batch) in self.files:
                self._resolve(trigger)

    def _count(self, trigger: Trigger) -> None:
        trigger.count += 1
        if trigger.count == trigger.nth:
            threading.Timer(trigger.delay, trigger.fire).start()

    def _resolve(self, trigger: Trigger) -> None:
        """Draw the trigger's `nth` event once its batch's offset is known."""
        offset = self.logged[trigger.batch]
        expected = 1
        if trigger.phase == "acking":  # what sealed entries of earlier gens hold
            latest: dict[tuple[int, str], tuple[str, int]] = {}
            for (lineage, gen), writes in self.heads.items():
                if lineage == offset.lineage and gen < offset.gen:
                    for _, slot, state, count in writes:
                        latest[gen, slot] = (state, count)
            expected = sum(c for state, c in latest.values() if state == "sealed")
        elif trigger.phase in ("claiming", "sealing"):
            expected = len(offset.slots)
        trigger.nth = 1 + int(trigger.fraction * max(expected, 1))

    def _head_written(self, lineage: str, gen: int, head: dict[str, Any]) -> None:
        trigger = self.trigger
        offset = None if trigger is None else self.logged.get(trigger.batch)
        if trigger is None or offset is None or (lineage, gen) != (offset.lineage, offset.gen):
            return
        if head["state"] == "open" and head["count"] == 0:
            self._event("claiming", trigger.batch)
        elif head["state"] == "sealed":
            self._event("sealing", trigger.batch)
            sealed = {slot for _, slot, state, _ in self.heads[lineage, gen] if state == "sealed"}
            if offset.slots <= sealed:
                self._event("commit", trigger.batch)

    def _event(self, phase: str, batch: int) -> None:
        """An event that begins `phase` of `batch` (under the lock)."""
        trigger = self.trigger
        if trigger is not None and trigger.nth and (trigger.phase, trigger.batch) == (phase, batch):
            self._count(trigger)

    def _poll(self) -> None:
        while not self.halt.wait(0.005):
            for name in ("offsets", "commits"):
                for batch in batch_ids(self.checkpoint / name):
                    if (name, batch) not in self.files:
                        self._file_seen(name, batch)

    def _file_seen(self, name: str, batch: int) -> None:
        logged = read_logged(self.checkpoint / name / str(batch)) if name == "offsets" else None
        with self.lock:
            self.files[name, batch] = time.monotonic()
            trigger = self.trigger
            if logged is not None:
                self.logged[batch] = logged
                if trigger is not None and trigger.batch == batch and not trigger.nth:
                    self._resolve(trigger)
            if name == "commits":
                self._event("planning", batch + 1)
            else:
                self._event("offset logged", batch)

    def events(self, since: float) -> list[tuple[float, str, int]]:
        """(time, phase it begins, batch) of every event since `since`, in order: a batch's
        phase at a moment is that of its last event before it."""
        with self.lock:
            found = [
                (t, "planning" if name == "commits" else "offset logged", b + (name == "commits"))
                for (name, b), t in self.files.items()
            ]
            batches = {(o.lineage, o.gen): b for b, o in self.logged.items()}
            for key, writes in self.heads.items():
                batch = batches.get(key)
                sealed: set[str] = set()
                for t, slot, state, _ in writes:
                    if batch is None or state == "acked":
                        continue  # an acked mark belongs to the batch whose task acks
                    sealed |= {slot} if state == "sealed" else set()
                    phase = "claiming" if state == "open" else "sealing"
                    if state == "sealed" and self.logged[batch].slots <= sealed:
                        phase = "commit"
                    found.append((t, phase, batch))
            found += [(t, "acking", -1) for t in self.acks]  # -1: the batch logged last
        found = [event for event in found if event[0] >= since]
        return sorted(found)

    def phase_at(self, moment: float, since: float) -> tuple[int, str]:
        """The batch the job was in at `moment` and the phase its last event before began."""
        batch, phase = -1, "starting"
        for t, event_phase, event_batch in self.events(since):
            if t > moment:
                break
            phase = event_phase
            batch = batch if event_batch < 0 else event_batch
        return batch, phase

    def first_claim(self, batch: int, since: float) -> float | None:
        """When a ledger head of `batch` was first written since `since`."""
        with self.lock:
            offset = self.logged.get(batch)
            writes = [] if offset is None else self.heads.get((offset.lineage, offset.gen), [])
            return next((t for t, _, state, _ in writes if state == "open" and t >= since), None)

    def close(self) -> None:
        self.halt.set()
        self.thread.join(5)


def phase_lengths(runs: list[list[tuple[float, str, int]]]) -> dict[str, float]:
    """By phase: the median time from an event that begins it to the job's next event (the
    events of each run, `Timeline.events`; acks count once per burst)."""
    lengths: dict[str, list[float]] = {}
    for events in runs:
        for (t, phase, _), (after, next_phase, _) in zip(events, events[1:], strict=False):
            if not (phase == next_phase == "acking"):
                lengths.setdefault(phase, []).append(after - t)
    return {phase: statistics.median(values) for phase, values in lengths.items()}


@dataclass(frozen=True)
class RoundPlan:
    """What the seed draws for one round (all of it first, so timing cannot shift the draws)."""

    phase: str
    ahead: int  # which batch of the run: 0 is the first it runs (a re-run if one is logged)
    nth: float  # which event of the phase in the batch (of those expected)
    fraction: float  # how long after it, of the usual time to the next event
    worker_kill: bool  # a Python worker killed -9 first, in the run's first batch
    worker_fraction: float
    worker_seed: int
    stop: bool  # the job is stopped (SIGTERM, as a supervisor stops it), not killed -9

    @classmethod
    def draw(cls, rng: random.Random) -> RoundPlan:
        phase = rng.choice(PHASES)
        # A re-run batch is planned and logged before the restart: only its later phases.
        ahead = rng.randint(1, 2) if phase in PHASES[:2] else rng.randint(0, 2)
        nth, fraction = rng.random(), rng.random()
        worker_kill = rng.random() < 0.5 and ahead > 0
        worker_fraction, worker_seed = rng.random(), rng.randrange(1 << 30)
        stop = rng.random() < STOPS
        return cls(phase, ahead, nth, fraction, worker_kill, worker_fraction, worker_seed, stop)


@dataclass
class Kill:
    round: int
    aimed: str
    batch: int
    nth: int  # the event of the aimed phase the kill followed (0: the batch went by first)
    delay: float
    hit: str  # the phase the job was in at the kill: that of its last event before
    hit_batch: int
    worker_killed: bool
    restarts: int  # times the job ended by itself in the round and was started again
    stopped: bool  # SIGTERM, an orderly stop, instead of kill -9


@dataclass(frozen=True)
class SweepPlan:
    seed: int
    rounds: int = 8
    keys: int = 500
    rate: int = 100  # messages published per second during the rounds
    per_trigger: int = 300  # maxMessagesPerTrigger
    round_timeout: float = 300.0  # seconds a round may wait for its kill point
    drain: float = 300.0  # seconds the final job may take to empty the group's work queue


@dataclass
class SweepOutcome:
    seed: int
    rounds: int
    kills: list[Kill]
    published: int
    rows: int
    lost: int
    duplicated: int
    unacked: int  # the group's consumers' ack pending at the end
    left: int  # messages the group's work queue still held at the end (never read or acked)
    inversions: int  # rows stored after a later message of their key
    unbatched: int  # rows the sink stored outside an atomic batch
    drain_seconds: float  # the final job's, from its start until the work queue was empty
    seconds: float
    phase_seconds: dict[str, float]  # median length of each phase over the rounds
    error: str | None = None  # why the rounds ended early (the job kept failing)
    diagnosis: list[str] = field(default_factory=list)  # on failure: ledger and consumers

    @property
    def failed(self) -> bool:
        found = self.lost or self.duplicated or self.unacked or self.left or self.inversions
        return bool(found or self.error)

    def report(self) -> dict[str, Any]:
        phases: dict[str, int] = {}
        for kill in self.kills:
            phases[kill.hit] = phases.get(kill.hit, 0) + 1
        summary = {k: v for k, v in asdict(self).items() if k not in ("kills", "diagnosis")}
        return {**summary, "phases_hit": phases, "kills": [asdict(k) for k in self.kills]}


def first_batch(checkpoint: Path) -> int:
    """The batch a job started on `checkpoint` runs first: the logged one not committed, if
    any, else the next."""
    logged, committed = batch_ids(checkpoint / "offsets"), batch_ids(checkpoint / "commits")
    if logged and (not committed or logged[-1] > committed[-1]):
        return logged[-1]
    return committed[-1] + 1 if committed else 0


class JobFailing(Exception):
    """The job keeps failing by itself: the sweep ends with what it found so far."""


class Rounds:
    """Runs the rounds of a sweep against one job, checkpoint and timeline."""

    def __init__(self, plan: SweepPlan, job: Job, timeline: Timeline) -> None:
        self.plan = plan
        self.job = job
        self.timeline = timeline
        self.runs: list[list[tuple[float, str, int]]] = []  # events of earlier rounds' runs
        self.restarts = 0  # in the current round

    def failure(self) -> str:
        """The job's last error line (its log's last line naming an exception)."""
        text = (self.job.folder / "job.log").read_text(errors="replace")
        errors = [line for line in text.splitlines() if "Exception" in line or "Error" in line]
        return errors[-1] if errors else "no error in the job log"

    def start_job(self, trigger: Trigger | None) -> Trigger | None:
        """Start the job (again) and arm a copy of `trigger` for its process group."""
        self.job.start()
        assert self.job.process is not None
        if trigger is None:
            return None
        armed = replace(trigger, pid=self.job.process.pid, nth=0, count=0, fired=None)
        self.timeline.arm(armed)
        return armed

    def run(self, number: int, rng: random.Random) -> Kill:
        drawn = RoundPlan.draw(rng)
        lengths = phase_lengths(self.runs)
        first = first_batch(self.job.checkpoint)
        since = time.monotonic()
        deadline = since + self.plan.round_timeout
        delay = drawn.fraction * lengths.get(drawn.phase, USUAL_SECONDS[drawn.phase])
        trigger = self.start_job(
            Trigger(drawn.phase, first + drawn.ahead, drawn.nth, delay, 0, drawn.stop)
        )
        assert trigger is not None
        self.restarts = 0
        worker_killed, worker_due = False, drawn.worker_kill
        while trigger.fired is None and time.monotonic() < deadline:
            claimed = self.timeline.first_claim(first, since) if worker_due else None
            if claimed is not None:
                pause = drawn.worker_fraction * WORKER_KILL_WINDOW
                time.sleep(max(0.0, claimed + pause - time.monotonic()))
                worker_killed = self.job.kill_worker(random.Random(drawn.worker_seed))
                worker_due = False
            if ("commits", trigger.batch) in self.timeline.files and trigger.count < trigger.nth:
                trigger.nth = 0  # its batch went by without the event: kill now
                trigger.fire()
            time.sleep(0.02)
            if not self.job.running and trigger.fired is None:
                self.restarts += 1
                if self.restarts > MAX_RESTARTS:
                    raise JobFailing(f"the job failed {self.restarts} times: {self.failure()}")
                log("the job ended by itself: starting it again")
                trigger = self.start_job(trigger) or trigger
        if trigger.fired is None:
            log(f"round {number}: no kill point within {self.plan.round_timeout}s")
            trigger.fire()
        assert trigger.fired is not None
        if drawn.stop and self.job.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.job.process.wait(STOP_SECONDS)
        self.job.kill()
        time.sleep(0.2)  # head writes and acks in flight reach the timeline
        hit_batch, hit = self.timeline.phase_at(trigger.fired, since)
        self.runs.append([e for e in self.timeline.events(since) if e[0] <= trigger.fired])
        kill = Kill(
            number,
            drawn.phase,
            trigger.batch,
            trigger.nth,
            round(delay, 3),
            hit,
            hit_batch,
            worker_killed,
            self.restarts,
            drawn.stop,
        )
        log(f"round {number}: {json.dumps(asdict(kill))}")
        return kill


def create_target(client: Blocking[NatsClient]) -> None:
    """The sink's stream: atomic batches, and a duplicate window longer than any sweep."""
    config = {
        "name": TARGET,
        "subjects": [f"{TARGET}.>"],
        "duplicate_window": 3600 * NANOS,
        "allow_atomic": True,
    }
    run_sync(client.api.create_stream(config))


def stored(client: Blocking[NatsClient]) -> list[tuple[int, bool]]:
    """(payload number, stored in an atomic batch) of every message of the target, in order."""

    async def read() -> list[tuple[int, bool]]:
        total = (await client.target.api.stream_info(TARGET))["state"]["messages"]
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        reader = await client.target.js.pull_subscribe(f"{TARGET}.>", stream=TARGET, config=config)
        found: list[tuple[int, bool]] = []
        while len(found) < total:
            for msg in await reader.fetch(min(total - len(found), 1000), timeout=10):
                found.append((int(msg.data.decode()), "Nats-Batch-Id" in (msg.headers or {})))
        await reader.unsubscribe()
        return found

    return run_sync(read(), timeout=300)


def inversions(numbers: list[int], keys: int) -> int:
    """Rows stored after a higher number of their key (numbers grow in publish order per key)."""
    highest: dict[int, int] = {}
    count = 0
    for n in numbers:
        key = n % keys
        if n < highest.get(key, -1):
            count += 1
        highest[key] = max(highest.get(key, -1), n)
    return count


def consumer_states(client: Blocking[NatsClient]) -> dict[str, dict[str, int]]:
    states = {}
    for name in group_consumers(client):
        info = run_sync(client.api.consumer_info(WORK_QUEUE, name))
        states[name] = {
            "delivered": info["delivered"]["stream_seq"],
            "ack_floor": info["ack_floor"]["stream_seq"],
            "ack_pending": info["num_ack_pending"],
            "pending": info["num_pending"],
            "redelivered": info["num_redelivered"],
        }
    return states


def ledger_dump(client: Blocking[NatsClient]) -> list[str]:
    """Every key of the ledger bucket with its value (heads as JSON), listed from the stream's
    subject index (a KV key listing may come back short)."""
    stream, prefix = f"KV_{BUCKET}", f"$KV.{BUCKET}."
    subjects: dict[str, int] = {}
    while True:
        body = {"subjects_filter": f"{prefix}>", "offset": len(subjects)}
        info = run_sync(client.api.request(f"STREAM.INFO.{stream}", body))
        page = info.get("state", {}).get("subjects") or {}
        subjects.update(page)
        if not page or len(subjects) >= info.get("total", 0):
            break
    lines = []
    for subject in sorted(subjects):
        key = subject.removeprefix(prefix)
        if len(key.split(".")) != 3:
            continue  # a chunk of an entry
        answer = run_sync(client.api.request(f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject}))
        lines.append(f"{key} {base64.b64decode(answer['message'].get('data') or '').decode()}")
    return lines


def idle(client: Blocking[NatsClient], published: int) -> bool:
    """The group's work queue got every published message and holds none: each one read,
    committed and acked."""
    state = run_sync(client.api.stream_info(WORK_QUEUE))["state"]
    return state["messages"] == 0 and state["last_seq"] >= published


def sweep(plan: SweepPlan, folder: Path) -> SweepOutcome:
    rng = random.Random(plan.seed)
    began = time.monotonic()
    server = EmbeddedServer()
    server.start()
    client = open_blocking(ConnectionSettings(servers=(server.url,), name="sweep"))
    # The work queue's messages carry the header of their source, which the target refuses.
    output: tuple[str, ...]
    output = ("--format", "nats", "--sink-prefix", TARGET, "--sink-stream", TARGET)
    output += ("--option", "includeHeaders=false")
    job = Job(server.url, folder, per_trigger=plan.per_trigger, output_flags=output)
    timeline = Timeline(client, job.checkpoint)
    publisher = Publisher(client, plan.rate, plan.keys)
    log(f"sweep of {plan.rounds} rounds, seed {plan.seed}, work dir {folder}")
    kills: list[Kill] = []
    try:
        create_group(client, replicas=1)
        create_target(client)
        timeline.start()
        publisher.start()
        rounds = Rounds(plan, job, timeline)
        error = None
        try:
            for number in range(1, plan.rounds + 1):
                kills.append(rounds.run(number, rng))
        except JobFailing as failing:
            error = str(failing)
            log(error)
        publisher.halt.set()
        publisher.join(30)
        log(f"publishing stopped at {publisher.published}; a final job until the group is idle")
        drained = time.monotonic()
        job.start()
        while not idle(client, publisher.published) and time.monotonic() - drained < plan.drain:
            if not job.running:
                if error is not None:
                    break  # it fails as the rounds' did
                log("the final job ended by itself: starting it again")
                job.start()
            time.sleep(0.5)
        drained = time.monotonic() - drained
        job.stop()
        rows = stored(client)
        numbers = [n for n, _ in rows]
        states = retried(lambda: consumer_states(client))
        outcome = SweepOutcome(
            seed=plan.seed,
            rounds=plan.rounds,
            kills=kills,
            published=publisher.published,
            rows=len(rows),
            lost=len(set(range(publisher.published)) - set(numbers)),
            duplicated=len(numbers) - len(set(numbers)),
            unacked=sum(s["ack_pending"] for s in states.values()),
            left=run_sync(client.api.stream_info(WORK_QUEUE))["state"]["messages"],
            inversions=inversions(numbers, plan.keys),
            unbatched=sum(1 for _, batched in rows if not batched),
            drain_seconds=round(drained, 1),
            phase_seconds={k: round(v, 3) for k, v in phase_lengths(rounds.runs).items()},
            seconds=round(time.monotonic() - began, 1),
            error=error,
        )
        if outcome.failed:
            outcome.diagnosis = [
                *(f"consumer {name} {json.dumps(state)}" for name, state in states.items()),
                *(f"ledger {line}" for line in ledger_dump(client)),
            ]
        return outcome
    finally:
        publisher.halt.set()
        job.stop()
        timeline.close()
        run_sync(client.target.close())
        server.cleanup()


def reproduce(plan: SweepPlan) -> str:
    return (
        f".venv/bin/python chaos/sweep.py --seed {plan.seed} --rounds {plan.rounds} "
        f"--keys {plan.keys} --rate {plan.rate} --per-trigger {plan.per_trigger}"
    )


def main() -> int:
    # SIGTERM ends the run through its cleanup (job, server), like Ctrl-C
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="driver kills, one per job start")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--keys", type=int, default=500, help="distinct subjects (keys)")
    parser.add_argument("--rate", type=int, default=100, help="messages published per second")
    parser.add_argument("--per-trigger", type=int, default=300, help="maxMessagesPerTrigger")
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    args = parser.parse_args()
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    plan = SweepPlan(seed, args.rounds, args.keys, args.rate, args.per_trigger)
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="nats-spark-sweep-"))
    folder.mkdir(parents=True, exist_ok=True)
    outcome = sweep(plan, folder)
    print(json.dumps(outcome.report()))
    if outcome.failed:
        print(f"FAILED: seed {plan.seed}; repeat the kill points with: {reproduce(plan)}")
        print("\n".join(outcome.diagnosis))
        print(f"job log and checkpoint kept in {folder}")
        return 1
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
