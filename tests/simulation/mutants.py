"""Mutants: the holes the simulation found (or was built to find), put back one at a time, to show
that it still catches each of them on today's schedules.

    python -m tests.simulation.mutants [--seeds 0-1999] [--jobs 2] [--only NAME] [--first K]

A mutant is a few exact text patches of modules' source (production code under nats_spark, or
the simulated world where the hole was a fault of the world), applied by an import hook in a fresh
process before the module is compiled. Each old snippet must occur exactly once: a mutant whose
code has moved fails loudly instead of testing nothing. A mutant is caught when a seed of the
range breaks a guarantee (`Result.problems`); one no seed catches SURVIVED, and the run fails.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import math
import multiprocessing
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

from tests.simulation.scheduler import Chaos

BATCH_COORDINATOR = "nats_spark.spark.group_source.driver.batch_coordinator"
DRIVER_LEDGER = "nats_spark.spark.group_source.driver.driver_ledger"
SLOT_ENTRY = "nats_spark.spark.group_source.task.slot_entry"
LEDGER_PROTOCOL = "nats_spark.spark.group_source.ledger_protocol"
SEALED_KEEPER = "nats_spark.spark.group_source.driver.sealed_keeper"
PULL_POLICY = "nats_spark.spark.group_source.task.pull_policy"
CONSUMER_CHECKS = "nats_spark.spark.group_source.driver.consumer_checks"
SLOT_READER = "nats_spark.spark.group_source.task.slot_reader"
SLOT_PULLS = "nats_spark.spark.group_source.task.slot_pulls"
ACCEPTANCE = "nats_spark.spark.group_source.task.acceptance"
ACKS = "nats_spark.jetstream.acks"
REPLIES = "nats_spark.jetstream.replies"
SLOT_PARTITION = "nats_spark.spark.group_source.slot_partition"
WORLD = "tests.simulation.world"
SIM_JETSTREAM = "tests.simulation.jetstream"
# Worlds on Spark 4.2+'s call order and on 4.0/4.1's (`spark.V42`, `spark.V40`, spelled again
# here: importing spark would import the modules a mutant patches).
SPARK_42 = ("version", "4.2+")
SPARK_40 = ("version", "4.0/4.1")
# spark.speculation's wait in the worlds that turn it on (`Setup.speculation`): nearly every task
# attempt gets a copy beside it.
SPECULATION = 0.1
# The worlds whose executors pause for ack waits (`stalling_executors`): Spark loses an attempt
# that runs on once its batch settled or its query was given back (zombies' holes).
STALLING = (("stalling_executors", True),)
# The worlds where another client reads the query's overflow consumer (`other_client.py`): what
# comes back while the query should hold it goes to a reader no dedupe of the query's covers.
OTHER_CLIENT = (("other_client", True),)
# The worlds whose query is stopped mid-batch and replaced at once by one on a new checkpoint:
# its give-back meets the stopped run's attempts still recording.
REPLACED = (("replaced_mid_batch", True),)
# The worlds whose server restarts bring back ledger keys it had removed (lost tombstones).
RETURNING = (("removals_return", True),)
# The worlds where a job of the user's reads a batch's tasks first and Spark stops them after
# their first rows (`Setup.early_stops`): a packed task's slots are cancelled mid-step.
EARLY_STOPS = (("early_stops", True),)
# The worlds where another client reads the overflow consumer, a job reads a batch's tasks first
# (Spark's close of such a task releases its entry with what it recorded, and the full read
# takes it over at once), 30 messages pulled one at a time, no crashes, and the answers to the
# task attempts' ledger requests take up to 0.15 of the ack wait each (`Setup.slow_ledger`).
SLOW_TAKE_OVERS = (
    *OTHER_CLIENT,
    *EARLY_STOPS,
    ("messages", 30),
    ("per_batch", 50),
    ("fetch_batch", 1),
    ("slow_ledger", 0.15),
    ("chaos", Chaos()),
)
# `ConsumerInfo.ack_floor_seq`'s floor as reported, raised to a consumer's configured start.
FLOOR_BOUNDED_BY_THE_START = (
    '        stream_floor = max(int(floor.get("stream_seq", 0)), self.opt_start_seq - 1)\n'
)
# The pausing worlds where an attempt Spark lost is often killed once it runs on (its executor
# killed), between any two of its requests, and half the runs start on a new checkpoint (which
# gives the earlier lineage back): what such an attempt leaves of an entry it outlived.
DYING_ZOMBIES = (*STALLING, ("dying_zombies", 0.05), ("new_checkpoint", 0.5))
# Faults in place of a seed's draws where a driver often dies (3% of its scheduling points, four
# faults at most) and processes stall: batches run again after restarts, with what their first
# runs sealed.
CRASHING_DRIVERS = Chaos(driver_crash=0.03, task_crash=0.005, stall=0.01, crashes=4)
# Faults in place of a seed's draws where processes stall at 3% of their scheduling points.
STALLING_PROCESSES = Chaos(driver_crash=0.01, task_crash=0.005, stall=0.03, crashes=3)
# The worlds of seed 1347 of another client's pausing worlds, fixed: a 4 s wait, three messages
# in flight, two a batch and one a pull, restarts after a tenth of the rounds of acks, half the
# runs on a new checkpoint, and lost attempts that pause for up to 8 waits, in place of the
# drawn faults: a keeper round confirmed around a held delivery's lapse.
LAPSING_HELD_DELIVERIES = (
    *OTHER_CLIENT,
    *STALLING,
    ("ack_wait", 4.0),
    ("max_ack_pending", 3),
    ("per_batch", 2),
    ("fetch_batch", 1),
    ("restart_after_acks", 0.1),
    ("new_checkpoint", 0.5),
    ("chaos", Chaos(task_lost=0.03, lost_stall=8.0, crashes=2)),
)
# The draws of seed 270 of the replaced-mid-batch worlds, fixed: one message a pull under a 4 s
# wait, pauses, new checkpoints: a stopped query's attempts, their requests still out, take
# again what the new checkpoint's give-back NAKed, in several seeds of 0-500 on any schedule.
REDELIVERED_TO_STOPPED_QUERIES = (
    *REPLACED,
    SPARK_42,
    ("ack_wait", 4.0),
    ("messages", 29),
    ("max_ack_pending", 1000),
    ("per_batch", 5),
    ("fetch_batch", 1),
    ("chaos", Chaos(driver_crash=0.003, task_lost=0.005, stall=0.01, crashes=3)),
    ("lost_answer", 0.02),
    ("sink_failure", 0.2),
    ("trigger_interval", 10.0),
    ("new_checkpoint", 0.3),
)
# The worlds whose stopped query is replaced at once, with a 30 s wait, 30 messages, task attempts
# that crash at 3% of their points and stalls, under speculation (`Mutant.speculation`): a copy
# stands by an attempt of the stopped query until it crashes with what it recorded, and takes
# its entry over 5 s later, often after the new checkpoint's give-back raised its fence; the
# messages the entry holds then have most of their wait left, while newer ones of their keys
# come.
FENCED_TAKE_OVERS = (
    *REPLACED,
    ("ack_wait", 30.0),
    ("messages", 30),
    ("chaos", Chaos(task_crash=0.03, stall=0.01, crashes=4)),
)
# The worlds of a stopped query's attempts whose pull, refused for the pin the stopped driver's
# close removed, reaches the server up to 1.5 s late (`late_after_refusal`), under a 30 s wait
# (the stop comes up to 1.5 s into a batch), one message a pull, partitions (their pins), a
# backlog of up to 50 a batch, without stalls: the replacing run's give-back NAKs what such an
# attempt recorded while that pull is on its way, and the attempt, its read at its end, takes
# it again before its seal. In 2-3% of the seeds of 0-999 on any schedule.
REFUSED_PULLS_SENT_LATE = (
    *REPLACED,
    SPARK_42,
    ("shared", False),
    ("ack_wait", 30.0),
    ("messages", 60),
    ("max_ack_pending", 1000),
    ("per_batch", 50),
    ("fetch_batch", 1),
    ("chaos", Chaos(driver_crash=0.003, task_lost=0.005, crashes=3)),
    ("lost_answer", 0.02),
    ("sink_failure", 0.2),
    ("trigger_interval", 10.0),
    ("new_checkpoint", 0.3),
    ("late_after_refusal", 1.5),
)
# The worlds whose shared consumer is created again while drivers die often and processes stall
# at 3% of their points up to 39 s (a 30 s wait), with purges: a restarted driver's looks at the
# consumer fall on either side of its creation again, and a batch it runs again outlives it.
STARTED_OVER = (
    ("recreate_consumer", True),
    ("ack_wait", 30.0),
    ("purges", True),
    ("chaos", dataclasses.replace(CRASHING_DRIVERS, stall=0.03)),
)

# The draws of seeds 2212 and 5367 of the packed pausing worlds with another client, fixed
# (a 4 s wait, one message a pull up to 50 a batch, Spark 4.0/4.1), with 60 messages and no
# other client, and in place of the drawn faults attempts lost often (up to 12 times a
# schedule) that pause for up to 16 waits: a packed task's zombie wakes after its entries
# settled or were given back, its slots recording at once; the first whose head write fails
# ends the task, cancelling the others mid-record. 37 of seeds 0-999 catch
# `cancelled-record-leaves-its-chunks` (11 on the schedules of ledger format 3 with the seal).
ZOMBIES_WAKING_TO_REMOVED_ENTRIES = (
    *STALLING,
    ("shared", False),
    ("version", "4.0/4.1"),  # spark.V40 (importing spark would import the code patched)
    ("ack_wait", 4.0),
    ("messages", 60),
    ("max_ack_pending", 8),
    ("per_batch", 50),
    ("fetch_batch", 1),
    ("chaos", Chaos(task_lost=0.05, lost_stall=16.0, crashes=12)),
    ("lost_answer", 0.2),
    ("new_checkpoint", 0.3),
)

# The replaced-mid-batch worlds without siblings, an 8 s wait, two messages a batch in one pull
# each (two records an entry: one a chunk in ledger format 3, which keeps a first record in its
# head), a trigger a second, attempts on fresh executors (every dedupe reads the earlier
# entries anew) that the stop pauses up to a quarter of the wait, and no drawn faults (a stall
# past half the wait leaves what a failing attempt held to its wait, unmutated too): a stopped
# batch's attempt is often in its dedupe read, between an entry's head and its chunk, as the
# new checkpoint's give-back removes the entry. 41 of seeds 0-999 catch
# `failed-acceptance-chunk-kept` (27 on the schedules of ledger format 3 with the seal). Seed
# 445 (333, 557, 677, 947, 955 there) breaks per-key order unmutated, the checker's: the
# attempt whose entry the give-back took over held a delivery through its pause and failed on
# the missing chunk, not on its entry (`LedgerConflict`), so README case 1 was not recognised.
STOPPED_MID_DEDUPE = (
    *REPLACED,
    ("shared", False),
    ("ack_wait", 8.0),
    ("messages", 60),
    ("per_batch", 2),
    ("fetch_batch", 1),
    ("trigger_interval", 1.0),
    ("chaos", Chaos()),
    ("fresh_executors", True),
    ("paused_by_the_stop", 0.25),
)

# The replaced-mid-batch worlds with partitions, a 4 s wait, 60 messages published within 22 s
# (a backlog the stopped batch's attempts still record, one message a pull up to 50 a batch),
# no drawn faults, and three in ten compare-and-set answers lost, each coming up to 0.8 s late
# (`lost_answers_late`): the new checkpoint's give-back often reads and takes an entry between
# an attempt's write and its reading the head back after the lost answer. 35 of seeds 0-999
# catch `give-back-rewrites-the-head-as-is` (12 without the late answers; 34 on the schedules
# of ledger format 3 with the seal).
GIVE_BACKS_BETWEEN_LOST_ANSWERS = (
    *REPLACED,
    ("shared", False),
    ("ack_wait", 4.0),
    ("messages", 60),
    ("chaos_waits", 4.0),
    ("per_batch", 50),
    ("fetch_batch", 1),
    ("chaos", Chaos()),
    ("lost_answer", 0.3),
    ("lost_answers_late", 0.2),
)


# The worlds whose operator follows a refusal's advice, the shared consumer created again, with a
# server restart after every round of acks (up to 10: what a query acked, lost below it), half
# the runs on a new checkpoint (whose give-back marks what the earlier one acked) and purges:
# a batch's task takes marked messages from the consumer created again before it refuses it,
# and a purge takes what the advised consumer passed (seed 2550's mechanism). Seeds of 0-999
# catch `found-consumer-drops-acked-marks` (48), `marks-the-batch-holds-refused` (41) and
# `refusal-advises-past-the-batch` (12). 46 were refused again unmutated until helper-84
# (2026-12-01): an advice bounded by the first message the batch run again holds lay below marks
# of an earlier checkpoint's acks that nothing held (seed 8; `advice-delivers-marks-again`, 33),
# or a 4.0/4.1 availableNow run's first look refused the consumer created as advised knowing
# nothing of that batch (seed 42; `consumer-judged-before-the-checkpoint-is-told`, 9).
ADVICE_AFTER_LOST_ACKS = (
    ("recreate_consumer", True),
    ("follows_advice", True),
    ("shared", True),
    ("restart_after_acks", 1.0),
    ("server_restarts", 10),
    ("new_checkpoint", 0.5),
    ("purges", True),
)


@dataclass(frozen=True)
class Patch:
    module: str  # dotted name of the module whose source is patched
    old: str  # must occur exactly once in its source
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    hole: str  # the hole it reopens, and the commit that closed it
    patches: tuple[Patch, ...]
    shared: bool = False  # its hole needs siblings: every world has a shared consumer
    # an operator's edit, or a family of worlds, every world of its schedules has (Setup's
    # fields: max_deliver, recreate_consumer, stalling_executors, ...)
    edit: tuple[tuple[str, object], ...] = ()
    speculation: bool = False  # its hole needs spark.speculation: every world has it on
    packed: bool = False  # its hole needs packed slots: every world packs its slots in one task


# Acks lost below what a query acked (a restart after every round of acks, up to 10), new
# checkpoints at 70% of the runs, half the sink's writes failing, the consumer created again: a
# 30 s wait, 30 messages, a look every 10 s, no purges, a partition each (h63's world).
ACKS_LOST_UNDER_NEW_CHECKPOINTS: tuple[tuple[str, object], ...] = (
    ("recreate_consumer", True),
    ("shared", False),
    ("purges", False),
    ("messages", 30),
    ("ack_wait", 30.0),
    ("new_checkpoint", 0.7),
    ("sink_failure", 0.5),
    ("restart_after_acks", 1.0),
    ("server_restarts", 10),
    ("trigger_interval", 10.0),
)

MUTANTS = (
    Mutant(
        "overtaken-attempt-fails",
        "hole 5 of issue 45: an attempt whose entry another attempt took over while it was "
        "alive (Spark's speculative copy) failed at its next head write, a failure toward "
        "spark.task.maxFailures: a slow slot could be speculated until the query failed",
        (
            Patch(
                SLOT_READER,
                "        except TakenOver as taken:\n            if sealing",
                "        except NotImplementedError as taken:\n            if sealing",
            ),
        ),
        speculation=True,
    ),
    Mutant(
        "short-key-listing",
        "hole 1: the driver listed its lineage's entries with nats-py's kv.keys(), which can "
        "come back short or empty, and took the entries it missed as absent (closed by "
        "1ae9fc4; the fault left the simulation in 69791eb, which this puts back)",
        (
            Patch(
                WORLD,
                "    def keys_matching(self, pattern: str) -> Awaitable[list[str]]:\n"
                '        return self._call(f"kv keys {pattern}", '
                "lambda: self.store.keys_matching(pattern))\n",
                "    async def keys_matching(self, pattern: str) -> list[str]:\n"
                '        keys = await self._call(f"kv keys {pattern}", '
                "lambda: self.store.keys_matching(pattern))\n"
                "        rng = self.sched.rng\n"
                "        if self.sched.chaos.enabled and rng.random() < 0.3:\n"
                "            cut = rng.randint(0, len(keys))\n"
                '            self.sched.note(f"key listing cut short: {cut} of {len(keys)} keys")\n'
                "            keys = keys[:cut]\n"
                "        return keys\n",
            ),
        ),
    ),
    Mutant(
        "latest-seen-taken-as-committed",
        "hole 2: partitions(start == end), which Spark 4.0/4.1 call on a restart before the "
        "logged batch is re-run, took that batch as committed and acked it (closed by c98a464)",
        (
            Patch(
                BATCH_COORDINATOR,
                "                self.current = end  # the checkpoint's lineage: `initial_offset` "
                "answers in it\n            return []\n",
                "                self.current = end  # the checkpoint's lineage: `initial_offset` "
                "answers in it\n",
            ),
        ),
    ),
    Mutant(
        "initial-offset-new-lineage",
        "hole 3: initialOffset() made a new lineage once a batch was planned (4.0/4.1 ask it "
        "after their first latestOffset()), mixing two lineages in one checkpoint (closed by "
        "29da650, 9275453)",
        (
            Patch(
                BATCH_COORDINATOR,
                "        if self.current is not None and self.current.lineage == "
                "self.ledger.lineage:\n"
                "            # Nothing is committed in the checkpoint: the lineage's entries below "
                "its first\n"
                "            # batch are an earlier checkpoint's, which that batch gives back.\n"
                "            self.ledger.earlier_checkpoint_left = True\n"
                "            return SourceOffset(self.current.lineage, 0)\n",
                "        started = self.current\n"
                "        if started is not None and started.gen == 0 and "
                "self.ledger.head_gen == 0:\n            return started\n",
            ),
        ),
    ),
    Mutant(
        "new-checkpoint-takes-earlier-batch",
        "a new checkpoint on Spark 4.0/4.1 plans its first batch in the stored lineage, and took "
        "the earlier query's uncommitted gens before it as its own, deduped and acked them "
        "unemitted (closed by 70497ce, ed50a48)",
        (
            Patch(
                BATCH_COORDINATOR,
                "        if start.lineage == first.lineage and first.gen > 1:\n",
                "        if False:\n",
            ),
        ),
    ),
    Mutant(
        "replaced-lineage-forgotten",
        "a new checkpoint's driver that died before its first batch forgot the earlier query's "
        "lineage: the pointer named only its own (closed by f27bc8d)",
        (
            Patch(
                DRIVER_LEDGER,
                "            named = (pointer.lineage, *pointer.replaced)\n",
                "            named = (pointer.lineage,)\n",
            ),
        ),
    ),
    Mutant(
        "siblings-lateness-from-take",
        "siblings: a task counted the age of what it took from the take, not from the pull "
        "request, so a process paused between the server's send and the take took a message "
        "as fresh while a sibling took its redelivery (closed by d561684)",
        (
            Patch(
                SLOT_ENTRY,
                "        since = renewed if covered else columns.requested\n",
                "        since = max(columns.last_taken, renewed)\n",
            ),
        ),
        shared=True,
        # Its hole needs a process paused between the server's send and the take: stalls at 3%
        # of the scheduling points, a 4 s wait, one message a pull.
        edit=(("ack_wait", 4.0), ("fetch_batch", 1), ("chaos", STALLING_PROCESSES)),
    ),
    Mutant(
        "siblings-late-renewal-covers",
        "siblings: a renewal after the take covered the rows however late it came, so a process "
        "paused between the server's send and the take (its keeper renewing at once on waking) "
        "took a message as fresh while a sibling had taken its redelivery: emitted twice (seed "
        "9129 of the pausing worlds)",
        (
            Patch(
                SLOT_ENTRY,
                "        covered = columns.last_taken <= renewed < columns.requested + limit\n",
                "        covered = columns.last_taken <= renewed\n",
            ),
        ),
        # The worlds of `siblings-lateness-from-take`: its hole too needs a process paused
        # between the server's send and the take (its keeper renewing on waking).
        shared=True,
        edit=(("ack_wait", 4.0), ("fetch_batch", 1), ("chaos", STALLING_PROCESSES)),
    ),
    Mutant(
        "zombie-recreates-settled",
        "a task attempt that outlived its committed batch created that batch's entry again "
        "after the driver removed it as settled, and its messages were acked as committed: "
        "no fence in the pointer (closed by 3be8564)",
        (
            Patch(
                SLOT_ENTRY,
                "                await protocol.check_fence(ledger, pointer, gen, slot, "
                "self.head.attempt)\n"
                "                self.revision = revision\n",
                "                self.revision = revision\n",
            ),
        ),
        edit=STALLING,
    ),
    Mutant(
        "take-over-unfenced",
        "hole 4 of issue 45: an attempt that outlived its settled batch created the entry again, "
        "the create's answer was lost, and its retry took the entry over as an earlier "
        "attempt's without the fence: an open entry of the live lineage, never sealed, acked "
        "nor settled",
        (
            Patch(
                SLOT_ENTRY,
                "that settled batch's.\n            await protocol.check_fence(ledger, ",
                "that settled batch's.\n            (lambda *_: None)(ledger, ",
            ),
        ),
        edit=STALLING,
    ),
    Mutant(
        "give-back-under-a-recording-attempt",
        "a give-back read an open entry without taking it from the earlier query's task attempt "
        "still recording in it: what that attempt recorded after the read was removed un-NAKed "
        "and came after newer messages of its key (closed by f659bbf)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "        taken = await _taken_from_its_attempt(ledger, gen, slot)\n",
                "        taken = await read_head(ledger, gen, slot)\n",
            ),
        ),
        edit=REPLACED,
    ),
    Mutant(
        "late-recorded-redelivery-kept",
        "an attempt failing on its given-back entry NAKed what requests still out delivered "
        "late, except recorded messages that came again: the give-back had NAKed their earlier "
        "delivery, so this one waited out its ack wait after newer messages of its key (seed "
        "2306 of the replaced-mid-batch worlds)",
        (
            Patch(
                SLOT_READER,
                "                    if lost or seq not in recorded:\n",
                "                    if seq not in self.entry.taken:\n",
            ),
        ),
        edit=REDELIVERED_TO_STOPPED_QUERIES,
    ),
    Mutant(
        "came-again-kept-at-a-lost-seal",
        "an attempt of a stopped query whose read had ended took again, to its requests still "
        "out, recorded messages a new checkpoint's give-back had NAKed, then found its entry "
        "gone at its seal and gave nothing back: they waited out their ack wait after newer "
        "messages of their key (seed 162 of late-recorded-redelivery-kept's worlds)",
        (
            Patch(
                SLOT_READER,
                "            if sealing and not protocol.kept_by_its_taker(taken):\n",
                "            if False:\n",
            ),
        ),
        edit=REFUSED_PULLS_SENT_LATE,
    ),
    Mutant(
        "taker-judged-at-the-lost-write",
        "an attempt that lost its entry to another attempt of the query judged whether that one "
        "kept what came again only from the head its failed write found: a new checkpoint's "
        "give-back removed the entry after, NAKing what it named, and the redelivery came to "
        "the attempt's request still out, unNAKed, to wait out its wait behind a newer message "
        "of its key (seed 1141 of the worlds of cancelled-record-leaves-its-chunks)",
        (
            Patch(
                SLOT_READER,
                "            if kept_by_taker and await self.taker_lost_it(recorded, late_seqs):\n",
                "            if False:\n",
            ),
        ),
        edit=ZOMBIES_WAKING_TO_REMOVED_ENTRIES,
        packed=True,
    ),
    Mutant(
        "round-dates-back-a-later-delivery",
        "a keeper round confirmed after a held message came again (its process stalled between "
        "the round's send and its answer) dated the later delivery's wait back to the round's "
        "send, so a give-back skipped its NAK as maybe run out, and it waited out its wait "
        "behind a newer message of its key (seed 264 of the worlds of "
        "cancelled-record-leaves-its-chunks on the schedules of ledger format 3)",
        (
            Patch(
                ACKS,
                "            if (started := since.get(seq, -math.inf)) <= sent\n"
                "            and surely_running(started, sent, wait)\n",
                "            if surely_running(since.get(seq, -math.inf), sent, wait)\n",
            ),
        ),
        edit=ZOMBIES_WAKING_TO_REMOVED_ENTRIES,
        packed=True,
    ),
    Mutant(
        "failed-acceptance-chunk-kept",
        "an attempt whose acceptance of a chunk failed (its dedupe read, on an entry a new "
        "checkpoint gave back meanwhile) NAKed only what its keeper held and what came late: "
        "the chunk's deliveries waited out their ack wait after newer messages of their key "
        "(seed 3819 of the replaced-mid-batch worlds without siblings)",
        (
            Patch(
                SLOT_READER,
                "            if self.accepting is not None:",
                "            if False:",
            ),
        ),
        edit=STOPPED_MID_DEDUPE,
    ),
    Mutant(
        "fenced-take-over-removes-what-it-holds",
        "a stopped query's task attempt took over, after a new checkpoint's give-back fenced its "
        "gen, the entry an attempt that crashed had recorded messages in, and removed it at its "
        "fence check before the give-back listed the entries: nothing NAKed those messages, "
        "which waited out their ack wait after newer messages of their keys (seed 3182 of the "
        "replaced-mid-batch worlds)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "found[0].attempt == attempt and not found[0].count:",
                "found[0].attempt == attempt:",
            ),
        ),
        edit=FENCED_TAKE_OVERS,
        speculation=True,
    ),
    Mutant(
        "give-back-rewrites-the-head-as-is",
        "a give-back took an open entry from the earlier query's attempt by rewriting its head "
        "as it was: an attempt whose write had answered as a conflict read the head back, took "
        "it for its own write and recorded on the give-back's revision after the give-back's "
        "read, and what it recorded was removed un-NAKed, after newer messages of its key (seed "
        "13576 of the replaced-mid-batch worlds)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "await write_head(ledger, gen, slot, take_over(head, head.pin, GIVEN_BACK), "
                "revision)",
                "await write_head(ledger, gen, slot, head, revision)",
            ),
        ),
        edit=GIVE_BACKS_BETWEEN_LOST_ANSWERS,
    ),
    Mutant(
        "lost-acks-refused-as-a-new-consumer",
        "a query on a new checkpoint gave back a batch the consumer had acked; a server restart "
        "lost those acks, and a message came back at or below the ack floor the driver had "
        "seen: held by no batch of the query, it was refused as a new consumer's and the query "
        "failed (seed 8787 of the replaced-mid-batch worlds)",
        (
            Patch(
                ACCEPTANCE,
                "        if not again or await self._same_consumer(sighting):\n",
                "        if not again:\n",
            ),
        ),
        edit=REPLACED,
    ),
    Mutant(
        "outlived-entries-kept",
        "an attempt that outlived its entry (its lineage given back, or its batch settled) "
        "created it again and was killed before its fence check: the OPEN entry it left was "
        "removed by no one (seed 3629 of the pausing-executor worlds)",
        (
            Patch(
                BATCH_COORDINATOR,
                "            await self.ledger.give_back_outlived(client)\n",
                "",
            ),
        ),
        edit=DYING_ZOMBIES,
    ),
    Mutant(
        "zombie-chunks-left",
        "a task attempt whose head write failed left the chunks it had just written: under an "
        "entry removed meanwhile (settled, or given back) nothing removed them before the "
        "bucket's max age (closed by e162753)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "        await ledger.remove_chunks(key for key in keys if key not in named)\n",
                "",
            ),
        ),
        edit=STALLING,
    ),
    Mutant(
        "cancelled-record-leaves-its-chunks",
        "a packed task whose slot failed cancelled its other slots, one of them in a record "
        "whose head write had just failed (its entry removed), or before it was sent: the "
        "chunks it had written stayed until the next start's adoption (seeds 1893, 1861 of the "
        "worlds with packed tasks and pauses; closed by the record that runs to its end "
        "however cancelled; the slot's steps await their write shielded as well, so both "
        "shields go)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "        written = await asyncio.shield(writing)\n",
                "        written = await writing\n",
            ),
            Patch(
                SLOT_ENTRY,
                "        return await asyncio.shield(self.writing)\n",
                "        return await self.writing\n",
            ),
        ),
        edit=ZOMBIES_WAKING_TO_REMOVED_ENTRIES,
        packed=True,
    ),
    Mutant(
        "new-consumer-floor-read-as-reported",
        "a consumer's ack floor was read as the info reports it: nats-server 2.11 and 2.12 report "
        "a new consumer's floor as 0 until its first delivery is acked (created at --deliver 31: "
        "floor 0, delivered 30; found on 2.11.11, 2026-11-30), which took it for a consumer that "
        "goes back",
        (
            Patch(
                REPLIES,
                FLOOR_BOUNDED_BY_THE_START
                + '        if int(floor.get("consumer_seq", 0)) == self.delivered_consumer_seq:\n'
                "            return max(stream_floor, self.delivered_seq)\n",
                '        stream_floor = int(floor.get("stream_seq", 0))\n',
            ),
        ),
        edit=(("floor_from_zero", True), ("recreate_consumer", True), ("follows_advice", True)),
    ),
    Mutant(
        "new-consumer-start-ignored",
        "a consumer's ack floor was read from the info alone: nats-server 2.11 and 2.12 report "
        "a new consumer's floor as 0 until its first ack, so the consumer created where a "
        "refusal said, with deliveries out and none acked (the refused run's last attempt had "
        "pulled from it), read as one that goes back, and was refused again (seed 669 of the "
        "worlds on 2.11-2.12 whose operator follows the advice); its `opt_start_seq` bounds it",
        (
            Patch(
                REPLIES,
                FLOOR_BOUNDED_BY_THE_START,
                '        stream_floor = int(floor.get("stream_seq", 0))\n',
            ),
        ),
        edit=(("floor_from_zero", True), ("recreate_consumer", True), ("follows_advice", True)),
    ),
    Mutant(
        "refusal-leaves-the-pointer-behind",
        "a driver that refused a consumer created again did not write its sightings to the "
        "pointer first: the next start judged the consumer the operator created where the "
        "refusal said against an older floor, refused it in turn and advised an earlier start, "
        "which delivers again what the query committed (seeds 13, 129, 255 of the worlds whose "
        "operator follows the advice)",
        (
            Patch(
                BATCH_COORDINATOR,
                "            if self.ledger.sightings_moved():\n"
                "                await self.ledger.save_pointer()\n"
                "            raise\n",
                "            raise\n",
            ),
        ),
        edit=(("recreate_consumer", True), ("follows_advice", True)),
    ),
    Mutant(
        "recorder-cut-off-from-its-write",
        "a packed task that ended early cancelled a slot awaiting its write: the write ran to "
        "its end (the record's own shield), but the slot never learnt it, gave back what the "
        "write recorded (another reader of the consumer could take a message a retry then "
        "committed from the entry) and released the entry at a stale revision (found by the "
        "real-server test of a packed task closed after its first rows, 1 run in 6; closed by "
        "c1ade61)",
        (
            Patch(
                SLOT_ENTRY,
                "        return await asyncio.shield(self.writing)\n",
                "        return await self.writing\n",
            ),
        ),
        edit=(*STALLING, *OTHER_CLIENT, *EARLY_STOPS),
        packed=True,
    ),
    Mutant(
        "cut-off-chunk-stranded",
        "a packed task that Spark stopped early cancelled a slot while it sent its next pull "
        "ahead of the chunk the last one delivered: that chunk, out of the inbox and not yet "
        "handed to the slot, was given back by nobody and waited out its ack wait while newer "
        "messages of its keys were committed (seeds 248 and 555 of the packed worlds with "
        "early stops: per-key order, none of the README's cases)",
        (
            Patch(
                SLOT_PULLS,
                "                    try:\n"
                "                        await loop.send_ahead(plan)\n"
                "                    except asyncio.CancelledError:  # cut off: `collect_late` "
                "hands it back\n"
                "                        self.consumer.cut_off.extend(got)\n"
                "                        raise\n",
                "                    await loop.send_ahead(plan)\n",
            ),
        ),
        edit=EARLY_STOPS,
        packed=True,
    ),
    Mutant(
        "seal-taken-before-its-write",
        "a slot took its head for sealed before the seal's write: cancelled meanwhile (a packed "
        "task Spark stopped early), it skipped the release, and the entry, never sealed, "
        "stayed OPEN and held: the batch's next read stood by HOLD_QUIET for it "
        "(found by test_early_stops' isEmpty() in a foreachBatch, 1 packed run in 3)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "    try:\n"
                "        return await write_head(ledger, gen, slot, head, revision)\n"
                "    except LedgerConflict:\n"
                "        raise\n"
                "    except BaseException:\n"
                "        head.state = EntryState.OPEN\n"
                "        raise\n",
                "    return await write_head(ledger, gen, slot, head, revision)\n",
            ),
        ),
        edit=EARLY_STOPS,
        packed=True,
    ),
    Mutant(
        "keeper-cancelled-with-its-slot",
        "a slot cancelled while it awaited its keeper's end (a packed task Spark stopped early) "
        "cancelled the keeper's task with it; its abandon, awaiting that task again, failed "
        "before the release, and the entry stayed OPEN and held: the batch's next read stood "
        "by HOLD_QUIET for it (found by test_early_stops' isEmpty() in a foreachBatch)",
        (
            Patch(
                SLOT_READER,
                "            await asyncio.shield(self.keeping)\n",
                "            await self.keeping\n",
            ),
        ),
        edit=EARLY_STOPS,
        packed=True,
    ),
    Mutant(
        "sibling-partition-messages-taken-as-unread",
        "a consumer created again was judged by what the query committed through it alone: "
        "another partition's message between the old ack floor and the new start, purged, was "
        "refused as read by none and lost, also once the operator created the consumer where "
        "the refusal said (seeds 97, 147, 326 of the worlds on nats-server 2.11-2.12 whose "
        "operator follows the advice)",
        (
            Patch(
                BATCH_COORDINATOR,
                "            state.slot.name for state in self.states.values() if "
                "state.slot.stream == slot.stream\n",
                "            state.slot.name\n"
                "            for state in self.states.values()\n"
                "            if (state.slot.stream, state.slot.consumer) == (slot.stream, "
                "slot.consumer)\n",
            ),
        ),
        edit=(("floor_from_zero", True), ("recreate_consumer", True), ("follows_advice", True)),
    ),
    Mutant(
        "headless-chunks-kept",
        "a task attempt of a settled (or given-back) entry wrote a chunk, found its head write "
        "failing and was killed before it removed the chunk: no head named it, the give-backs "
        "list heads, and it stayed for good (seed 1860 of the pausing worlds with new "
        "checkpoints; closed by the adopting driver's removal of headless chunks)",
        (
            Patch(DRIVER_LEDGER, "        await self.ledger.remove_headless(self.headless)\n", ""),
            Patch(
                DRIVER_LEDGER, "            await ledger.remove_headless(listing.headless)\n", ""
            ),
        ),
        edit=DYING_ZOMBIES,
    ),
    Mutant(
        "ledger-keeps-max-age",
        "issue 45 hole 1: the ledger bucket kept the max age it was made with (7 days by the "
        "previous release, or an operator's shorter one), which applies to every key by its "
        "last write: a query paused longer lost its pointer and the entries of its last "
        "committed batch, whose unacked messages came back and were emitted again",
        (
            Patch(
                DRIVER_LEDGER,
                "            await keep_entries(self.kv)\n",
                "            pass  # the bucket keeps its max age\n",
            ),
        ),
    ),
    Mutant(
        "given-back-zombie-entry-left",
        "a task attempt of a query replaced by one on a new checkpoint, stalled before its "
        "create, created its entry after the give-back: nothing removed it (before, the "
        "bucket's max age did, after 7 days), and what it took waited out its ack wait behind "
        "newer messages of its keys (no fence of retired lineages)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "    elif ledger.lineage in pointer.retired:\n",
                "    elif False:\n",
            ),
        ),
        edit=STALLING,
    ),
    Mutant(
        "fence-removes-a-retry-s-entry",
        "an attempt that outlived its settled batch, its create's answer held up by a pause, "
        "removed the entry its retry had sealed since: the fence is the newest settled gen, and "
        "that entry was still kept (its acks lost in a server restart), so a redelivery of its "
        "message was emitted a second time",
        (
            Patch(
                LEDGER_PROTOCOL,
                "    if found is not None and found[0].attempt == attempt and not found[0].count:"
                "\n",
                "    if True:\n",
            ),
        ),
        # Its own case needs a retry's sealed entry kept (its acks lost in a server restart)
        # when the paused attempt wakes: rare in every world tried (271 was the first of 0-481
        # of the pausing worlds restarting after a tenth of the rounds of acks). Its patch also
        # removes an entry of the attempt's own that holds deliveries, the hole of
        # `fenced-take-over-removes-what-it-holds`, whose worlds catch that often.
        edit=FENCED_TAKE_OVERS,
        speculation=True,
    ),
    Mutant(
        "give-back-naks-the-recorded-delivery",
        "a new checkpoint's give-back NAKed the delivery its entry recorded: when the message "
        "had been delivered again and the ack floor had passed that delivery, the server "
        "ignored the NAK (`processNak`) and the message waited out its ack wait behind newer "
        "messages of its key (seeds 1494, 1571, 3433, 3992 on the schedules of 2026-11-28)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "    last = info.delivered_consumer_seq\n",
                "    return deliveries\n    last = info.delivered_consumer_seq\n",
            ),
        ),
        edit=STALLING,
    ),
    Mutant(
        "give-back-fails-on-an-empty-entry",
        "a new checkpoint's give-back asked the consumer of an entry that took nothing (no "
        "delivery names it) and failed, after it had removed the entries and before it NAKed "
        "a message: they came after newer messages of their keys (seeds 1132 and 4307)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "        if not deliveries:  # an entry created that took nothing yet: no consumer "
                "to ask\n            continue\n",
                "",
            ),
        ),
    ),
    Mutant(
        "max-deliver-unchecked",
        "a consumer with max_deliver was read: a message given back or redelivered that many "
        "times left it unread (the source refuses such a consumer before it takes anything)",
        (Patch(CONSUMER_CHECKS, "    if max_deliver > 0:\n", "    if False:\n"),),
        edit=(("max_deliver", 2),),
    ),
    Mutant(
        "recreated-consumer-unchecked",
        "a consumer deleted and created again while the query ran was read on: it delivered "
        "again from its start what the query had committed and settled (the source refuses to "
        "read on once it sees the consumer's later creation time)",
        (
            Patch(
                CONSUMER_CHECKS,
                "    if recreation is not None and before is not None and created_later(",
                "    if False and created_later(",
            ),
        ),
        edit=(("recreate_consumer", True),),
    ),
    Mutant(
        "recreated-consumer-unchecked-in-flight",
        "a batch planned before its consumer was deleted and created again read the new one: "
        "it emitted what the new one delivered again from its start, which earlier batches had "
        "committed and settled, before the next planning refused (a task now stops at a "
        "delivery at or below the ack floor the driver saw that no batch holds)",
        (
            Patch(
                ACCEPTANCE,
                "        if sighting is not None and low <= sighting.ack_floor:",
                "        if False:",
            ),
        ),
        edit=(("recreate_consumer", True),),
    ),
    Mutant(
        "siblings-seal-under-a-new-consumer",
        "slots sharing a consumer sealed without looking at it: one deleted and created again "
        "while the old one had delivered nothing at planning delivered a slot, as first "
        "deliveries, what a sibling took in the batch before, and the batch emitted it twice (a "
        "slot with siblings now checks the consumer's creation time before it seals)",
        (
            Patch(
                SLOT_READER,
                "        if not partition.siblings or sighting is None or not sighting.created:",
                "        if True:",
            ),
        ),
        shared=True,
        edit=(("recreate_consumer", True),),
    ),
    Mutant(
        "remembered-consumers-forgotten",
        "a restarted driver took the consumers as it found them: one deleted and created again "
        "after the last look of the run before delivered again from its start what the query "
        "had committed (the pointer keeps each consumer's creation time across runs)",
        (
            Patch(
                DRIVER_LEDGER,
                "                remembered = pointer.consumers\n",
                "                remembered = {}\n",
            ),
        ),
        edit=(("recreate_consumer", True),),
    ),
    Mutant(
        "acks-uncommitted-at-stop",
        "an ack before commit: the driver at stop acks every batch it planned, not only the "
        "committed ones (the guarantee the ledger exists for; never shipped)",
        (
            Patch(
                BATCH_COORDINATOR,
                "                    await self.ack_through(self.committed)\n",
                "                    await self.ack_through(self.ledger.head_gen)\n",
            ),
        ),
    ),
    Mutant(
        "no-dedupe",
        "redeliveries of what earlier batches emitted, not acked yet, are not dropped: a task "
        "gets no dedupe spans (what the ledger's entries are for; never shipped)",
        (
            Patch(
                BATCH_COORDINATOR,
                "        dedupe, dedupe_through = dedupes[slot.stream] "
                "if task.limit else NO_DEDUPE\n",
                "        dedupe, dedupe_through = NO_DEDUPE\n",
            ),
        ),
    ),
    Mutant(
        "acked-forgotten-at-once",
        "the settle horizon skipped: an acked entry is forgotten at the next planning, and with "
        "it the dedupe of its messages, though a server restart can lose its acks (those of "
        "the last 100 ms) and redeliver them (issue 45: seeds 0-299 passed it while the "
        "simulated server never restarted)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "    if not head.count:\n        return Settling.NOW\n",
                "    if not head.count or head.state is EntryState.ACKED:\n"
                "        return Settling.NOW\n",
            ),
        ),
    ),
    Mutant(
        "acked-entries-kept",
        "acked entries never settle: the ledger keeps every batch's entry of the live lineage "
        "(what the protocol no longer needs it must remove itself)",
        (
            Patch(
                LEDGER_PROTOCOL,
                "        return Settling.NOT_YET\n    return Settling.PAST\n",
                "        return Settling.NOT_YET\n    return Settling.NOT_YET\n",
            ),
        ),
    ),
    Mutant(
        "stale-pin-ends-the-batch",
        "a 423 (stale pin id) ends the task's batch instead of a pull for a fresh pin: on "
        "nats-server a pin lapses unless a pull carries it, and a pull with its old id then gets "
        "423, so a slot whose tasks start with a lapsed pin would never read again",
        (
            Patch(
                PULL_POLICY,
                "            return self.pin_retries <= PIN_RETRIES\n",
                "            return False\n",
            ),
        ),
    ),
    Mutant(
        "sealed-kept-only-once-due",
        "the sealed keeper restarts an entry's ack wait only once it has run out: a late "
        "`+WPI` rescues nothing on nats-server (the delivery is on its redelivery queue)",
        (
            Patch(
                SEALED_KEEPER,
                "        return started + self.wait - (now + self.wait / _LOOKS) < self.left\n",
                "        return started + self.wait < now\n",
            ),
        ),
        edit=OTHER_CLIENT,
    ),
    Mutant(
        "rerun-batch-unkept",
        "a batch re-run after a restart (no `latestOffset` before it) leaves what its tasks seal "
        "unkept until the next planning: a retry that stalls past the ack wait lets another "
        "client of the overflow consumer take a message the batch then commits (seed 230)",
        (
            Patch(
                BATCH_COORDINATOR,
                "            self._keep_sealed([seen.ack_wait for seen in looked.values()])\n",
                "            pass\n",
            ),
        ),
        edit=OTHER_CLIENT,
    ),
    Mutant(
        "rerun-partitions-with-the-option-s-ack-wait",
        "a batch run again after a restart, planned before the driver looked at the consumer, "
        "carried the option's 30 s ack wait for the consumer's 4 s: its tasks' keepers renewed "
        "too seldom, and another client got a message the batch committed too (seed 782)",
        (
            Patch(
                BATCH_COORDINATOR,
                "        seen = looked.get(name) or (state.seen if state is not None else None)\n",
                "        seen = state.seen if state is not None else None\n",
            ),
        ),
        # Its hole needs a batch run again after a driver's death whose task waits on a pull a
        # server restart forgot: under the option's 30 s wait it waits 15 s for it and keeps
        # what it took every 10 s. Drivers that die at 3% of their points, and a restart after
        # every round of acks, up to 10 (12 of 0-999 catch it so, 2026-12-01; under the drawn
        # faults, 782 was the only seed known).
        edit=(
            *OTHER_CLIENT,
            ("ack_wait", 4.0),
            ("restart_after_acks", 1.0),
            ("server_restarts", 10),
            ("chaos", Chaos(driver_crash=0.03, crashes=4)),
        ),
    ),
    Mutant(
        "forgotten-pull-waited-out",
        "a pull a server restart forgot was waited for 5 s past its expiry, whatever the ack "
        "wait: a message it had delivered ran out of its 4 s wait unkept, another client took "
        "it, and the batch recorded and committed it too (seed 5797)",
        (
            Patch(
                PULL_POLICY,
                "        self.grace = min(CLIENT_GRACE, ack_wait * GRACE_SHARE)\n",
                "        self.grace = CLIENT_GRACE\n",
            ),
        ),
        # The draws of seed 5797 of its worlds, fixed, with the server restarting after a tenth
        # of the rounds of acks (not a fiftieth): no crashes, three messages a pull, at most
        # three pending, so a forgotten pull is common in 0-500 on other schedules too.
        edit=(
            *OTHER_CLIENT,
            SPARK_42,
            ("ack_wait", 4.0),
            ("messages", 21),
            ("max_ack_pending", 3),
            ("per_batch", 5),
            ("fetch_batch", 3),
            ("chaos", Chaos(crashes=1)),
            ("trigger_interval", 3.0),
            ("restart_after_acks", 0.1),
        ),
    ),
    Mutant(
        "stale-nak-gives-back-another-s-delivery",
        "a zombie that stalled past its ack wait NAKed what it held unrecorded: nats-server's "
        "processNak gives back whatever delivery of the stream sequence is pending, here the "
        "retry's, recorded and committed, and another client got it (seeds 1347, 689)",
        (
            Patch(
                SLOT_READER,
                "        naks = [reply for reply, since in deliveries"
                " if surely_running(since, now, ack_wait)]\n",
                "        naks = [reply for reply, _ in deliveries]\n",
            ),
        ),
        edit=(*OTHER_CLIENT, *STALLING),
    ),
    Mutant(
        "lapsed-delivery-restarted-by-a-round",
        "a keeper round confirmed after a held delivery's wait may have run out counted as "
        "restarting it, so a give-back NAKed it; the round's +WPI had restarted the retry's "
        "delivery, and the NAK gave that back to another client (seed 1347)",
        (
            Patch(
                ACKS,
                "        running = [\n"
                "            seq\n"
                "            for seq in self._round\n"
                "            if (started := since.get(seq, -math.inf)) <= sent\n"
                "            and surely_running(started, sent, wait)\n"
                "        ]\n",
                "        running = self._round\n",
            ),
        ),
        edit=LAPSING_HELD_DELIVERIES,
    ),
    Mutant(
        "taken-over-messages-unkept",
        "a retry that took an entry over kept only what it pulled from redelivery, not what the "
        "earlier attempt had recorded: one such message had gone past its wait to a sibling "
        "that dropped it, the driver's keeper restarted it too late, and another client of the "
        "overflow consumer got a message the batch committed (seed 12503)",
        (
            Patch(
                SLOT_READER,
                "        if not taken_over:\n            return\n",
                "        if True:\n            return\n",
            ),
            # and without the restart before the take-over's write, which since 2026-12-01
            # restarts their wait once (a retry outliving it lets them go all the same, rarely
            # within the worlds' short batches)
            Patch(
                SLOT_READER,
                "        await self.entry.claim(self.keep_taken_over, self.restart_taken_over)\n",
                "        await self.entry.claim(self.keep_taken_over)\n",
            ),
        ),
        # Its hole needs a retry's take-over while siblings drop what went past its wait: tasks
        # that crash at 3% of their points or are lost, stalls, 30 messages pulled 16 at a time
        # under a 4 s wait (1 of 0-1200 catches it so, 1 of 0-700 on the schedules of ledger
        # format 3; 1 of 0-6000 with the faults drawn, 2026-12-01).
        edit=(
            *OTHER_CLIENT,
            ("ack_wait", 4.0),
            ("fetch_batch", 16),
            ("messages", 30),
            ("per_batch", 50),
            ("max_ack_pending", 1000),
            ("chaos", Chaos(task_crash=0.03, task_lost=0.02, stall=0.01, crashes=4)),
        ),
    ),
    Mutant(
        "taken-over-renewed-after-fence",
        "a retry that took an entry over restarted the wait of what it took over only after the "
        "claim's fence and sibling reads: a sibling's redelivery of one, dropped as recorded, "
        "ran out in those round trips, and another client of the overflow consumer got a "
        "message the batch committed (seed 18241)",
        (
            Patch(
                SLOT_READER,
                "        await self.entry.claim(self.keep_taken_over, self.restart_taken_over)\n",
                "        await self.entry.claim()\n",
            ),
            Patch(
                SLOT_READER,
                "        self.keep_on_taken_over()\n",
                "        await self.keep_taken_over(self.entry.recorded_earlier)\n"
                "        self.keep_on_taken_over()\n",
            ),
        ),
        # Its hole needs a wait that runs out between the take-over's write and the claim's
        # later reads, of a delivery whose holder lives: in the worlds where a job reads a
        # batch's tasks first, Spark's close of such a task releases its entry with what it
        # recorded, and the full read takes it over at once; the answers to the attempts'
        # ledger requests take up to 3 s, so its reads after the write span much of the 10 s
        # wait; no crashes, so no take-over waits out a dead holder. 95 of seeds 0-999 catch it
        # (none of 0-2999 with answers up to 1.5 s once the taker restarted what it adopts
        # before its write); 34, 488 and 800 fail unmutated (another client took a message the
        # batch committed: the late takers of docs/faults.md, presumably).
        edit=(*SLOW_TAKE_OVERS, ("ack_wait", 10.0), ("slow_ledger", 0.3)),
    ),
    Mutant(
        "released-unrenewed",
        "an attempt released its entry without restarting the ack wait of what it recorded: "
        "nothing kept it until the taker restarted it, after the early job's end and slow ledger "
        "answers, and another client of the overflow consumer took a message the batch "
        "committed (seed 349 of the slow-ledger worlds with a 6 s wait and answers up to 1.5 s)",
        (
            Patch(
                SLOT_READER,
                "        await self.keeper.restart_running()\n",
                "",
            ),
        ),
        # The worlds of `taken-over-renewed-after-fence` under a 6 s wait, the answers to the
        # attempts' ledger requests up to 1.5 s: the taker's claim, three of them or more, comes
        # once the job reading the batch's tasks first has ended, seconds after the release (2
        # of 0-499 catch it, 2026-12-01).
        edit=(*SLOW_TAKE_OVERS, ("ack_wait", 6.0), ("slow_ledger", 0.25)),
    ),
    Mutant(
        "came-again-naked-before-the-release",
        "an attempt Spark closed NAKed, before its release, the recorded deliveries that came "
        "again to it (its stall let their waits run out): the retry that took the entry over "
        "committed them, and another client of the overflow consumer took one from the "
        "redelivery queue first (seed 723 of the slow-ledger worlds with early stops, a 4 s "
        "wait and the drawn faults)",
        (
            Patch(
                SLOT_READER,
                "            again = self.keeper.again if lost else set()\n",
                "            again = set() if kept_by_taker else self.keeper.again\n",
            ),
        ),
        # The worlds of `taken-over-renewed-after-fence` under a 4 s wait, the answers to the
        # attempts' ledger requests up to 0.4 s, with the drawn faults (their stalls).
        edit=(
            *(edit for edit in SLOW_TAKE_OVERS if edit[0] != "chaos"),
            ("ack_wait", 4.0),
            ("slow_ledger", 0.1),
        ),
    ),
    Mutant(
        "released-left-to-a-late-taker",
        "the driver's keeper left a released entry to the attempt that takes it over: the full "
        "read of a batch a job read first started once that job's other task ended, past the "
        "ack wait of what an attempt Spark closed had released, and another client of the "
        "overflow consumer took a message the batch committed (seeds 280 and 735 of the "
        "slow-ledger worlds with early stops, a 4 s wait and the drawn faults)",
        (
            Patch(
                SEALED_KEEPER,
                "            if head is not None and protocol.awaits_taker(head):\n",
                "            if False:\n",
            ),
        ),
        # The world of `came-again-naked-before-the-release`.
        edit=(
            *(edit for edit in SLOW_TAKE_OVERS if edit[0] != "chaos"),
            ("ack_wait", 4.0),
            ("slow_ledger", 0.1),
        ),
    ),
    Mutant(
        "taken-over-kept-after-the-claim",
        "a retry that took an entry over began its keeper's rounds only once its claim was done: "
        "the claim's fence and sibling reads after the take-over's write, under slow ledger "
        "answers, and a third of the wait to the first round let the wait restarted as the "
        "write landed run out, and another client of the overflow consumer took messages the "
        "batch committed (seed 662 of the slow-ledger worlds with a 6 s wait and answers up to "
        "1.5 s, main's schedules)",
        (
            Patch(
                SLOT_READER,
                "        await self.keeper.renew()\n        self.start_keeping()\n",
                "        await self.keeper.renew()\n",
            ),
        ),
        # The worlds of `released-unrenewed`.
        edit=(*SLOW_TAKE_OVERS, ("ack_wait", 6.0), ("slow_ledger", 0.25)),
    ),
    Mutant(
        "taker-s-delivery-given-back",
        "a zombie whose entry a retry took over gave back the redelivery of a message it had "
        "recorded (for the order of its key): the retry's keeper would have kept it, and "
        "another client of the overflow consumer got a message the batch committed (seed 851)",
        (
            Patch(
                SLOT_READER,
                "            kept_by_taker = protocol.kept_by_its_taker(taken)\n",
                "            kept_by_taker = False\n",
            ),
        ),
        edit=(*OTHER_CLIENT, *STALLING, ("ack_wait", 4.0)),
    ),
    Mutant(
        "replaced-lineage-sightings-forgotten",
        "a restarted checkpoint whose first batch Spark runs again takes its lineage up again "
        "after `initialOffset` began another, which the pointer then named: the consumers as "
        "its last driver saw them were forgotten, and one created again while it was stopped "
        "was read from its start (seed 139 of the worlds with a consumer created again)",
        (
            Patch(
                DRIVER_LEDGER,
                "                remembered = pointer.replaced_consumers.get(offset.lineage, {})\n",
                "                remembered = {}\n",
            ),
        ),
        # Its hole needs a new checkpoint whose first batch fails and runs again across the
        # recreation: half the runs start on a new checkpoint, a fifth of the sink's writes fail
        # (5 seeds of 0-3777 catch it so; 3 of 9000-35924 under the drawn chances, 2026-11-30).
        edit=(("recreate_consumer", True), ("new_checkpoint", 0.5), ("sink_failure", 0.2)),
    ),
    Mutant(
        "returned-entries-kept",
        "entries of settled batches that a server restarted uncleanly brought back without "
        "their chunks stay in the ledger: the next tasks fail reading them (an ack, a dedupe), "
        "at every restart (chaos/run.py --seed 3030: 36 batches' heads came back)",
        (
            Patch(
                DRIVER_LEDGER,
                "        await self._remove_returned(listing.chunks)\n",
                "",
            ),
        ),
        edit=RETURNING,
    ),
    Mutant(
        "returned-sealed-entries-acked",
        "sealed entries of batches long settled or given back, which a server restarted "
        "uncleanly brought back with their chunks, are taken for the query's own: the next "
        "batch's tasks ack their messages, which a later checkpoint reads and has not committed",
        (
            Patch(
                LEDGER_PROTOCOL,
                "        awaits_acks(head) and gen < kept_from\n",
                "        False\n",
            ),
        ),
        edit=RETURNING,
    ),
    Mutant(
        "returned-entry-given-back-by-its-chunks",
        "a give-back reads what an entry holds to NAK it, and fails on one a server restarted "
        "uncleanly brought back without its chunks: every later start of the query fails",
        (
            Patch(
                LEDGER_PROTOCOL,
                "        except ChunkMissing:\n",
                "        except LedgerConflict:\n",
            ),
        ),
        edit=RETURNING,
    ),
    Mutant(
        "rerun-siblings-under-a-consumer-started-over",
        "a batch run again after a restart, whose consumer the driver took as created again "
        "since the batch was planned: its slots checked the new one's first deliveries, above "
        "the consumer sequence the driver saw, against nothing, and one took what a sibling "
        "had taken in the batch's first run (seeds 632 and 1650 of the worlds with a consumer "
        "created again; the driver now tells the batch's tasks, which check every delivery "
        "against their siblings' records)",
        (
            Patch(
                ACCEPTANCE,
                "                sighting.started_over or low_delivery <= sighting.delivered\n",
                "                low_delivery <= sighting.delivered\n",
            ),
        ),
        shared=True,
        edit=(("recreate_consumer", True), ("chaos", CRASHING_DRIVERS)),
    ),
    Mutant(
        "started-over-only-against-the-pointer",
        "a driver takes a consumer as created again since the previous driver saw it only when "
        "its look compares the new one with the pointer's sighting: a look of one slot saw the "
        "old one first, a sibling's after a stall the new one, and the batch that driver "
        "planned, run again, was not told (seed 6791 of the worlds with a consumer created "
        "again: its siblings both emitted what the first run had sealed)",
        (
            Patch(
                CONSUMER_CHECKS,
                "            if (stream, name) in self.inherited:\n",
                "            if remembered is not None:\n",
            ),
        ),
        shared=True,
        # Its hole needs a restarted driver's looks at the consumer, one per slot, on either
        # side of its creation again: drivers that die often, stalls of up to 39 s at 3% of the
        # scheduling points (a 30 s wait), purges.
        edit=STARTED_OVER,
    ),
    Mutant(
        "started-over-told-by-one-driver-only",
        "a batch run again after its consumer was created again is told so (its tasks check "
        "first deliveries against the siblings' records) only by the driver that found the "
        "recreation: that driver wrote the new consumer's sighting to the pointer and died "
        "before the batch committed, and the next one re-ran it untold (seed 2159 of the worlds "
        "whose shared consumer is created again: a zombie of the re-run took 3 from the new "
        "consumer as new while a sibling's entry held it, and both emitted it)",
        (
            Patch(
                BATCH_COORDINATOR,
                "        started_over |= self.ledger.started_over_before(end.gen, committed)\n",
                "",
            ),
        ),
        shared=True,
        # The worlds of started-over-only-against-the-pointer: a driver that finds the consumer
        # created again must die before the batch it re-runs commits.
        edit=STARTED_OVER,
    ),
    Mutant(
        "acked-through-ignored",
        "a consumer created again whose ack floor is not below the one seen is read on though "
        "a query on an earlier checkpoint acked messages above that floor, whose entries the "
        "give-back to this query removed: the new one delivered them again (seed 11950 of the "
        "worlds with a consumer created again: 4-6 emitted after 12, and by two checkpoints)",
        (
            Patch(
                CONSUMER_CHECKS,
                "            earlier = self.marks(stream, name)\n",
                "            earlier = frozenset()\n",
            ),
        ),
        # Its hole needs acks lost below what a query acked, then a new checkpoint's give-back,
        # then the creation again: the first three rounds of acks each followed by a restart,
        # half the runs on a new checkpoint, no purges, Spark 4.0/4.1 (which plans a new
        # checkpoint's first batch in the stored lineage).
        edit=(
            ("recreate_consumer", True),
            ("restart_after_acks", 1.0),
            ("new_checkpoint", 0.5),
            ("purges", False),
            SPARK_40,
        ),
    ),
    Mutant(
        "acked-through-in-memory-only",
        "what a give-back removes of entries that had acked is not written to the pointer "
        "before the removal, only kept in the driver's memory until its next pointer write: a "
        "run that failed on its sink, or a driver that died, after its give-back and before "
        "that write left no trace of it, and a later run read on a consumer created again below "
        "it (seed 5265 of the worlds with a consumer created again, new checkpoints and failing "
        "sink writes: 2 emitted after 4, and by two checkpoints; 150 and 247 of helper-63's "
        "worlds, a driver that died there, once the mark was written at stop)",
        (
            Patch(
                DRIVER_LEDGER,
                "        if self.seen.stored_acked_earlier() != self.stored_marks:\n"
                "            await self.save_pointer()\n",
                "        return\n",
            ),
        ),
        # Its hole needs acks lost below what a query acked (a restart after every round of
        # acks, up to 10), a new checkpoint's run that fails on its sink after its give-back
        # (new checkpoints at 70% of the runs, half the sink's writes failing), and the
        # consumer created again under a checkpoint that goes on: a 30 s wait, 30 messages, a
        # look every 10 s, no purges, a partition each (per-key order is checked without
        # siblings). 4 of 0-999 catch it so (2026-12-01; 5265, which found the hole, was the
        # only one of 0-5999 with new checkpoints at half the runs and a fifth of the sink's
        # writes failing).
        edit=ACKS_LOST_UNDER_NEW_CHECKPOINTS,
    ),
    Mutant(
        "found-consumer-drops-acked-marks",
        "a consumer a driver found as it is (its target's first resolve) dropped the marks of "
        "what a query on an earlier checkpoint acked that its floor passed, before it was judged: "
        "a restarted checkpoint's driver on 4.2+ takes the checkpoint's sighting only after, and "
        "then refused the consumer created where a task's refusal had said (past the marks) as "
        "starting past a message never read, advising a start before them (seed 2550 of the "
        "worlds whose operator follows the advice)",
        (Patch(CONSUMER_CHECKS, "        if not placed:\n            return\n", ""),),
        edit=ADVICE_AFTER_LOST_ACKS,
    ),
    Mutant(
        "refusal-advises-past-the-batch",
        "a refusal of a consumer created again advised the start right after what the query and "
        "an earlier checkpoint's query acked, past what the refused batch held (taken from the "
        "new consumer): a consumer created there took those as acked, a purge of what it acked "
        "took them, and the batch failed on DataLoss at every run again (seed 2550 of the "
        "worlds whose operator follows the advice)",
        (
            Patch(
                SLOT_ENTRY,
                "        if not self.partition.siblings:\n            return set(self.taken)\n"
                "        return self.taken | await self.recorded_by_siblings()\n",
                "        return set()\n",
            ),
        ),
        edit=ADVICE_AFTER_LOST_ACKS,
    ),
    Mutant(
        "marks-the-batch-holds-refused",
        "a consumer created again below what a query on an earlier checkpoint acked was refused "
        "even where the batch run again held those messages (its entries drop the consumer's "
        "deliveries of them): the refusal's advice, the first message that batch held, was "
        "refused again (seed 2550 of the worlds whose operator follows the advice; a static "
        "group's consumer placed there by `startingPosition` too, not simulated)",
        (
            Patch(
                CONSUMER_CHECKS,
                "max((s for s in acked_earlier if s not in held), default=0)",
                "max(acked_earlier, default=0)",
            ),
        ),
        edit=ADVICE_AFTER_LOST_ACKS,
    ),
    Mutant(
        "other-subjects-counted-unread",
        "a consumer created again was judged against every message between the floors the query "
        "had not committed, another partition's too (not committed yet, or its entry settled "
        "and removed), which its filter does not match: it was refused as starting past a "
        "message never read, and the advice, a start before it, cannot bring it (seeds 46, 97, "
        "147 and 11 more of 0-1000 of the worlds whose operator follows the advice)",
        (
            Patch(
                BATCH_COORDINATOR,
                "lost_ok, own_from, replayed=",
                "lost_ok, replayed=",
            ),
        ),
        edit=(("recreate_consumer", True), ("follows_advice", True)),
    ),
    Mutant(
        "forgotten-pull-dates-late-deliveries",
        "a pull request a restart of the server forgot (never ended) stayed among those whose "
        "end has not come, and dated every later late delivery of its consumer from its making: "
        "a give-back skipped their NAKs as maybe run out, and they waited out their ack wait "
        "behind newer messages of their keys (seed 1656 of helper-69's worlds of dying drivers: "
        "2 after 4). The client sees it on reconnecting, a standalone server of another id "
        "(`PullInbox`); the world's client, as `SimPullConsumer.requested_since`",
        (
            Patch(
                SIM_JETSTREAM,
                "(r.status is None and not r.dropped) or r.delivered",
                "r.status is None or r.delivered",
            ),
        ),
        # Its hole needs a pull out at a restart (a restart after every round of acks, up to
        # 10), a later give-back of late deliveries (the consumer created again, new
        # checkpoints at 70% of the runs, half the sink's writes failing, drivers dying), more
        # than half a 30 s wait after it: helper-69's world of 1656.
        edit=(*ACKS_LOST_UNDER_NEW_CHECKPOINTS, ("chaos", Chaos(driver_crash=0.1, crashes=6))),
    ),
    Mutant(
        "advice-delivers-marks-again",
        "a refusal's advice, bounded by the first message the batch run again holds, lay below "
        "what a query on an earlier checkpoint acked that nothing of this query held: the "
        "consumer created there delivers that again, and was refused with the same advice, for "
        "ever (seed 8 of the worlds whose operator follows the advice, after lost acks)",
        (
            Patch(
                SLOT_PARTITION,
                "        again = sorted(\n"
                "            seq for seq in self.acked_earlier if seq >= first and seq not in "
                "replayed | set(held)\n"
                "        )\n",
                "        again: list[int] = []\n",
            ),
        ),
        edit=ADVICE_AFTER_LOST_ACKS,
    ),
    Mutant(
        "consumer-judged-before-the-checkpoint-is-told",
        "Spark 4.0/4.1's availableNow run asks latestOffset() before setLatestSeenOffset: its "
        "driver judged a consumer created again knowing neither what the query committed nor "
        "what the batch it runs again holds, refused the one created where a task's refusal "
        "said for marks that batch held, and advised a start past the batch, which a purge "
        "then took (seeds 42, 280, 614 of the worlds whose operator follows the advice, after "
        "lost acks)",
        (
            Patch(
                BATCH_COORDINATOR,
                "        told = start is not None or self.current is not None",
                "        told = True",
            ),
        ),
        edit=ADVICE_AFTER_LOST_ACKS,
    ),
    Mutant(
        "refusal-before-the-give-back-knows-no-marks",
        "a 4.0/4.1 availableNow run on a new checkpoint judges a consumer created again at its "
        "reportLatestOffset(), before its first batch gives back what an earlier checkpoint's "
        "query acked in the lineage: its advice started below those marks, and the first "
        "batch after the give-back refused the consumer created there again (seed 767 of the "
        "worlds whose operator follows the advice: --deliver 5, then --deliver 7)",
        (
            Patch(
                BATCH_COORDINATOR,
                "        seen.expect_given_back(await self.ledger.earlier_acked())\n",
                "",
            ),
        ),
        edit=(("recreate_consumer", True), ("follows_advice", True)),
    ),
    Mutant(
        "marks-of-acks-a-new-consumer-ignored",
        "a new checkpoint kept as acked by an earlier checkpoint's query what an entry marked "
        "ACKED held though no look showed its acks reached the consumer that delivered it: the "
        "task acked 12-13 of a committed batch 9 ms after the consumer was created again, which "
        "ignored them, and the advice (--deliver 14) skipped what the server never had acked "
        "(seed 1586 of the worlds whose operator follows the advice; helper-87)",
        (
            Patch(
                DRIVER_LEDGER,
                "            through = self.seen.marks_known_taken_through("
                "key, earlier.get(key))\n",
                "            through = None\n",
            ),
        ),
        edit=(("recreate_consumer", True), ("follows_advice", True)),
    ),
    Mutant(
        "given-back-entries-held-before-the-give-back",
        "a look before a new checkpoint's give-back counted the ACKED entries an earlier "
        "checkpoint's query left in the lineage as held by this query: a consumer created again "
        "where that query's sighting left it, below what it acked, was read on, and delivered "
        "that again once the give-back removed the entries (helper-86, with 767's fix)",
        (
            Patch(
                DRIVER_LEDGER,
                "            if self.earlier_checkpoint_left and protocol.known_acked(head):\n"
                "                continue  # an earlier checkpoint's query's, given back before "
                "this one reads\n",
                "",
            ),
        ),
        edit=(("recreate_consumer", True), ("follows_advice", True)),
    ),
    Mutant(
        "packed-slots-out-of-order",
        "a task of packed slots emits each slot's rows whole, but not in the packed order (the "
        "last slot running first): the order a re-run must keep (the nats sink's ids are "
        "batch/partition/row) is no longer the one the offset fixes",
        (
            Patch(
                SLOT_READER,
                "            emitting = ahead[0]\n",
                "            emitting = ahead[-1]\n",
            ),
        ),
        packed=True,
    ),
)
BY_NAME = {mutant.name: mutant for mutant in MUTANTS}


class MutantMisfit(Exception):
    """A mutant's snippet is not in its module exactly once: the code moved."""


