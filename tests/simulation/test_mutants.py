"""The simulation catches what matters: every hole it found, put back (tests/simulation/mutants.py),
breaks a guarantee in some seed of the unit lane's range, each mutant stopped at its first
failing seed; `make mutants` counts them over a range."""

from __future__ import annotations

import pytest

from tests.simulation.mutants import BY_NAME, MUTANTS, hunt, misfits, summary
from tests.simulation.test_simulation import JOBS, SEEDS

pytestmark = pytest.mark.unit

# Mutants only rarer seeds catch: the unit lane runs these seeds of a longer range, found by
# `python -m tests.simulation.mutants --only NAME --seeds 0-20000 --first 3` (again when the
# schedules change).
RARE = {
    "siblings-lateness-from-take": (3626,),
    "zombie-recreates-settled": (2835, 3549, 3884),
}


def test_every_mutant_fits_its_code() -> None:
    assert not misfits()
    assert set(RARE) <= set(BY_NAME)


def test_every_mutant_is_caught() -> None:
    searches = [(m, RARE.get(m.name, SEEDS)) for m in MUTANTS]
    survived = [found for found in hunt(searches, JOBS, first=1) if not found.failures]
    assert not survived, "\n".join(
        summary(found)
        + (
            "\n  (its known catching seeds: find new ones with python -m tests.simulation."
            f"mutants --only {found.name} --seeds 0-20000 --first 3)"
            if found.name in RARE
            else ""
        )
        for found in survived
    )
