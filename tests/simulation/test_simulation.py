"""The ack-ledger simulation in the unit lane: a range of seeded schedules must keep every
guarantee (see tests/simulation/world.py); `make simulate SEEDS=...` runs longer ranges."""

from __future__ import annotations

import pytest

from tests.simulation.world import run_schedule

pytestmark = pytest.mark.unit

SEEDS = range(0, 400)


def test_every_schedule_keeps_the_guarantees() -> None:
    failed = [r for r in map(run_schedule, SEEDS) if r.problems]
    assert not failed, "\n".join(
        f"seed {r.seed} (Spark {r.setup.version}): {r.problems[0]} "
        f"(reproduce: python -m tests.simulation --seed {r.seed})"
        for r in failed
    )


def test_a_seed_replays_the_same_schedule() -> None:
    first, again = run_schedule(7, verbose=False), run_schedule(7, verbose=False)
    assert first.trace == again.trace and first.steps == again.steps > 0