def patched(source: str, mutant: Mutant, module: str) -> str:
    """`source` of `module` with `mutant`'s patches of it applied."""
    for patch in mutant.patches:
        if patch.module != module:
            continue
        found = source.count(patch.old)
        if found != 1:
            first = patch.old.strip().splitlines()[0]
            raise MutantMisfit(
                f"mutant {mutant.name}: {module} holds {first!r} {found} times, not once; "
                "the code moved: update the mutant's patch in tests/simulation/mutants.py"
            )
        source = source.replace(patch.old, patch.new)
    return source


def modules(mutant: Mutant) -> list[str]:
    return sorted({patch.module for patch in mutant.patches})


def misfits(mutants: Iterable[Mutant] = MUTANTS) -> list[str]:
    """Every mutant's misfit patches, read from the source files (nothing is compiled)."""
    found = []
    for mutant in mutants:
        for module in modules(mutant):
            try:
                spec = importlib.util.find_spec(module)
            except ModuleNotFoundError:  # its package is gone
                spec = None
            if spec is None or spec.origin is None:
                found.append(f"mutant {mutant.name}: no module {module}: update its patches")
                continue
            with open(spec.origin, encoding="utf-8") as file:
                try:
                    patched(file.read(), mutant, module)
                except MutantMisfit as error:
                    found.append(str(error))
    return found


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds the mutant's modules as the path finder does, with a loader that patches them."""

    def __init__(self, mutant: Mutant) -> None:
        self.mutant = mutant
        self.modules = set(modules(mutant))

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        assert spec is not None and spec.origin is not None
        spec.loader = _PatchingLoader(fullname, spec.origin, self.mutant)
        return spec


