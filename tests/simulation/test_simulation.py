"""The ack-ledger simulation in the unit lane: a range of seeded schedules must keep every
guarantee (see tests/simulation/world.py); `make simulate SEEDS=...` runs longer ranges."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.simulation.mutants import (
    ADVICE_AFTER_LOST_ACKS,
    BY_NAME,
    REDELIVERED_TO_STOPPED_QUERIES,
    ROOT,
    SPECULATION,
    world,
)
from tests.simulation.scheduler import Chaos, Crashed, Scheduler, run
from tests.simulation.spark import counted_by_spark
from tests.simulation.world import GONE_UNREAD, Result, run_schedule, run_schedules

pytestmark = pytest.mark.unit

JOBS = len(os.sched_getaffinity(0))  # schedules are pure Python: one process per core


@dataclass(frozen=True)
class Share:
    """Seeds of the three kinds of worlds: drawn (as a user's), with spark.speculation on (a copy
    beside nearly every task attempt), and with both slots packed into one task."""

    drawn: range
    speculation: range
    packed: range


# Mutants must be caught in seeds 0-1999 (of the worlds they run in). `make test` explores seeds
# 0-1399 of the drawn worlds, 0-259 of worlds with pausing executors, 0-39 under speculation and
# 0-199 packed: `make check` runs the first share, within its minute; the main lane runs the
# rest (test_exploration.py). `make simulate` runs longer ranges.
SEEDS = range(0, 2000)
CHECK = Share(drawn=range(0, 260), speculation=range(0, 10), packed=range(0, 40))
EXPLORED = Share(drawn=range(260, 1400), speculation=range(10, 40), packed=range(40, 200))
# Worlds whose consumer an operator deletes and creates again while a query runs
# (`recreate_consumer`; each ends at the source's refusal): the first share here, the rest in
# the main lane.
RECREATED_CHECK, RECREATED_EXPLORED = range(0, 40), range(40, 400)
# Worlds whose executors pause, shortly and for ack waits (`stalling_executors`: Spark loses
# such an attempt, which runs on once its batch settled or its query was given back), in place
# of as many drawn ones (they cost the same): the first share here, the rest in the main lane.
STALLING_CHECK, STALLING_EXPLORED = range(0, 40), range(40, 260)
# Worlds where another client reads the query's overflow consumer and acks what it takes
# (`other_client`): the first share here, the rest in the main lane.
OTHER_CLIENT_CHECK, OTHER_CLIENT_EXPLORED = range(0, 20), range(20, 260)
# Worlds whose query is stopped mid-batch and replaced at once by one on a new checkpoint
# (`replaced_mid_batch`): the first share here, the rest in the main lane.
REPLACED_CHECK, REPLACED_EXPLORED = range(0, 20), range(20, 200)
# Worlds whose server restarts bring back ledger keys it had removed (`removals_return`): the
# first share here, the rest in the main lane.
RETURNING_CHECK, RETURNING_EXPLORED = range(0, 20), range(20, 300)
# Worlds on nats-server 2.11-2.12, whose new consumers report their ack floor as 0 until an ack
# (`floor_from_zero`), each consumer created again: here only (400 of them kept every guarantee
# on 2026-11-30).
FLOOR_FROM_ZERO_CHECK = range(0, 20)
# Worlds whose operator, when the query refuses a consumer created again, creates it where the
# refusal says and restarts the query (`follows_advice`): the first share here, the rest in the
# main lane.
ADVICE_CHECK, ADVICE_EXPLORED = range(0, 20), range(20, 300)

# Seeds of a longer range that found a hole since closed (with what they ran under): each must
# keep every guarantee. A change of the schedules makes them other schedules; the holes found
# before are kept as mutants (mutants.py, test_mutants.py), which do not depend on seeds.
# Another client of the overflow consumer, a job reading a batch's tasks first (Spark stops them
# after their first rows), one message a pull, a 4 s wait, ledger answers up to 0.4 s.
SLOW_LEDGER_EARLY_STOPS: dict[str, Any] = {
    "other_client": True,
    "early_stops": True,
    "messages": 30,
    "per_batch": 50,
    "fetch_batch": 1,
    "ack_wait": 4.0,
    "slow_ledger": 0.1,
}
CLOSED_HOLES: dict[int, tuple[dict[str, Any], str]] = {
    723: (
        SLOW_LEDGER_EARLY_STOPS,
        "attempt b1/c#1#early recorded 11 and 12 (10.8), stalled 3.8 s in a head write (4 s "
        "wait), took both again (15.4), and Spark closed it (17.5): it NAKed them before its "
        "release (18.05); the full read's retry took the entry over and committed them, and the "
        "other client took 12 from the redelivery queue (20.76). The release now decides: "
        "landed, their wait is restarted and the taker keeps them (found by helper-68, fixed by "
        "helper-72, 2026-12-01)",
    ),
    # Found on ledger format 3's schedules in 723's world; closed by helper-79 (2026-12-01).
    **dict.fromkeys(
        (280, 735),
        (
            SLOW_LEDGER_EARLY_STOPS,
            "the late taker: Spark closed an early job's attempt, whose release restarted what "
            "it recorded and landed (735: 23-25 at 26.86), while the job's other task ran on "
            "past the 4 s wait (to 32.15); the other client got 24 and 25 (31.70) before the "
            "full read's attempt took the entry over and committed them. The driver's keeper "
            "keeps a released entry until it is taken over",
        ),
    ),
    # Found by helper-69 in a world of dying drivers, a server restart after every round of
    # acks and a consumer created again; explained by helper-75,
    # closed by helper-76 (2026-12-01).
    1656: (
        {
            "recreate_consumer": True,
            "shared": False,
            "purges": False,
            "messages": 30,
            "ack_wait": 30.0,
            "new_checkpoint": 0.7,
            "sink_failure": 0.5,
            "restart_after_acks": 1.0,
            "server_restarts": 10,
            "trigger_interval": 10.0,
            "chaos": Chaos(driver_crash=0.1, crashes=6),
        },
        "per-key order: attempt b2/partition-0#0 of a stopped run had a pull out (made at "
        "149.99) when the server restarted and forgot it: its end never came, and a request the "
        "client gave up on stayed among those whose end has not come. Its consumer created "
        "again, its pulls at 164.99 got 1, which the acceptance refused (ConfigurationError), "
        "and, sent ahead, 2: the give-back dated 2 from that forgotten request's making, 16 s "
        "before, over half the 30 s wait, and skipped its NAK; 2 came after 4. Closed: a "
        "request a restart forgot leaves `requested_since` once what came before the restart "
        "was taken from the inbox (`PullInbox`: the connection to a standalone server lost with "
        "every request written, then made to a server of another id; `SimPullConsumer`: a "
        "dropped request once what it delivered was taken)",
    ),
    851: (
        {"other_client": True, "stalling_executors": True, "ack_wait": 4.0},
        "attempt b3/c#1#0 recorded message 13 (12.93), Spark lost it and it stalled 6.3 s; the "
        "wait ran out (16.93) and the retry took the entry over (19.26); the zombie woke, its "
        "pull got the redelivery (19.486), its write failed, and it gave back the recorded "
        "message that came again: the -NAK handed it to the other client (19.738), and batch 3 "
        "committed it from the retry's entry (21.46). An attempt that lost its entry to another "
        "attempt now leaves what it recorded to the taker's keeper (`kept_by_its_taker`)",
    ),
    1347: (
        {"other_client": True, "stalling_executors": True},
        "attempt b1/c#1#1 took message 13 (10.89) and stalled 10.1 s, Spark lost it; its wait "
        "ran out (14.89), the retry b1/c#1#2 took the redelivery (16.71), recorded and sealed "
        "it, batch 1 committed it (17.99) and the driver's keeper held it; the zombie woke "
        "(21.0), its write failed on the entry taken over, and it gave back what it held "
        "unrecorded: its -NAK of the stale delivery (nats-server's processNak matches the "
        "stream sequence, and the consumer sequence was above the ack floor's) gave back the "
        "retry's, and the other client got 13 at once (22.03) while the query lived. Closed: "
        "a give-back NAKs only deliveries whose wait surely runs (`surely_running`: more than "
        "half of it left, from their request or from a keeper's round that surely restarted "
        "it; a round after the wait may have run out restarts another reader's delivery)",
    ),
    689: (
        {"other_client": True, "stalling_executors": True},
        "the same on 4.2+ before the commit: zombie b4/c#1#0's -NAK (31.74) of message 21, "
        "whose delivery ran out while it stalled, gave back the delivery b4/c#1#1 had "
        "recorded; the other client took it (33.34), and batch 4 committed it from the entry",
    ),
    137: (
        {"removals_return": True},
        "a server restart brought back entries of a replaced lineage without their chunks; "
        "every later start failed giving them back (it reads what to NAK), so messages 8-12 "
        "were never read (2026-11-30, the first seeds of the worlds whose removals return)",
    ),
    184: (
        {"removals_return": True},
        "entries of settled batches came back without their chunks: the restarted query's "
        "tasks failed reading them at every start and left messages 7 and 10 unacked, as "
        "chaos/run.py --seed 3030 did to 36 batches (2026-11-30)",
    ),
    247: (
        {"removals_return": True},
        "Spark 4.0/4.1, whose new checkpoints go on in the lineage: a restart brought back a "
        "sealed entry of gen 5 (the earlier checkpoint's, given back) with its chunk, and the "
        "next batch's task acked messages 3 and 5 as the query's own, though the new "
        "checkpoint had not committed 5 (2026-11-30: removed again at adopt, unread)",
    ),
    13576: (
        {"replaced_mid_batch": True},
        "an attempt of the stopped query wrote its record of message 7, whose answer came as a "
        "conflict; the new checkpoint's give-back took the entry by rewriting its head as it "
        "was, the attempt read it back as its own write and recorded on after the give-back's "
        "read: 7, removed un-NAKed, came after 8 (2026-11-30: the give-back rewrites the head "
        "under a holder no attempt is)",
    ),
    3182: (
        {"replaced_mid_batch": True},
        "an attempt of the stopped query recorded messages 5 and 8 and crashed; the new "
        "checkpoint's first batch (4.0/4.1) fenced their gen, its listing stalled, and the "
        "attempt's retry took the entry over, found the fence and removed it: nothing NAKed 5, "
        "which came after 9 and 10 of its key (2026-11-30: a fenced take-over leaves an entry "
        "that holds deliveries to the give-back)",
    ),
    139: (
        {"recreate_consumer": True},
        "a new checkpoint's first batch ran again after a failure: Spark 4.2+ asked "
        "`initialOffset` first, which began another lineage, and the batch's offset took the "
        "first up again, whose consumers as last seen the pointer no longer held; a consumer "
        "created again while the batch ran was read from its start, and messages 1, 2 and 4 "
        "came after 5 and 10 (2026-11-30: the pointer keeps a replaced lineage's consumers)",
    ),
    632: (
        {"recreate_consumer": True},
        "Spark 4.0/4.1: batch 1's first run died after slot c#0 sealed message 1 of the shared "
        "consumer; the consumer was deleted and created again (DeliverAll) while the restarted "
        "driver stalled, and it took the new one (acked nothing yet, as the old one), so the "
        "tasks of batch 1, run again, saw the new one: c#1 took its first delivery, 1 again, "
        "above the consumer sequence seen, without looking at its sibling's record, and batch "
        "1 emitted 1 twice (2026-11-30: the driver tells a batch it runs again that its "
        "consumer started over since its planning, and its slots check every delivery)",
    ),
    1650: (
        {"recreate_consumer": True},
        "as 632 on 4.2+: the consumer was created again (after a purge through 8) while batch 6 "
        "ran, c#1's task stopped on it and the driver died; the restarted one took the new "
        "consumer (it skipped only what the query committed) and ran batch 6 again, whose c#1 "
        "took the new one's first delivery of 9, which c#0 had sealed in the first run",
    ),
    3191: (
        {"recreate_consumer": True},
        "as 1650: c#0 sealed message 1 in batch 1's first run, the consumer was created again "
        "while that driver stalled, and in the run after its death c#1 took the new one's first "
        "delivery of 1 (the third of 400-6000 of these worlds that broke on it)",
    ),
    6791: (
        {"recreate_consumer": True},
        "as 1650, seen by two looks: c#0 sealed message 4 in batch 2's first run; the next "
        "driver looked at the consumer for batch 2's run again at 121.4, once per slot: c#0's "
        "look got the old one at once, c#1's stalled 31 s, across its deletion and creation "
        "again (DeliverAll, from 4 after purges) at 140.9, and got the new one. Taken as "
        "created again only since the driver's own look, batch 2 was not told, and c#1 took "
        "the new one's first delivery of 4 (2026-11-30: any look before the driver hands out "
        "its first batch takes the consumer as started over since the pointer's sighting)",
    ),
    11950: (
        {"recreate_consumer": True},
        "server restarts lost the acks of 1-3 while run 3 acked 4-8 (floor 0); run 4, on a new "
        "checkpoint, gave run 3's entries back; the consumer was created again (DeliverAll) "
        "as run 5's look was answered, its floor 0 not below the one seen, and read on: 4-6 "
        "emitted after 12. The give-back now marks what acked entries held above the floor "
        "(8, kept in the pointer), and a consumer created again below the mark is refused "
        "(mutant acked-through-ignored; 2026-11-30)",
    ),
    230: (
        {"other_client": True},
        "a batch re-run after a restart came without a `latestOffset` before it, so the "
        "driver's keeper did not run: a retry of one of its tasks stalled 3.7 s, and the "
        "sealed entry of the other task waited unkept past its 4 s ack wait, while the query "
        "lived; another client of the overflow consumer took message 15, which the batch then "
        "committed (2026-11-30: the keeper starts in `partitions` too)",
    ),
    9129: (
        {"stalling_executors": True},
        "siblings: a task paused 38 s between the server's send of message 18 and its take; a "
        "sibling took 18's redelivery meanwhile; on waking the keeper renewed at once, and the "
        "renewal, after the take, was taken to cover 18: not checked against the sibling's "
        "records, it was emitted twice (a renewal covers rows only within their ack wait now)",
    ),
    7130: (
        {"stalling_executors": True, "new_checkpoint": 0.5},
        "the simulation's own hole: its watch of an attempt's writes refused the rewrite of a "
        "slot that dropped what a sibling took too, so that path was never explored",
    ),
    8787: (
        {"replaced_mid_batch": True},
        "a query on a new checkpoint gave back the batch holding messages 4-6, acked already; "
        "its driver saw the consumer's ack floor at 6, then a server restart lost those acks and "
        "4 came back: no batch of the query held it, and the task refused it as a new "
        "consumer's, failing the query (14594 likewise; the consumer's creation time, "
        "unchanged, now tells a lost ack from a new consumer; on the schedules before claims "
        "created first)",
    ),
    3819: (
        {"replaced_mid_batch": True, "shared": False},
        "a stopped query's attempt pulled message 11, and its acceptance's dedupe read failed on "
        "an entry the new checkpoint gave back meanwhile (its chunk missing): the keeper never "
        "held 11, so the attempt's give-back left it to its ack wait, after newer messages of "
        "its key (the chunk whose acceptance failed is given back whole now)",
    ),
    2306: (
        {"replaced_mid_batch": True},
        "a give-back NAKed what a stopped query's attempt had recorded; one came back to a pull "
        "the attempt still had out as its next write failed on the removed entry, and the "
        "attempt, giving back what came late, kept it as its own: it waited out its ack wait "
        "after newer messages of its key (late deliveries are all given back now)",
    ),
    14: (
        {"replaced_mid_batch": True},
        "an attempt of the stopped query wrote a chunk, found its head write failing on the "
        "given-back entry and was killed before it removed the chunk, which no head named (98 "
        "and 107 of 0-1500 likewise; the driver that adopts a lineage removes such chunks now)",
    ),
    7492: (
        {"shared": True},
        "a new checkpoint's first batch (4.0/4.1) gave back the earlier gens' entries the driver "
        "had adopted, missing one a zombie of the earlier query created in between: its message "
        "was held for good (the entries are now listed after the fence)",
    ),
    5024: (
        {},
        "a driver killed while the harness slept on its behalf woke and had its batch observed in "
        "the next checkpoint's run (the harness's own hole)",
    ),
    36833: (
        {},
        "a driver killed amid a give-back left a message to its ack wait, after newer ones of its "
        "key (the README's second exception, which the check now explains)",
    ),
    482: (
        {},
        "a server restart lost the acks of a committed batch, and a new checkpoint started "
        "before their redelivery: its give-back skipped the acked entry, and the message came "
        "back after newer ones of its key (the give-back now NAKs acked entries too)",
    ),
    676: (
        {},
        "a task attempt of a replaced query, stalled before its create, created an entry of a "
        "lineage the new checkpoint had already given back, which stayed (4.2+; the pointer now "
        "keeps the lineages given back, and such an attempt removes its entry and stops)",
    ),
    1494: (
        {},
        "a give-back's -NAK named an entry's older delivery of a message delivered again "
        "since, at or below the ack floor's consumer sequence, which nats-server ignores "
        "(`processNak`): the message waited out its ack wait behind newer ones of its key (the "
        "give-back now NAKs with the consumer's last delivery's sequence; 1571, 3433 and 3992 "
        "likewise, on the schedules of 2026-11-28)",
    ),
    3433: (
        {},
        "a give-back's -NAK named an entry's older delivery, at or below the ack floor's "
        "consumer sequence, which nats-server ignores: key order broke (the give-back now NAKs "
        "with the consumer's last delivery's sequence; the mutant "
        "give-back-naks-the-recorded-delivery breaks it again)",
    ),
    39465: (
        {},
        "a give-back read an open entry while a task attempt of the earlier query still recorded "
        "in it: what it recorded after the read waited out its ack wait, behind newer messages "
        "of its key (the give-back now takes the entry from the attempt first)",
    ),
    1132: (
        {},
        "a new checkpoint's give-back (4.0/4.1) of an earlier query's entries, one of them "
        "created by an attempt that took nothing, failed on that one after it had removed "
        "them all and before it NAKed a message: those of another entry came back after newer "
        "ones of their key (the give-back now skips an entry that took nothing)",
    ),
    1964: (
        {},
        "the quiet run (4.0/4.1, a trigger every 10 s) drained slowly and its limit of 30 ack "
        "waits from its start ended it one trigger before its last batch's acked entries "
        "settled (the harness's own limit: it now counts from the last planned batch)",
    ),
    35: (
        {"recreate_consumer": True},
        "a batch planned before its consumer was deleted and created again read the new one "
        "and emitted what it delivered again from its start (the next planning refused, too "
        "late)",
    ),
    4307: (
        {},
        "as 1132 on 4.2+: the quiet run's give-back failed on an entry that took nothing, and "
        "messages 7 and 8 were never emitted",
    ),
    6024: (
        {"other_client": True},
        "the checker failed the other client for processing a delivery it got before the "
        "query's, once its own ack wait had run out: its doing, now counted apart (2026-11-30)",
    ),
    2766: (
        {"packed": True},
        "the checker failed a per-key order break of the README's first case: an attempt of a "
        "packed task held message 10 of its first slot unrecorded and stalled past its ack "
        "wait (its driver died meanwhile); the next run's retry took that slot's entry over, "
        "and the attempt, awake, handed out the seal; the checker judged its last slot's "
        "entry, never taken over (8306 likewise: the attempt gave 19 and 20 back on waking, "
        "after 26 and 27; 2026-11-30)",
    ),
    16463: (
        {"other_client": True},
        "the checker failed a let-out of the world: an attempt recorded messages 3 and 4 and "
        "was killed with its driver; their waits ran out, the next run's sibling slot got "
        "them and dropped them as its sibling's entry's, and those waits ran out too before "
        "the retry took the entry over (a 4 s ack wait, a 5 s stand-still); the retry "
        "committed them and the other client got them. The checker looked only at the "
        "delivery's holder, the live sibling (2026-11-30)",
    ),
    12503: (
        {"other_client": True},
        "a retry took over an entry whose message 16 had gone, past its ack wait, to a sibling "
        "that dropped it as recorded; the retry sealed without restarting its wait, the "
        "driver's keeper restarted it 0.1 s too late, and the other client got the committed "
        "message (2026-11-30)",
    ),
    21621: (
        {"other_client": True},
        "a retry took over an entry holding message 9, which a sibling had dropped as recorded, "
        "and its whole process stalled past that delivery's wait: the checker blamed the "
        "sibling, not the stalled holder; a retry now keeps what it took over from the "
        "take-over on, and a stall of an attempt whose entry holds a message is let out "
        "(2026-11-30)",
    ),
    782: (
        {"other_client": True, "ack_wait": 4.0},
        "a batch run again after a driver crash was planned before the driver had looked at "
        "the consumer, so its partitions carried the option's 30 s ack wait for the "
        "consumer's 4 s: the retry's keeper renewed every 10 s, message 7 ran out of its wait "
        "while the attempt lived, the other client took it, and batch 1 committed it too; the "
        "driver now looks at every consumer it has not seen before it hands out partitions "
        "(found by the check of a take before the commit, 2026-11-30)",
    ),
    5797: (
        {"other_client": True, "ack_wait": 4.0},
        "a server restart forgot a pull that had delivered message 19, the client waited 5 s "
        "past its expiry, the 4 s wait ran out meanwhile, the other client took it, and batch "
        "6 committed it too; a waiting pull now lasts at most a third of the ack wait and the "
        "client waits at most a sixth past its expiry (found by the check of a take before "
        "the commit, 2026-11-30)",
    ),
    5089: (
        {"other_client": True, "ack_wait": 4.0},
        "the simulated server served a pull request past its expiry, after its client had "
        "given it up: message 18 sat undelivered to the task past its ack wait, the other "
        "client got it, and the task's late collection recorded it for batch 4 (the world's "
        "fault: nats-server's `nextWaiting` answers an expired request 408; 2026-11-30)",
    ),
    5442: (
        {"other_client": True, "ack_wait": 4.0},
        "the same: message 12 served to a request 0.7 s past its expiry (2026-11-30)",
    ),
    498: (
        {"other_client": True, "stalling_executors": True},
        "the driver stalled 4.5 s while its keeper held message 6, sealed; a zombie of an "
        "earlier checkpoint got the redelivery and gave it back unrecorded, and the other "
        "client got it: the checker judged the zombie's give-back, not the stall (checker's "
        "fault, `Observed._held_last`; 2026-11-30)",
    ),
    970: (
        {"other_client": True, "stalling_executors": True},
        "the same after the query stopped: a zombie of batch 1 got message 15 again once no "
        "run held it and gave it back unrecorded (2026-11-30)",
    ),
    2538: (
        {"other_client": True, "packed": True},
        "a zombie's write recording message 5 never landed (its head was taken over), the "
        "zombie gave 5 back, the other client took it and its ack was lost, and the server "
        "delivered it to a later batch, which committed it: the checker took the write's "
        "start for the query holding 5 before the take (checker's fault, "
        "`Attempts.watch`; 2026-11-30)",
    ),
    2667: (
        {"other_client": True, "stalling_executors": True, "ack_wait": 4.0},
        "the same with a zombie of batch 3 and message 5 (2026-11-30)",
    ),
    2779: (
        {"other_client": True, "stalling_executors": True},
        "the same with a zombie of batch 1 and message 4 (2026-11-30)",
    ),
    1949: (
        {"other_client": True, "stalling_executors": True, "ack_wait": 4.0},
        "an attempt stalled 11.7 s at the write of its seal, before it landed; a sibling's "
        "delivery of message 2, which its entry held, ran out meanwhile and the other client "
        "took it: the checker counted the seal from the write's start, so the driver and not "
        "the stalled attempt held it (checker's fault, `Attempts.watch`; 2026-11-30)",
    ),
    18241: (
        {"other_client": True, "ack_wait": 4.0, "restart_after_acks": 0.1},
        "a retry took over at 12.486 an entry holding message 2, whose redelivery a sibling had "
        "dropped as recorded (due 12.541), and restarted its wait only at 12.686, after the "
        "fence and sibling reads (one answer took 0.2 s); the other client got it after batch "
        "1 committed it: a take-over now restarts what it took over as its write lands "
        "(`SlotEntry.claim`'s keep; 2026-11-30)",
    ),
    2739: (
        {"other_client": True, "packed": True, "stalling_executors": True},
        "a zombie of checkpoint 2's batch 1 (a packed task) woke after the batch settled: one "
        "slot's head write failed and the task cancelled the other mid-record, which left the "
        "chunk it had just written under its removed entry; the next run, on a new checkpoint, "
        "named that lineage replaced and planned no batch, whose give-back would have removed "
        "the chunk: the checker took it for left for good (checker's fault, "
        "`Observed.check_ledger_quiet`; 2026-11-30)",
    ),
    1893: (
        {"other_client": True, "packed": True, "stalling_executors": True},
        "a packed zombie of checkpoint 1's batch 1 woke after its lineage was given back and "
        "after the last run's adoption listed it, retired: one slot's chunk write landed, the "
        "other slot's head write failed (entry removed), and `packed_batches` cancelled the "
        "first slot in `ledger_protocol.record`, after its own head write failed too and before "
        "it removed its chunk, which stayed until the next start. A record now ends that removal "
        "however cancelled (its schedule moved with the fix; mutant "
        "cancelled-record-leaves-its-chunks, 2026-11-30)",
    ),
    5367: (
        {"other_client": True, "packed": True, "stalling_executors": True},
        "the same in the live lineage (a settled entry's zombie), on today's schedules "
        "(2026-11-30)",
    ),
    1861: (
        {"packed": True, "stalling_executors": True},
        "the rest of the hole 1893 found: a packed zombie of batch 2 woke after its lineage was "
        "given back; one slot's head write failed and the task cancelled the other slot in "
        "`ledger_protocol.record` as its chunk write answered, before it sent the head write, "
        "so nothing removed the chunk before the next start. A record now runs to its end "
        "however cancelled (2026-11-30)",
    ),
    2544: (
        {"recreate_consumer": True, "new_checkpoint": 0.5, "sink_failure": 0.2},
        "run 5's attempt of batch 0 took 22 and 23 of key S.p0.k1, recorded 22, and its process "
        "paused twice (47 s) while writing 23, whose wait its +WPIs restarted; run 6, on the same "
        "checkpoint, took its entry over once the head stood still 5 s and took 24 and 26 past "
        "23; the paused attempt's write was refused and it handed out the seal (the README's "
        "stall case). The checker took that refused write for where 23's rows came from "
        "(checker's fault, `Attempts.watch`; 2026-11-30). Its schedule moved with 5265's fix "
        "(run 5 writes the pointer at stop); test_lateness keeps the case",
    ),
    5265: (
        {"recreate_consumer": True, "new_checkpoint": 0.5, "sink_failure": 0.2},
        "run 4, on a new checkpoint, gave back an earlier one's acked entry of 2 above the "
        "consumer's floor and failed on its sink before its next pointer write, so the mark "
        "was lost; run 5, on another new checkpoint, read on a consumer created again during "
        "its batch 0, which delivered 2 again after 4: the mark was written at stop then "
        "(2026-11-30), and is now by the give-back before its removal (`DriverLedger."
        "_keep_marks`; mutant acked-through-in-memory-only, 2026-12-01)",
    ),
    150: (
        {
            "recreate_consumer": True,
            "purges": False,
            "restart_after_acks": 1.0,
            "new_checkpoint": 1.0,
            "sink_failure": 0.3,
            "messages": 30,
        },
        "per-key order: driver#4, of a new checkpoint, gave the earlier lineage back (its "
        "entries of gens 1-3 removed at 29.0) and died at 33.9 before its next pointer write, "
        "which 5265's write at stop kept the marks for; g-partition-0 was created again at "
        "30.6, and the checkpoint's next run read on from its start: 2, acked by the earlier "
        "checkpoint's query, came after 11. The give-back writes the marks to the pointer "
        "before it removes the entries now (`DriverLedger._keep_marks`; found by helper-63, "
        "2026-12-01, with 247 of the worlds that also restart the server 10 times, have half "
        "the runs on a new checkpoint, a 30 s wait and a partition each, a key taken here)",
    ),
    248: (
        {"packed": True, "early_stops": True},
        "a job stopped packed task b3#early after its first rows (27.202): partition-1's slot "
        "was cancelled while it sent its next pull ahead of the chunk the last one delivered "
        "(message 12 of key S.p1.k0); out of the inbox and not handed to the slot, the chunk "
        "was given back by nobody, waited out its ack wait, and batch 3 committed 19 of that "
        "key first. A slot cut off there now leaves it to `collect_late`, which hands it to "
        "the give-back (2026-11-30)",
    ),
    97: (
        {"recreate_consumer": True, "follows_advice": True, "floor_from_zero": True},
        "g-partition-0, last seen at floor 6, was created again and refused (its floor 0 on "
        "2.11); the operator created it at the advised --deliver 7, after a purge to 10, so it "
        "started at 10. The next start found 8, a message of partition 1 the query had "
        "committed, not among what it committed through g-partition-0 and refused it as lost "
        "(so did 147 and 326): what it committed through the stream's other consumers counts "
        "now (mutant sibling-partition-messages-taken-as-unread, 2026-11-30)",
    ),
    **{
        seed: (
            {"recreate_consumer": True, "follows_advice": True},
            "a consumer created again below what an earlier checkpoint's query acked "
            "(acked_through) was refused with the advice --deliver right after its floor, at or "
            "below that mark, and the consumer created there was refused again for the same "
            "reason: the advice is now past the mark, and what that query acked between the "
            "floors counts as read (found by helper-52, closed by helper-50, 2026-11-30)",
        )
        for seed in (1958, 2452)
    },
    8: (
        dict(ADVICE_AFTER_LOST_ACKS),
        "the advice bounded by what the batch run again held (3-4), --deliver 3, lay below 5-6, "
        "which an earlier checkpoint's query acked and nothing of this one held: the consumer "
        "created there was refused with the same advice, for ever. It is now --deliver 7, with "
        "3-4 to keep in the stream until committed (helper-84, 2026-12-01)",
    ),
    767: (
        {"recreate_consumer": True, "follows_advice": True},
        "a 4.0/4.1 availableNow run on a new checkpoint judged g-partition-0, created again, at "
        "reportLatestOffset(), before its first batch gave back the entry of 5-6 an earlier "
        "checkpoint's query acked: it advised --deliver 5, and the next run, after the "
        "give-back, refused the consumer created there with --deliver 7. What the give-back will "
        "mark counts as marked from initialOffset() on (SeenConsumers.marks_to_come), not as "
        "held: the first advice is --deliver 7 (mutant "
        "refusal-before-the-give-back-knows-no-marks; helper-86, 2026-12-02)",
    ),
    614: (
        dict(ADVICE_AFTER_LOST_ACKS),
        "a 4.0/4.1 availableNow run's first latestOffset(), before setLatestSeenOffset, judged "
        "the consumer created where a task's refusal said knowing nothing of the batch run "
        "again, refused it for marks that batch held and advised past it; that look now leaves "
        "it to the batch's run again (helper-84, 2026-12-01)",
    ),
    2550: (
        {"recreate_consumer": True, "follows_advice": True},
        "a refusal advised --deliver 6, past 4-5 that the refused batch 0 held (a purge of what "
        "c acked took them: DataLoss at every re-run); it now advises no later than the batch's "
        "entries hold, and reads on there as the batch runs again (helper-71, 2026-12-01)",
    ),
    669: (
        {"recreate_consumer": True, "follows_advice": True, "floor_from_zero": True},
        "run 3 refused consumer c created again (DeliverAll) with a task's failure; the operator "
        "created it at the advised --deliver 2 while the failed run's last attempt of batch 3 "
        "still ran, which pulled 2 and 3 from it and failed unacked. Run 4 looked at c first "
        "then: floor 0 as 2.11 reports it, deliveries out, read as a consumer that goes back, "
        "and refused it again. Its `opt_start_seq` now bounds the floor (mutant "
        "new-consumer-start-ignored, 2026-11-30)",
    ),
    898: (
        world(BY_NAME["started-over-only-against-the-pointer"]),
        "the checker's (found by helper-51's hunt of the rare mutants' worlds): attempt "
        "b1/c#1#2 of run 2 took its entry over and paused 52 s (its process) in its claim's "
        "sibling reads; run 2's driver died meanwhile (the attempt lingered), run 4's retry took "
        "the entry over, and the woken attempt's head write failed (`TakenOver`). Its failure "
        "reached no Spark, yet the checker took it for a live attempt's failure toward "
        "spark.task.maxFailures; it now counts only attempts whose driver's run awaits them "
        "(`counted_by_spark`; 2026-12-01)",
    ),
    2159: (
        world(BY_NAME["started-over-only-against-the-pointer"]),
        "found by helper-55's hunt of 1801-2800 of those worlds: run 3's driver found consumer c "
        "created again since run 2 planned batch 2 (whose c#1 entry held 3, from the old one), "
        "wrote the new one's sighting to the pointer, told batch 2's tasks and died; run 5's "
        "driver re-ran batch 2 untold, and its c#0 attempt, lingering past its driver's death, "
        "took 3 from the new consumer as a first delivery: both entries emitted it. The pointer "
        "now keeps what was created again after which batch until it commits "
        "(`DriverLedger.started_over`; mutant started-over-told-by-one-driver-only, 2026-12-01)",
    ),
    162: (
        dict(REDELIVERED_TO_STOPPED_QUERIES),
        "per-key order (found 2026-12-01 by helper-58, explained by helper-60): a new "
        "checkpoint's give-back NAKed 1, 3 and 4 of the earlier run's entry; that run's attempt, "
        "its read ended, had taken 1 and 3 again to its requests still out (`keeper.again`), "
        "found its entry gone at its seal and gave nothing back (`give_back_unrecorded` runs "
        "only for a read cut short): 1 and 3 ran out behind 4. The seal's path gives back what "
        "came again (`give_back_came_again`); mutant came-again-kept-at-a-lost-seal",
    ),
    1726: (
        {"packed": True, "early_stops": True, "stalling_executors": True, "other_client": True},
        "taken by another client, then committed (found by helper-56's hunt on the schedules of "
        "ledger format 3): packed task b4#0 took over c#1's entry (13, 14, 18), which the "
        "early-stopped attempt had released, and its process stalled 38 s right after the "
        "take-over's write landed; the waits ran out and the other client took them. README "
        "case 1, a stall of the taker: let out since the take-over holds what it adopts from "
        "the release and the let-out judges the claims as they were while the wait ran",
    ),
    26: (
        {
            "other_client": True,
            "stalling_executors": True,
            "ack_wait": 4.0,
            "per_batch": 50,
            "fetch_batch": 1,
            "chaos": Chaos(task_lost=0.05, task_crash=0.02, lost_stall=2.0, crashes=6),
        },
        "the checker's (found by helper-63 in the worlds of another client whose executors "
        "pause, explained by helper-75, 2026-12-01): b1/c#0#0 recorded 1 and was killed; its "
        "head writes just before restarted the retry's 5 s stand-by, past the 4 s wait "
        "(README guarantee 4, a dead holder). The sibling slot's zombie took 1's redelivery, "
        "found c#0's entry holding it and dropped it, but the check kept it for 1's holder; a "
        "record written again without what a sibling recorded lets those go (`_let_go`)",
    ),
    194: (
        {
            "other_client": True,
            "early_stops": True,
            "ack_wait": 4.0,
            "messages": 30,
            "per_batch": 50,
            "fetch_batch": 1,
        },
        "the checker's (found by helper-61, explained by helper-75, 2026-12-01): the attempt a "
        "user's job stopped recorded 6 and 7 and released its entry; the full read's attempt "
        "took it over and was killed as its write's answer came, and the next stood by 5 s for "
        "that head, past the 4 s wait: the other client got both, then the batch committed them "
        "(README guarantee 4, a dead holder). The check recorded a take-over only at its answer; "
        "it holds from the release once its write took effect (`SimBucket.landed`)",
    ),
    1141: (
        world(BY_NAME["cancelled-record-leaves-its-chunks"]),
        "per-key order (found by helper-70, explained by helper-75, 2026-12-01): a zombie of a "
        "stopped query's packed task found its entry's head written by a later run's retry "
        "(sealed; that run failed) and left what came again to that taker; a new checkpoint's "
        "give-back then removed the entry and NAKed 6, whose redelivery came to the zombie's "
        "pull sent ahead, unNAKed: 6 ran out behind 14. The attempt reads the head again once "
        "its requests ended (`taker_lost_it`); mutant taker-judged-at-the-lost-write",
    ),
    1738: (
        {"packed": True, "early_stops": True, "stalling_executors": True},
        "the checker's (found by helper-53 in the packed early-stop worlds whose executors "
        "pause): packed task b3#early took 17 (26.67), paused 3.6 s (its process, 4 s wait), and "
        "Spark closed it as it woke; its give-back skipped 17, dated from its request more than "
        "half the wait before (`surely_running`): 17 waited out its wait and came after 19. A "
        "stall of more than half the wait before an attempt fails or is closed is README "
        "guarantee 4's first case (`skipped_after_a_stall`; helper-65, 2026-12-01). On ledger "
        "format 3: b1#early took 10 (20.96), paused 3.0 s in a head write, and Spark closed it; "
        "its give-back, the first thing it did as it woke, skipped 10, which came after 21. The "
        "stall's end, start plus delay, fell a few float bits after the wake's time: one "
        "instant (`SAME_INSTANT`; helper-67)",
    ),
    1877: (
        {"packed": True, "early_stops": True, "stalling_executors": True},
        "as 1738: packed task b0#early took 9, paused 21.2 s of a 30 s wait, was closed as it "
        "woke and skipped 9, which came after 11",
    ),
    1496: (
        dict(BY_NAME["came-again-kept-at-a-lost-seal"].edit),
        "as 1738: attempt b0/partition-0#0 of a stopped query took 4 again (19.89) after a new "
        "checkpoint's give-back NAKed its recorded delivery, paused 3.4 s (4 s wait) and failed "
        "on its removed entry; its give-back skipped 4, which came after 7",
    ),
    1610: (
        dict(BY_NAME["came-again-kept-at-a-lost-seal"].edit),
        "as 1738: attempt b1/partition-0#0 took 4 (27.42) and paused 4.4 s (4 s wait) in a "
        "dedupe read; 4's wait ran out meanwhile (31.42), behind 5 and 7 on the redelivery "
        "queue, and the attempt failed (`ChunkMissing`) and skipped it",
    ),
    636: (
        {
            **dict(REDELIVERED_TO_STOPPED_QUERIES),
            "chaos": Chaos(driver_crash=0.003, task_lost=0.005, stall=0.03, crashes=3),
        },
        "as 1738, the checker's (helper-66's worlds of stalls, 3% of the points; explained by "
        "helper-77, 2026-12-01): retry b0/partition-1#1 of run 1 took over the entry its "
        "zombie had recorded 1 in; run 2's give-back removed it and NAKed 1, whose redelivery "
        "came to the retry (21.93), which stalled 2.2 s (4 s wait), failed on the removed "
        "entry and skipped 1: 1 came after 22. The check took the retry's first delivery of 1 "
        "for the one its entry named (the zombie's): a message a take-over adopted comes again "
        "at any delivery to the taker (`Attempts.adopted`)",
    ),
    540: (
        {
            **dict(REDELIVERED_TO_STOPPED_QUERIES),
            "chaos": Chaos(driver_crash=0.003, task_lost=0.005, stall=0.1, crashes=3),
        },
        "per-key order in helper-66's worlds of stalls at 10% of the points (found 2026-12-01, "
        "explained by helper-77), closed by 410abf0 before it was looked at: run 2's "
        "b0/partition-1#0, its entry given back by run 3, stalled through a keeper round sent at "
        "32.97; 1 came again to its pull at 37.18 before the round's answer, which dated that "
        "delivery back to the round's send, and its give-back skipped 1 as maybe run out: 1 "
        "came after 3. Mutant round-dates-back-a-later-delivery fails it",
    ),
    1244: (
        {
            **dict(REDELIVERED_TO_STOPPED_QUERIES),
            "chaos": Chaos(driver_crash=0.003, task_lost=0.005, stall=0.1, crashes=3),
        },
        "as 1738, the checker's (helper-77, 2026-12-01): run 2's b1/partition-1#0 recorded 3, "
        "which run 3's give-back NAKed; 3 came again to it (43.13), and its process stalled "
        "4.2 s from 43.33 (4 s wait). Its give-back ran at 47.49, inside the stall's last "
        "instants (a simulated stall holds a coroutine at its next scheduling point; one woken "
        "by an answer runs on), and skipped 3, which ran out and came after 4. The check "
        "counted only stalls over by the give-back; one still on counts up to it",
    ),
    # Found by helper-86 (2026-12-02), closed by helper-87: 1959 with new checkpoints at 70% of
    # the runs is the same hole (1-3, 6, 8-9 of a batch acked 0.4 s after the recreation).
    1586: (
        {"recreate_consumer": True, "follows_advice": True},
        "b4/partition-0 acked 12-13 of a committed batch 9 ms after g-partition-0 was created "
        "again, which ignored them, yet marked the entry ACKED: a new checkpoint kept them as "
        "acked and advised --deliver 14. Only marks a look at the same consumer followed count "
        "now (Sighting.looked_after); the others are read again",
    ),
    1959: (
        {"recreate_consumer": True, "follows_advice": True, "new_checkpoint": 0.7},
        "as 1586: acks of 1-3, 6, 8-9 sent 0.4 s after the consumer was created again were "
        "kept as marks, and --deliver 10 skipped 6 and 8-9",
    ),
}


# Seeds that break a guarantee on a hole still open (docs/faults.md): left out of the ranges
# explored, and each must still break it (when it passes, the hole is closed: move the seed to
# CLOSED_HOLES).
KNOWN_OPEN: dict[int, tuple[dict[str, Any], str]] = {
    # The hunts of 2026-11-30 found 16463, 21621 (other-client), 2766, 8306 (packed), 782,
    # 5797, 5089 and 5442 (other-client, 4 s wait), 1347 and 689 (other-client worlds whose
    # executors pause), 18241 (other-client, 4 s wait, restarts after a tenth of the rounds of
    # acks), 851 (other-client worlds whose executors pause, 4 s wait), 2739, 1893 and 5367
    # (other-client, packed, pausing executors), 1861 (packed, pausing executors), 6791 and
    # 11950 (consumer created again), 2544 (consumer created again, new checkpoints, sink
    # failures); each was the checker's or the world's, or is closed (CLOSED_HOLES). So were
    # 263, 953 (an attempt Spark closed after its entry was taken over while it stalled) and
    # 969 (a delivery given back at once that came after the newer one), found by helper-49 in
    # the packed worlds with early stops, and 1738, 1877 (a stall before Spark closed the
    # attempt), found by helper-53 there with pausing executors.
    # 767 (helper-84's, consumer created again, operator follows the advice) is closed.
    # 1586 (helper-86's, consumer created again, operator follows the advice) is closed.
}


def test_known_open_holes_still_break() -> None:
    """One test for all of them, not one per seed: with none open, an empty parameter set would
    be reported as a skip."""
    closed = [
        seed
        for seed, (world, _) in sorted(KNOWN_OPEN.items())
        if not run_schedule(seed, **world).problems
    ]
    assert not closed, f"seeds {closed} keep the guarantees: move them to CLOSED_HOLES"


@pytest.mark.parametrize("seed", sorted(CLOSED_HOLES))
def test_closed_holes_stay_closed(seed: int) -> None:
    overrides, _ = CLOSED_HOLES[seed]
    assert not run_schedule(seed, **overrides).problems


def assert_schedules_keep_the_guarantees(
    seeds: Iterable[int], jobs: int = JOBS, **overrides: Any
) -> None:
    """Every schedule of `seeds` (under `overrides` of what they draw), run in `jobs` processes,
    keeps every guarantee."""
    known = {seed for seed, (world, _) in KNOWN_OPEN.items() if world == overrides}
    runs = run_schedules([seed for seed in seeds if seed not in known], jobs, **overrides)
    flags = "".join(  # as the command line spells them (`python -m tests.simulation --help`)
        f" --{name.replace('_', '-')}" + ("" if value is True else f" {value}")
        for name, value in overrides.items()
    )
    failed = [r for r in runs if r.problems]
    assert not failed, "\n".join(
        f"seed {r.seed} (Spark {r.setup.version}{flags}): {r.problems[0]} "
        f"(reproduce: python -m tests.simulation --seed {r.seed}{flags})"
        for r in failed
    )


def test_every_schedule_keeps_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(CHECK.drawn)


def test_speculation_keeps_the_guarantees() -> None:
    """Issue 45, hole 5: two live attempts of one task at once; no attempt fails because the
    other took its entry over, and whichever Spark keeps, the guarantees hold."""
    assert_schedules_keep_the_guarantees(CHECK.speculation, speculation=SPECULATION)


def test_packed_schedules_keep_the_guarantees() -> None:
    """Both slots packed into one task: its attempts claim, record and seal each slot's entry,
    and die with all of them."""
    assert_schedules_keep_the_guarantees(CHECK.packed, packed=True)


def test_schedules_with_pausing_executors_keep_the_guarantees() -> None:
    """Attempts Spark lost to a long pause of their executor run on after their batch was
    committed and settled, or their query given back: fenced, they take nothing, and what
    they wrote goes."""
    assert_schedules_keep_the_guarantees(STALLING_CHECK, stalling_executors=True)


def test_schedules_with_another_client_keep_the_guarantees() -> None:
    """Another client of the overflow consumer takes and acks messages beside the query: none
    the live checkpoint committed, unless the world let it out (`Observed.taken_by_another`);
    the mutant sealed-kept-only-once-due shows what a late keeper lets out."""
    assert_schedules_keep_the_guarantees(OTHER_CLIENT_CHECK, other_client=True)


def test_schedules_of_replaced_queries_keep_the_guarantees() -> None:
    """A query stopped mid-batch and replaced at once by one on a new checkpoint: its give-back
    meets the stopped run's attempts still pulling and recording (the mutant
    give-back-under-a-recording-attempt shows what an untaken entry lets through)."""
    assert_schedules_keep_the_guarantees(REPLACED_CHECK, replaced_mid_batch=True)


def test_schedules_whose_server_brings_back_removed_keys_keep_the_guarantees() -> None:
    """A server restarted uncleanly brings back ledger keys it had removed (a lost tombstone):
    heads without their chunks, chunks without their heads, whole entries, of the live
    lineage and of replaced ones (the mutants returned-entries-kept and
    returned-entry-given-back-by-its-chunks show what the query must do about them)."""
    assert_schedules_keep_the_guarantees(RETURNING_CHECK, removals_return=True)


def test_schedules_on_a_server_whose_new_consumers_report_floor_zero_keep_the_guarantees() -> None:
    """nats-server 2.11 and 2.12 report a new consumer's ack floor as 0 until its first delivery
    is acked, where later ones report the sequence before its start; a consumer created again
    there (DeliverAll, after a purge) must be judged by what it will deliver, not by that 0."""
    assert_schedules_keep_the_guarantees(
        FLOOR_FROM_ZERO_CHECK, recreate_consumer=True, floor_from_zero=True
    )


def test_a_refusal_s_advice_followed_is_read_on() -> None:
    """A consumer created again, refused; the operator creates it where the refusal says and
    restarts the query, which must read on (refused again, it advised an earlier start, which
    delivers again what the query committed) and keep every guarantee to the end."""
    assert_schedules_keep_the_guarantees(ADVICE_CHECK, recreate_consumer=True, follows_advice=True)


def test_a_refusal_for_a_message_gone_before_the_advice_was_followed_is_no_wrong_advice() -> None:
    """A consumer created again on nats-server 2.11-2.12 is refused for the floor 0 it reports;
    messages past the floor the query saw are purged before the operator creates it where the
    refusal said. The server starts it at the stream's first sequence, past them, and the query,
    which cannot tell a message gone of another subject, refuses it for data loss: no start
    would read them, so that is README guarantee 2 and not an advice the operator followed in
    vain (`World._gone_before`; seed 1606 of 0-1999, on the schedules of 2026-12-01)."""

    def gone_after_the_advice(result: Result) -> bool:
        followed = [i for i, line in enumerate(result.trace) if "the operator creates" in line]
        return bool(followed) and any(
            GONE_UNREAD.search(line) for line in result.trace[followed[0] :]
        )

    refused = _first_seed(
        gone_after_the_advice,
        known=1606,
        recreate_consumer=True,
        follows_advice=True,
        floor_from_zero=True,
    )
    assert refused is not None and not refused.problems


def test_a_seed_replays_the_same_schedule() -> None:
    first, again = run_schedule(7, verbose=False), run_schedule(7, verbose=False)
    assert first.trace == again.trace and first.steps == again.steps > 0


# Seeds of several kinds of worlds whose schedules hung on the hash seed of strings (the driver
# iterated a set of slot names: the order it read the entries' heads in), and the program that
# prints their schedules with every scheduling point (a process of its own: the hash seed is set
# as Python starts).
HASH_SEED_CASES: tuple[tuple[int, dict[str, Any]], ...] = (
    (28, {}),
    (5, {"other_client": True}),
    (72, {"packed": True}),
    (29, {"replaced_mid_batch": True}),
    (56, {"stalling_executors": True}),
    (40, {"removals_return": True}),
)
PRINT_SCHEDULES = """
import contextlib, io, json, sys
from tests.simulation.world import run_schedule
for seed, overrides in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):  # verbose prints the points as it goes
        result = run_schedule(seed, verbose=True, **overrides)
    print(f"seed {seed} {overrides}", *result.trace, sep="\\n")
