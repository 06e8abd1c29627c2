"""The rest of the ack-ledger simulation's explored range, in the main lane: `make check` runs
the first share of each kind of world (test_simulation.py) and stays within its minute. One
process: the other worker's Spark tests keep a core (a Python worker that cannot connect back
in time fails its query)."""

from __future__ import annotations

import pytest

from tests.simulation.mutants import SPECULATION
from tests.simulation.test_simulation import (
    ADVICE_EXPLORED,
    EXPLORED,
    OTHER_CLIENT_EXPLORED,
    RECREATED_EXPLORED,
    REPLACED_EXPLORED,
    RETURNING_EXPLORED,
    STALLING_EXPLORED,
    assert_schedules_keep_the_guarantees,
)


@pytest.mark.timeout(900)  # beside the other worker's Spark tests on two cores
def test_every_schedule_keeps_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(EXPLORED.drawn, jobs=1)


def test_speculation_keeps_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(EXPLORED.speculation, jobs=1, speculation=SPECULATION)


def test_packed_schedules_keep_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(EXPLORED.packed, jobs=1, packed=True)


def test_schedules_with_a_consumer_created_again_keep_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(RECREATED_EXPLORED, jobs=1, recreate_consumer=True)


def test_schedules_with_pausing_executors_keep_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(STALLING_EXPLORED, jobs=1, stalling_executors=True)


def test_schedules_with_another_client_keep_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(OTHER_CLIENT_EXPLORED, jobs=1, other_client=True)


def test_schedules_of_replaced_queries_keep_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(REPLACED_EXPLORED, jobs=1, replaced_mid_batch=True)


def test_schedules_whose_server_brings_back_removed_keys_keep_the_guarantees() -> None:
    assert_schedules_keep_the_guarantees(RETURNING_EXPLORED, jobs=1, removals_return=True)


def test_a_refusal_s_advice_followed_is_read_on() -> None:
    assert_schedules_keep_the_guarantees(
        ADVICE_EXPLORED, jobs=1, recreate_consumer=True, follows_advice=True
    )