class _PatchingLoader(importlib.machinery.SourceFileLoader):
    """Compiles the patched source, never the cached bytecode (nor does it cache its own)."""

    def __init__(self, fullname: str, path: str, mutant: Mutant) -> None:
        super().__init__(fullname, path)
        self.mutant = mutant

    def get_code(self, fullname: str) -> CodeType:
        source = self.get_source(fullname)
        assert source is not None
        return compile(patched(source, self.mutant, fullname), self.path, "exec")


def install(mutant: Mutant) -> None:
    """Patch `mutant`'s modules as they are imported (in a process that has not imported them)
    and import them now, so that every patch is applied or fails here."""
    imported = [module for module in modules(mutant) if module in sys.modules]
    assert not imported, f"mutant {mutant.name}: {imported} imported before its patches"
    sys.meta_path.insert(0, _PatchingFinder(mutant))
    for module in modules(mutant):
        importlib.import_module(module)


@dataclass
class Found:
    """What a search of a mutant's seeds found."""

    name: str
    failures: list[tuple[int, str]] = field(default_factory=list)  # (seed, first problem)
    ran: int = 0  # schedules run
    seconds: float = 0.0  # their CPU time (the processes' own)
    unmutated: list[int] = field(default_factory=list)  # failing seeds that fail unmutated too
    last: int | None = None  # the last seed run