"""


def test_a_seed_replays_the_same_schedule_under_another_hash_seed() -> None:
    """A seed a hunt's worker process reports replays with `--seed` in another process, whose
    strings hash otherwise (PYTHONHASHSEED): no order of requests rests on a set's."""
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", PRINT_SCHEDULES, json.dumps(HASH_SEED_CASES)],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            stdout=subprocess.PIPE,
            text=True,
        )
        for hash_seed in ("0", "1")
    ]
    first, second = (run.communicate(timeout=120)[0].splitlines() for run in runs)
    assert [run.returncode for run in runs] == [0, 0]
    assert first == second and len(first) > 1000


def test_a_participant_killed_while_it_sleeps_never_wakes() -> None:
    """As after kill -9: nothing of it runs again, so the harness never observes a dead driver
    (seed 5024 had a dead driver's batch observed in the next checkpoint's run)."""
    sched = Scheduler(random.Random(0), Chaos(), ack_wait=4.0)
    woke: list[str] = []

    async def nap() -> None:
        await sched.sleep(1.0)
        woke.append("nap")

    async def world() -> None:
        napper = sched.spawn("napper", "driver", nap())
        await sched.sleep(0.5)
        sched.kill(napper, at="its nap")
        await sched.sleep(1.0)
        assert isinstance(napper.finished.exception(), Crashed)

    run(sched.loop, world())
    assert woke == []


