"""A short chaos run in the suite: chaos/run.py's soak with every fault kind once, in a fixed
order and with a fixed seed, gaps of about a second and short outages (a 3 s partition, a
server and a driver down for under a second). The streaming job reads an elastic group through a
TCP proxy while messages are published; after each fault it must catch up (everything stored
acked) and at the end every published message must be committed exactly once and acked.

The cluster leader kill -9 is left to `chaos/run.py --cluster` and test_cluster_nats.py: three
servers and their elections do not fit this test's budget (about 90 s on two busy cores).
"""

from __future__ import annotations

from pathlib import Path

from chaos.run import Plan, soak

# Long enough that a fault's catch-up under load is not mistaken for a stall; a catch-up that
# takes longer fails the test.
MAX_STALL = 60.0


def test_each_fault_once(tmp_path: Path) -> None:
    plan = Plan(
        seed=28,
        minutes=None,
        rate=100,
        gap=(0.5, 1.5),
        outages={
            "server kill -9": (0.2, 0.8),
            "driver kill -9": (0.0, 0.5),
            "network partition": (3.0, 3.0),
        },
        max_stall=MAX_STALL,
        drain=60.0,
    )
    outcome = soak(plan, tmp_path)
    log = (tmp_path / "job.log").read_text(errors="replace")[-3000:]
    summary = f"{outcome.table()}\njob log (end):\n{log}"
    assert outcome.tally.missed == [], summary  # every kind struck
    assert dict(outcome.tally.faults) == dict.fromkeys(plan.fault_kinds, 1), summary
    assert not outcome.tally.late, summary  # caught up after each fault
    assert outcome.published > 0 and outcome.lost == 0, summary
    assert outcome.duplicated == 0, summary
    assert outcome.unacked == 0, summary