def search(mutant: Mutant, seeds: Sequence[int], first: int | None) -> Found:
    """In a fresh process: run `seeds` under `mutant` (in its worlds: `--world` hands over a
    copy with another edit), stopping at the `first` failures."""
    started = time.process_time()
    install(mutant)
    from tests.simulation.world import run_schedule  # after the patches, which it may import

    found = Found(mutant.name)
    for seed in seeds:
        found.ran += 1
        found.last = seed
        problems = run_schedule(seed, **world(mutant)).problems
        if problems:
            found.failures.append((seed, problems[0]))
            if first is not None and len(found.failures) >= first:
                break
    found.seconds = time.process_time() - started
    return found


class Unmutated:
    """Whether a seed breaks a guarantee without any mutant (run here, in the process that
    never installs one): such a seed catches nothing."""

    def __init__(self) -> None:
        self.known: dict[tuple[int, str], bool] = {}

    def fails(self, seed: int, mutant: Mutant) -> bool:
        key = (seed, repr(world(mutant)))
        if key not in self.known:
            from tests.simulation.world import run_schedule

            self.known[key] = bool(run_schedule(seed, **world(mutant)).problems)
        return self.known[key]


def world(mutant: Mutant) -> dict[str, Any]:
    """What the mutant's schedules run under, beyond what their seeds draw."""
    under: dict[str, Any] = {"shared": True} if mutant.shared else {}
    under |= dict(mutant.edit)
    under |= {"packed": True} if mutant.packed else {}
    return under | ({"speculation": SPECULATION} if mutant.speculation else {})