def test_only_a_task_attempt_its_driver_awaits_counts_toward_spark_s_failures() -> None:
    """A zombie's failure reaches no one: one Spark lost, or one that runs on after its driver's
    run stopped or its driver died (seed 898's attempt paused through its driver's death)."""
    sched = Scheduler(random.Random(0), Chaos(), ack_wait=4.0)
    counted: dict[str, bool] = {}

    async def attempt() -> None:
        await sched.sleep(2.0)
        me = sched.current()
        assert me is not None
        counted[me.name] = counted_by_spark(me)

    async def driver(attempt_name: str, lost: bool = False, runs: float = 3.0) -> None:
        sched.spawn(attempt_name, "task", attempt(), parent=sched.current()).lost = lost
        await sched.sleep(runs)

    async def scene() -> None:
        sched.spawn("live", "driver", driver("of a live run"))
        sched.spawn("losing", "driver", driver("lost by Spark", lost=True))
        sched.spawn("stopping", "driver", driver("of a stopped run", runs=1.0))
        dying = sched.spawn("dying", "driver", driver("of a dead driver"))
        await sched.sleep(1.0)
        sched.kill(dying, at="the test")  # its attempt lingers (this seed's draw)
        assert isinstance(dying.finished.exception(), Crashed)
        await sched.sleep(2.0)

    run(sched.loop, scene())
    assert counted == {
        "of a live run": True,
        "lost by Spark": False,
        "of a stopped run": False,
        "of a dead driver": False,
    }


