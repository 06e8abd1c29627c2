"""Short chaos runs in the suite. First, chaos/run.py's soak with one fault of each kind, in a fixed
order and with a fixed seed, gaps of about a second and short outages (a server down for under a
second, a 3 s network partition). The streaming job reads an elastic group through a TCP proxy
while 50 messages a second are published; after each fault it must catch up (everything stored
acked within the soak's max stall, 120 s) and at the end every published message must be
committed exactly once and acked.

Two kinds do not fit the budget of about 90 s on two busy cores, and are left to `make chaos`:
- driver kill -9: a second JVM start (the restarted job's) costs 25-70 s there on its own, on top
  of the first job's 35-50 s (measured 82 s and 150 s for the whole run with it); the job's
  restart after kill -9 at fixed points is tested in test_driver_kills.py and
  test_source_recovery.py.
- the cluster leader kill -9: three servers and their elections; see test_cluster_nats.py.

Then chaos/sweep.py's kill sweep, two rounds: the driver of a job reading an elastic group (500
keys, six partitions) into a stream with the `nats` sink is killed -9 at two seeded batch phases
and restarted from its checkpoint; a last run drains the group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.run import Plan, soak
from chaos.sweep import SweepPlan, sweep

pytestmark = pytest.mark.spark  # the job runs Spark in a process of its own

KINDS = (
    "server kill -9",
    "executor kill -9",
    "network partition",
    "connections cut",
    "unpin",
    "consumer deleted",
)


def test_each_fault_once(tmp_path: Path) -> None:
    plan = Plan(
        seed=28,
        kinds=KINDS,
        minutes=None,
        rate=50,
        gap=(0.5, 1.5),
        outages={"server kill -9": (0.2, 0.8), "network partition": (3.0, 3.0)},
    )
    outcome = soak(plan, tmp_path)
    log = (tmp_path / "job.log").read_text(errors="replace")[-2000:]
    summary = f"{outcome.table()}\njob log (end):\n{log}"
    assert outcome.tally.missed == [], summary  # every kind struck
    assert dict(outcome.tally.faults) == dict.fromkeys(KINDS, 1), summary
    assert not outcome.tally.late, summary  # caught up after each fault
    assert outcome.published > 0 and outcome.lost == 0, summary
    assert outcome.duplicated == 0, summary
    assert outcome.unacked == 0, summary


@pytest.mark.timeout(600)  # two job restarts; a retry after a killed worker stands by 5 s
def test_kill_sweep(tmp_path: Path) -> None:
    """Seed 20 kills the job at the commit of a batch (its slots sealed, before Spark's commit
    log), a Python worker killed first, then at a seal of the batch the restarted job re-runs."""
    outcome = sweep(SweepPlan(seed=20, rounds=2, rate=50), tmp_path)
    log = (tmp_path / "job.log").read_text(errors="replace")[-2000:]
    summary = "\n".join([json.dumps(outcome.report()), *outcome.diagnosis, "job log (end):", log])
    assert not outcome.failed, summary  # nothing lost, duplicated, unacked or out of key order
    assert outcome.published > 0 and outcome.rows == outcome.published, summary
    assert outcome.unbatched == 0, summary  # the target allows atomic batches: the sink uses them
    assert [kill.restarts for kill in outcome.kills] == [0, 0], summary