# The third-party modules the world imports, none of which imports a module a mutant patches:
# the fresh processes fork from a server that imported them once, instead of each importing
# them again (about 0.5 s of CPU per mutant, most of what a mutant caught early costs). With
# them, the project's modules that import no patched module (`unpatched_imports`): another
# 0.3 s of the 0.5 s a mutant's process took to import the world.
PRELOADED = ("numpy", "pyarrow", "pyarrow.compute", "pyspark.sql", "nats")
PROJECT = ("nats_spark", "tests")
ROOT = Path(__file__).resolve().parents[2]  # the checkout: where the project's packages are


def _source_of(name: str) -> Path | None:
    """The source file of the project's module `name`, or None when it is not one."""
    if name.split(".")[0] not in PROJECT:
        return None
    path = ROOT.joinpath(*name.split("."))
    for source in (path.with_suffix(".py"), path / "__init__.py"):
        if source.is_file():
            return source
    return None


def _imported_by(name: str) -> set[str]:
    """The project's modules (and their packages) that module `name`'s source imports anywhere
    in it (in functions too: such a module may import them at any time)."""
    source = _source_of(name)
    if source is None:
        return set()
    tree = ast.parse(source.read_text(encoding="utf-8"))
    package = name if source.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: package.count(".") + 2 - node.level]
                base = ".".join([*parts, *([base] if base else [])])
            named |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return {
        module
        for dotted in named
        for module in _packages_and_self(dotted)
        if _source_of(module) is not None
    }