def test_a_consumer_with_max_deliver_is_refused_before_anything_is_taken() -> None:
    """A delivery past `max_deliver` leaves the consumer for good (nats-server's
    `hasMaxDeliveries`), and the source has messages redelivered: it refuses such a consumer
    (`consumer_checks.check_config`) before it takes anything (`Observed.refused`); the
    mutant max-deliver-unchecked shows the messages it would lose."""
    refused = _first_seed(lambda r: _refused(r, "max_deliver=2"), max_deliver=2)
    assert refused is not None and not refused.problems


def test_a_consumer_created_again_while_the_query_runs_is_refused() -> None:
    """A consumer deleted and created again (DeliverAll) delivers what earlier batches committed
    and acked: once the driver sees its later creation time it refuses to read on
    (`SeenConsumers.look`), before it emits anything twice; the mutant
    recreated-consumer-unchecked shows what it would emit again."""
    refused = _first_seed(lambda r: _refused(r, "created again"), recreate_consumer=True)
    assert refused is not None and not refused.problems


def test_a_consumer_created_again_unseen_by_the_query_is_refused_by_the_next_run() -> None:
    """A consumer deleted and created again where no driver looks at it before the query stops
    (the run ends first, or its driver dies) is told apart by the next run's driver from the
    consumers its pointer keeps as last seen: refused before it emits anything twice; the mutant
    remembered-consumers-forgotten shows what it would emit again."""
    refused = _first_seed(
        lambda r: _refused(r, "created again while the query was stopped"), recreate_consumer=True
    )
    assert refused is not None and not refused.problems


