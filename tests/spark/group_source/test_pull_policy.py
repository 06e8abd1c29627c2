"""The slot pull loop's decisions without a server: every status a pull ends with, every limit."""

from __future__ import annotations

import pytest

from nats_spark.errors import PriorityGroupMisconfigured, PullError
from nats_spark.jetstream.pull import PullStatus
from nats_spark.spark.group_source.task.pull_policy import (
    HELD_ONLY_PULLS,
    PIN_RETRIES,
    TRANSIENT_RETRIES,
    PullPlan,
    SlotPullPolicy,
    complete,
)
from nats_spark.spark.shared.columns import BATCH_BYTES, BATCH_ROWS

pytestmark = pytest.mark.unit

BATCH, TIMEOUT = 100, 2.5
EMPTY = (PullStatus.NO_MESSAGES, PullStatus.TIMEOUT)
TRANSIENT = (PullStatus.INTERRUPTED, PullStatus.HEARTBEAT_MISSED, PullStatus.CLIENT_TIMEOUT)


def policy() -> SlotPullPolicy:
    return SlotPullPolicy(BATCH, TIMEOUT)


def no_wait(batch: int = BATCH, max_bytes: int = BATCH_BYTES) -> PullPlan:
    return PullPlan(batch, None, max_bytes, whole=True)


def waiting(batch: int = BATCH) -> PullPlan:
    return PullPlan(batch, TIMEOUT, BATCH_BYTES, whole=True)


@pytest.mark.parametrize(
    ("want", "plan"), [(0, None), (-3, None), (7, no_wait(7)), (500, no_wait())]
)
def test_the_first_pull_takes_what_is_ready_up_to_the_batch_and_what_is_wanted(
    want: int, plan: PullPlan | None
) -> None:
    assert policy().next(want) == plan


def test_a_pull_is_no_larger_than_a_record_batch() -> None:
    """A pull's deliveries become one record batch: rows and bytes stay within its bounds, so a
    worker holds at most that much at a time, whatever fetchBatchSize asks."""
    large = SlotPullPolicy(100_000, TIMEOUT)
    assert large.next(1_000_000) == PullPlan(BATCH_ROWS, None, BATCH_BYTES, whole=True)


@pytest.mark.parametrize("status", [PullStatus.BATCH_COMPLETE, PullStatus.MAX_BYTES])
def test_a_complete_pull_is_followed_at_once(status: PullStatus) -> None:
    slot = policy()
    assert slot.ended(status, BATCH, new=True, got_any=True)
    assert slot.next(1000) == no_wait()


def test_a_pull_served_in_full_after_a_wait_stops_waiting() -> None:
    slot = policy()
    assert slot.ended(PullStatus.TIMEOUT, 0, new=False, got_any=False)
    assert slot.next(1000) == waiting()
    assert slot.ended(PullStatus.BATCH_COMPLETE, 5, new=True, got_any=True)
    assert slot.next(1000) == no_wait()


def test_a_message_larger_than_the_cap_lifts_it() -> None:
    slot = policy()
    assert slot.ended(PullStatus.MAX_BYTES, 3, new=True, got_any=True)
    assert slot.next(1000) == no_wait()  # something fitted: the cap stays
    assert slot.ended(PullStatus.MAX_BYTES, 0, new=False, got_any=True)
    assert slot.next(1000) == no_wait(max_bytes=0)


@pytest.mark.parametrize("status", EMPTY)
def test_an_empty_pull_is_followed_by_one_wait(status: PullStatus) -> None:
    slot = policy()
    assert slot.ended(status, 0, new=False, got_any=False)
    assert slot.next(1000) == waiting()
    assert not slot.ended(status, 0, new=False, got_any=False)  # waited already: done


@pytest.mark.parametrize(
    ("redelivery_wait", "pulls"), [(30.0, [10.0, 10.0, 10.0]), (1.0, [TIMEOUT])]
)
def test_an_available_now_run_waits_longer_for_redeliveries(
    redelivery_wait: float, pulls: list[float]
) -> None:
    """The wait (a 30 s ack wait's third at most per pull) lasts the longer of `fetchTimeout`
    and the wait for redeliveries."""
    slot = SlotPullPolicy(BATCH, TIMEOUT, redelivery_wait, ack_wait=30.0)
    first = slot.next(1000)
    assert first is not None and first.expires is None  # what is ready first
    assert slot.ended(PullStatus.NO_MESSAGES, 0, new=False, got_any=False)
    waited = []
    while (plan := slot.next(1000)) is not None and plan.expires is not None:
        waited.append(plan.expires)
        if not slot.ended(PullStatus.TIMEOUT, 0, new=False, got_any=False):
            break
    assert waited == pulls


def test_a_waiting_pull_lasts_a_third_of_the_ack_wait_at_most() -> None:
    """What a request delivers is held by nothing until it ends: a 6 s wait under a 4 s ack wait
    goes in pulls of 4/3 s (seed 5797 of the simulation's worlds with another client), and one
    that delivers something ends the wait."""
    slot = SlotPullPolicy(BATCH, 6.0, ack_wait=4.0)
    assert slot.ended(PullStatus.NO_MESSAGES, 0, new=False, got_any=False)
    for _ in range(4):
        plan = slot.next(1000)
        assert plan is not None and plan.expires == pytest.approx(4 / 3)
        assert slot.ended(PullStatus.TIMEOUT, 0, new=False, got_any=False)
    last = slot.next(1000)
    assert last is not None and last.expires == pytest.approx(6.0 - 4 * 4 / 3)
    assert slot.ended(PullStatus.TIMEOUT, 1, new=True, got_any=True)
    after = slot.next(1000)
    assert after is not None and after.expires is None
    assert after.grace == pytest.approx(4 / 6)  # a forgotten request is waited for 4/6 s