def _packages_and_self(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def unpatched_imports(root: str = "tests.simulation.world") -> list[str]:
    """The project's modules `root` imports, directly or not, that import no module any
    mutant patches (read from their source, nothing is imported): safe to import before
    a mutant's patches."""
    graph: dict[str, set[str]] = {}
    waiting = [root]
    while waiting:
        name = waiting.pop()
        if name not in graph:
            graph[name] = _imported_by(name) | set(_packages_and_self(name)[:-1])
            waiting += graph[name]
    unsafe = {patch.module for mutant in MUTANTS for patch in mutant.patches}
    while grown := {name for name, imports in graph.items() if imports & unsafe} - unsafe:
        unsafe |= grown
    return sorted(set(graph) - unsafe)


def hunt(
    searches: Sequence[tuple[Mutant, Sequence[int]]], jobs: int, first: int | None = None
) -> Iterator[Found]:
    """Search each mutant over its seeds (its `first` failures, or all) in fresh processes
    (forked from a server that imported only `PRELOADED` and `unpatched_imports`, so nothing
    of the patched code is imported before its patches), in order; a mutant's seeds are split
    in contiguous parts when there are more processes than mutants. A failing seed that fails
    unmutated too is left out (and searched past)."""
    count = max(1, math.ceil(jobs / len(searches)))
    unmutated = Unmutated()
    fresh = multiprocessing.get_context("forkserver")
    fresh.set_forkserver_preload([*PRELOADED, *unpatched_imports()])
    with ProcessPoolExecutor(jobs, mp_context=fresh, max_tasks_per_child=1) as pool:
        runs = []
        for mutant, seeds in searches:
            size = max(1, math.ceil(len(seeds) / count))
            parts = [seeds[i : i + size] for i in range(0, len(seeds), size)]
            runs.append([(part, pool.submit(search, mutant, part, first)) for part in parts])
        for (mutant, _), parts_run in zip(searches, runs, strict=True):
            found = Found(mutant.name)
            for part, future in parts_run:
                need = first
                while True:  # a part, and what is left of it past failures that fail unmutated
                    result = future.result()
                    found.ran += result.ran
                    found.seconds += result.seconds
                    also = [seed for seed, _ in result.failures if unmutated.fails(seed, mutant)]
                    found.unmutated += also
                    found.failures += [f for f in result.failures if f[0] not in also]
                    if need is None or not also or result.last == part[-1]:
                        break  # all run, or stopped at `need` failures that catch it
                    need -= len(result.failures) - len(also)
                    part = part[part.index(result.last) + 1 :]
                    future = pool.submit(search, mutant, part, need)
            found.failures = found.failures[:first]
            yield found


def summary(found: Found, shown: int = 5) -> str:
    mutant = BY_NAME[found.name]
    if not found.failures:
        line = f"SURVIVED {mutant.name}: {found.ran} seeds, {found.seconds:.1f}s\n  {mutant.hole}"
    else:
        seeds = ", ".join(str(seed) for seed, _ in found.failures[:shown])
        line = (
            f"caught {mutant.name}: {len(found.failures)} failing of {found.ran} seeds run "
            f"(first: {seeds}); {found.seconds:.1f}s\n  seed {found.failures[0][0]}: "
            f"{found.failures[0][1]}"
        )
    if found.unmutated:
        line += f"\n  left out, as they fail unmutated too: seeds {found.unmutated}"
    return line


def world_edit(text: str) -> tuple[str, object]:
    """`FIELD=VALUE` of `--world`: a Setup field and a Python literal."""
    name, _, value = text.partition("=")
    return name, ast.literal_eval(value)


def main() -> int:
    from tests.simulation.__main__ import seed_range  # here: it imports the unpatched code

    parser = argparse.ArgumentParser(
        prog="python -m tests.simulation.mutants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=seed_range, default=range(0, 2000), help="e.g. 0-1999")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--only", action="append", choices=BY_NAME, help="this mutant only")
    parser.add_argument("--first", type=int, help="stop a mutant at its first K failing seeds")
    parser.add_argument(
        "--world",
        action="append",
        type=world_edit,
        default=[],
        metavar="FIELD=VALUE",
        help="search in this family of worlds instead of the mutant's own edit (e.g. "
        "dying_zombies=True new_checkpoint=0.5), to find seeds for its `edit`",
    )
    args = parser.parse_args()
    wrong = misfits()
    if wrong:
        print("\n".join(wrong))
        return 1
    chosen = [BY_NAME[name] for name in args.only] if args.only else list(MUTANTS)
    if args.world:
        chosen = [dataclasses.replace(mutant, edit=tuple(args.world)) for mutant in chosen]
    started = time.monotonic()
    results = []
    for found in hunt([(mutant, args.seeds) for mutant in chosen], args.jobs, args.first):
        print(summary(found), flush=True)
        results.append(found)
    survived = [found.name for found in results if not found.failures]
    unmutated = sorted({seed for found in results for seed in found.unmutated})
    if unmutated:
        print(f"seeds that break a guarantee without any mutant, to look at: {unmutated}")
    print(
        f"{len(results)} mutants over seeds {args.seeds.start}-{args.seeds.stop - 1}: "
        f"{len(results) - len(survived)} caught, {len(survived)} survived; "
        f"{time.monotonic() - started:.1f}s"
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