def test_a_consumer_created_again_while_a_batch_reads_it_is_refused_by_its_task() -> None:
    """A batch planned before its consumer was deleted and created again reads the new one,
    which delivers from its start again: the task stops at the first delivery at or below the
    ack floor the driver saw that no batch holds (`Acceptance`), before it takes anything of
    the new consumer; the mutant recreated-consumer-unchecked-in-flight shows what the batch
    would emit again (seed 171 does, on the schedules since the pointer keeps the floors
    current; 35 did before)."""
    stopped = _first_seed(
        lambda r: any("while a batch read it" in line for line in r.trace),
        known=171,
        recreate_consumer=True,
    )
    assert stopped is not None and not stopped.problems


def test_schedules_with_a_consumer_created_again_keep_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(RECREATED_CHECK, recreate_consumer=True)


def _refused(result: Result, why: str) -> bool:
    return any("query fails" in line and why in line for line in result.trace)


def _first_seed(
    found: Callable[[Result], bool], known: int | None = None, **overrides: object
) -> Result | None:
    """The first of seeds 0-99 whose schedule, with `overrides`, is `found` (schedules move
    with every change to the code they run, so no one seed is pinned); the `known` one, found
    late in the range, is tried first."""
    for seed in ([known] if known is not None else []) + list(range(100)):
        result = run_schedule(seed, **overrides)
        if found(result):
            return result
    return None