@pytest.mark.parametrize("status", EMPTY)
def test_an_empty_pull_ends_a_batch_that_took_messages(status: PullStatus) -> None:
    assert not policy().ended(status, 0, new=False, got_any=True)


@pytest.mark.parametrize("status", EMPTY)
def test_a_drained_pull_looks_again_without_waiting(status: PullStatus) -> None:
    slot = policy()
    assert slot.ended(PullStatus.TIMEOUT, 0, new=False, got_any=False)
    assert slot.ended(status, 4, new=True, got_any=True)
    assert slot.next(1000) == no_wait()


def test_a_lost_pin_is_asked_for_again_a_few_times() -> None:
    slot = policy()
    for _ in range(PIN_RETRIES):
        assert slot.ended(PullStatus.PIN_MISMATCH, 0, new=False, got_any=False)
        assert slot.next(1000) == no_wait()
    assert not slot.ended(PullStatus.PIN_MISMATCH, 0, new=False, got_any=False)


@pytest.mark.parametrize("status", TRANSIENT)
def test_interruptions_are_retried_a_few_times(status: PullStatus) -> None:
    slot = policy()
    for _ in range(TRANSIENT_RETRIES):
        assert slot.ended(status, 0, new=False, got_any=True)
    assert not slot.ended(status, 0, new=False, got_any=True)


def test_retries_count_across_kinds_of_interruption() -> None:
    slot = policy()
    for i in range(TRANSIENT_RETRIES):
        assert slot.ended(TRANSIENT[i % len(TRANSIENT)], 0, new=False, got_any=True)
    assert not slot.ended(PullStatus.INTERRUPTED, 0, new=False, got_any=True)


def test_pulls_that_bring_back_only_what_the_batch_holds_end_it() -> None:
    slot = policy()
    for _ in range(HELD_ONLY_PULLS - 1):
        assert slot.ended(PullStatus.BATCH_COMPLETE, BATCH, new=False, got_any=True)
    assert not slot.ended(PullStatus.BATCH_COMPLETE, BATCH, new=False, got_any=True)


def test_one_pull_with_something_new_resets_the_held_only_count() -> None:
    slot = policy()
    for _ in range(HELD_ONLY_PULLS - 1):
        assert slot.ended(PullStatus.BATCH_COMPLETE, BATCH, new=False, got_any=True)
    assert slot.ended(PullStatus.BATCH_COMPLETE, BATCH, new=True, got_any=True)
    for _ in range(HELD_ONLY_PULLS - 1):
        assert slot.ended(PullStatus.BATCH_COMPLETE, BATCH, new=False, got_any=True)


def test_the_early_pull_never_waits() -> None:
    slot = policy()
    assert slot.ended(PullStatus.TIMEOUT, 0, new=False, got_any=False)
    assert slot.early(1000) == no_wait()
    assert slot.early(30) == no_wait(30)
    assert slot.early(0) is None


@pytest.mark.parametrize(
    "error",
    [PullError(409, "Consumer Deleted (S > C)"), PullError(503, "no responders for S > C")],
)
def test_a_gone_consumer_ends_the_batch(error: PullError) -> None:
    assert not policy().refused(error)


def test_a_consumer_capping_bytes_below_ours_is_pulled_uncapped_once() -> None:
    slot = policy()
    refusal = PullError(409, "Exceeded MaxRequestMaxBytes of 1024 (S > C)")
    assert slot.refused(refusal)
    assert slot.next(1000) == no_wait(max_bytes=0)
    with pytest.raises(PullError) as raised:
        slot.refused(refusal)  # uncapped and still refused: nothing left to lift
    assert raised.value is refusal


@pytest.mark.parametrize(
    "error",
    [
        PullError(409, "Exceeded MaxRequestBatch of 10 (S > C)"),
        PullError(409, "Exceeded MaxRequestExpires of 1s (S > C)"),
        PullError(409, "Consumer is push based (S > C)"),
        PullError(400, "Bad Request - idle heartbeat value too large (S > C)"),
        PriorityGroupMisconfigured(400, "Bad Request - Invalid Priority Group (S > C)"),
        PullError(412, "Required Api Level (S > C)"),
    ],
)
def test_other_refusals_fail_the_task(error: PullError) -> None:
    with pytest.raises(PullError) as raised:
        policy().refused(error)
    assert raised.value is error


@pytest.mark.parametrize(
    ("status", "is_complete"),
    [
        (PullStatus.BATCH_COMPLETE, True),
        (PullStatus.MAX_BYTES, True),
        (PullStatus.NO_MESSAGES, False),
        (PullStatus.TIMEOUT, False),
        (PullStatus.PIN_MISMATCH, False),
        (PullStatus.INTERRUPTED, False),
        (PullStatus.HEARTBEAT_MISSED, False),
        (PullStatus.CLIENT_TIMEOUT, False),
    ],
)
def test_complete_means_more_may_be_ready_at_once(status: PullStatus, is_complete: bool) -> None:
    assert complete(status) is is_complete
