"""The simulation's checks themselves (`invariants.py`): each is per checkpoint, and the live
lineage's leftovers count."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterator

import pytest

from tests.simulation.invariants import CAME_BACK, Observed, live_leftovers
from tests.simulation.jetstream import Consumer, Delivery, Stream
from tests.simulation.lateness import REQUEUED, Claim, GiveBacks, Hold
from tests.simulation.scheduler import Participant

pytestmark = pytest.mark.unit


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def observed(stream: Stream, running: list[Participant]) -> Observed:
    give_backs = GiveBacks(None, None, stream, [])  # type: ignore[arg-type]  # not asked here
    return Observed(stream, True, give_backs, who=lambda: running[0])


def with_another_client(
    loop: asyncio.AbstractEventLoop, stream: Stream, now: list[float]
) -> tuple[Observed, Participant]:
    """`observed` with another client of the consumer running, on the clock `now`."""
    other = Participant("other client", "client", loop.create_future())
    checks = observed(stream, [other])
    checks.now = lambda: now[0]
    checks.others.add(other)
    return checks, other


def test_a_new_checkpoint_that_acks_what_an_earlier_one_committed_fails(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Spark's outputs are per checkpoint: what an earlier query committed and never acked, a
    new checkpoint must emit before it acks it (issue 45: the check took the union of the
    checkpoints' sinks, so such a drop passed)."""
    stream = Stream()
    stream.publish("S.p0.k0", 0.0)
    first = Participant("driver#1", "driver", loop.create_future())
    second = Participant("driver#2", "driver", loop.create_future())
    running = [first]
    checks = observed(stream, running)
    checks.query_run(first)
    checks.sink_write(1, {"partition-0": [1]})
    checks.new_checkpoint()
    checks.query_run(second)
    running[0] = Participant("b0/partition-0#0", "task", loop.create_future(), second)
    checks.acked("g-partition-0", 1)
    assert checks.problems == ["acked before commit: message 1 of g-partition-0 (checkpoint 1)"]
    checks.problems.clear()
    running[0] = Participant("b1/partition-0#0", "task", loop.create_future(), first)
    checks.acked("g-partition-0", 1)  # a zombie of the first query acks what it committed
    assert checks.problems == []


def test_loss_is_checked_in_the_checkpoint_that_acked(loop: asyncio.AbstractEventLoop) -> None:
    stream = Stream()
    stream.publish("S.p0.k0", 0.0)
    stream.publish("S.p0.k0", 0.0)
    driver = Participant("driver#1", "driver", loop.create_future())
    checks = observed(stream, [driver])
    checks.query_run(driver)
    checks.sink_write(0, {"partition-0": [1, 2]})
    checks.new_checkpoint()
    checks.sink_write(0, {"partition-0": [2]})
    checks.acked("g-partition-0", 1)  # by the first checkpoint's driver, which committed it
    checks.check_quiet([])
    assert checks.problems == []
    checks.acked_in.pop(1)  # never acked: the live checkpoint must hold it
    checks.check_quiet([])
    assert checks.problems == ["not in any committed batch: messages [1]"]


def head(state: str, count: int) -> tuple[bytes, int]:
    return json.dumps({"state": state, "count": count}).encode(), 1


def test_leftovers_of_the_live_lineage_count() -> None:
    stored = {
        "query.S.g": (json.dumps({"lineage": "live", "replaced": ["old"]}).encode(), 1),
        "live.1.partition-0": head("acked", 2),
        "live.2.partition-0": head("open", 0),
        "live.3.partition-0": head("sealed", 0),
        "old.1.partition-0": head("acked", 1),
    }
    assert live_leftovers(stored) == [
        "live.1.partition-0 (acked, 2 messages)",
        "live.2.partition-0 (open, 0 messages)",
    ]


def test_a_chunk_without_its_entry_may_wait_for_its_lineage_s_give_back() -> None:
    """A chunk left under a removed entry of a replaced lineage whose give-back has not begun
    (not retired yet) goes with it at the next batch planned (seed 2739 of the worlds with
    another client, packed tasks and executors that pause); once given back, it stays."""

    def orphans_left(retired: list[str]) -> list[str]:
        checks = observed(Stream(), [])
        pointer = {"lineage": "live", "replaced": ["old"], "retired": retired}
        checks.check_ledger_quiet(
            {
                "query.S.g": (json.dumps(pointer).encode(), 1),
                "old.1.partition-0.attempt.0": (b"", 1),
            }
        )
        return checks.problems

    assert orphans_left([]) == []
    assert orphans_left(["old"]) == [
        "ledger chunks left behind (their entry is gone): old.1.partition-0.attempt.0"
    ]


def test_another_client_must_not_get_what_the_live_checkpoint_committed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """What another client of the consumer takes is its own, unless the live checkpoint committed
    it: then it fails, but where the world let it out (no run of the query lived all of its
    delivery's ack wait), which is counted apart; what the other client acked is no loss."""
    stream = Stream()
    stream.publish("S.k0", 0.0)
    stream.publish("S.k0", 0.0)
    now = [0.0]
    driver = Participant("driver#1", "driver", loop.create_future())
    task = Participant("b0/c#0#0", "task", loop.create_future(), driver)
    checks, _ = with_another_client(loop, stream, now)
    checks.query_run(driver)
    checks.sink_write(0, {"c#0": [1]})
    held = Delivery(1, 1, due=4.0, owner=task, queued=4.0)  # its wait ran out at 4 s
    now[0] = 4.5
    checks.taken_by_another(2, [Delivery(1, 2, due=4.0, owner=task, queued=4.0)], 4.0)
    checks.acked("c", 2)  # never committed: the other client's
    checks.taken_by_another(1, [held], 4.0)
    assert checks.problems == ["committed, then taken by another client: message 1, batch 0"]
    checks.problems.clear()
    checks.run_ended(driver)  # the query stopped before its wait ran out
    checks.runs_lived[driver] = (0.0, 3.0)
    checks.taken_by_another(1, [held], 4.0)
    assert checks.problems == [] and checks.let_out == {
        "no run of the query lived all its ack wait": 1
    }
    checks.acked("c", 1)
    checks.check_quiet([])
    assert checks.problems == []


def test_another_client_may_process_what_it_got_before_the_query_did(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The other client got a message first, stalled past its ack wait, and the query took the
    redelivery and committed it: when the other client wakes and processes its own delivery,
    that is its doing, counted apart (seed 6024 of the worlds with another client); were the
    other client's delivery the last, after the query's, it would fail."""
    stream = Stream()
    stream.publish("S.k0", 0.0)
    driver = Participant("driver#1", "driver", loop.create_future())
    other = Participant("other client", "client", loop.create_future())
    task = Participant("b0/c#0#0", "task", loop.create_future(), driver)
    running = [task]
    checks = observed(stream, running)
    checks.others.add(other)
    checks.query_run(driver)
    checks.sink_write(0, {"c#0": [1]})
    held = Delivery(1, 2, due=40.0, owner=task, queued=40.0)
    checks.taken_by_another(1, [held], 30.0)
    assert checks.problems == ["committed, then taken by another client: message 1, batch 0"]
    checks.problems.clear()
    checks.taken_by_another(1, [], 30.0, lambda: True)  # delivered to the query since
    assert checks.problems == [] and checks.let_out == {
        "the other client took its delivery after its ack wait ran out": 1
    }


def test_what_an_attempt_gave_back_unrecorded_is_judged_by_the_delivery_before_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Seeds 498 and 970 of the worlds with another client whose executors pause: the retry's
    delivery of message 1 ran out of its wait while the driver (whose keeper held it, sealed)
    stalled; a zombie's pull got the redelivery, and the zombie, its entry taken over, gave it
    back unrecorded; the other client got it. The message had left the query with the stall:
    let out, as if the other client had got it first. A give-back by another attempt than the
    delivery's (a `-NAK` matched by stream sequence) is not passed over, nor one of what the
    attempt recorded."""
    stream = Stream()
    stream.publish("S.k0", 0.0)
    now = [0.0]
    driver = Participant("driver#1", "driver", loop.create_future())
    retry = Participant("b0/c#0#1", "task", loop.create_future(), driver)
    zombie = Participant("b0/c#0#0", "task", loop.create_future(), driver)
    checks, _ = with_another_client(loop, stream, now)
    checks.query_run(driver)
    checks.attempts.held_since[1] = [Hold(1.0, retry), Hold(1.5, retry, sealed=True)]
    checks.attempts.recorded[retry] = {1}
    checks.sink_write(0, {"c#0": [1]})
    checks.stalls.append((driver, 2.0, 6.0))
    kept = Delivery(1, 2, due=5.0, owner=retry, queued=5.0)  # delivered at 1, renewed at 1.5
    taken = Delivery(2, 5, due=9.5, owner=zombie, queued=5.6, given_back=True)
    now[0] = 5.7
    taken.given_back_by = retry
    checks.taken_by_another(1, [kept, taken], 4.0)
    assert checks.problems == ["committed, then taken by another client: message 1, batch 0"]
    checks.problems.clear()
    taken.given_back_by = zombie
    checks.attempts.recorded[zombie] = {1}
    checks.taken_by_another(1, [kept, taken], 4.0)
    assert checks.problems == ["committed, then taken by another client: message 1, batch 0"]
    checks.problems.clear()
    checks.attempts.recorded[zombie] = set()
    checks.taken_by_another(1, [kept, taken], 4.0)
    assert checks.problems == [] and checks.let_out == {"a stall while its ack wait ran out": 1}


@pytest.mark.parametrize("after_the_newer", [True, False])
def test_a_delivery_that_came_after_the_newer_message_s_explains_nothing_itself(
    loop: asyncio.AbstractEventLoop, after_the_newer: bool
) -> None:
    """Seed 969 of the packed worlds with early stops: message 1's delivery had run out of its
    wait behind newer ones of its key on the redelivery queue, which then came first; the next
    delivery of 1 came after 2 to an attempt a user's job stopped, which recorded 2 and gave
    1 back at once as Spark closed it; the batch's full read replayed 2 and took 1 again. The
    closed attempt's delivery, after 2's, explains nothing itself: the one before it does. One
    delivered before 2's was held back by the closed attempt itself: nothing explains that."""
    stream = Stream()
    for _ in range(2):
        stream.publish("S.p1.k2", 0.0)
    driver = Participant("driver#1", "driver", loop.create_future())
    older, early, full = (
        Participant(f"b0/c#{n}", "task", loop.create_future(), driver) for n in ("0", "early", "1")
    )
    early.finished.set_result([2])  # closed by Spark
    checks = observed(stream, [full])
    checks.query_run(driver)
    checks.attempts.writing.update({early: {2}, full: {1}})
    consumer = Consumer("g-partition-1", "S.p1.", stream, 30.0, 100)
    requeued = Delivery(1, 1, 0.0, owner=older, given_back=True, given_back_by=driver, order=1)
    first, then = (2, 3) if after_the_newer else (3, 2)  # 2's delivery, 1's, in their order
    newer = Delivery(1, first, 0.0, owner=early, order=first)
    given_back = Delivery(2, then, 0.0, owner=early, given_back=True, given_back_by=early)
    given_back.order, given_back.given_back_after = then, 3  # given back after both
    consumer.deliveries = {
        1: [requeued, given_back, Delivery(3, 4, 0.0, owner=full, order=4)],
        2: [newer],
    }
    checks.sink_write(0, {"task 0": [2, 1]})
    checks._check_key_order([consumer])
    if after_the_newer:
        assert checks.problems == [] and checks.order_reasons == {REQUEUED: 1}
    else:
        assert checks.problems == [
            "key order: S.p1.k2: message 1 after 2 (batch 0), neither of the README's first two "
            "cases"
        ]


def test_a_stall_of_the_attempt_whose_entry_holds_a_message_lets_it_out(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A retry took over an entry holding message 1, which a sibling slot had dropped as
    recorded: the retry keeps its wait, so its stall past that wait lets the other client have
    it (seed 21621 of the worlds with another client), as the sibling's own stall would not;
    a stall of an attempt of an earlier checkpoint, whose entry holds it too, does not, nor
    one of the retry's before it took the entry over."""
    stream = Stream()
    stream.publish("S.k0", 0.0)
    first, driver = (Participant(f"driver#{n}", "driver", loop.create_future()) for n in (1, 2))
    sibling = Participant("b0/c#1#0", "task", loop.create_future(), driver)
    retry = Participant("b0/c#0#1", "task", loop.create_future(), driver)
    zombie = Participant("b0/c#0#0", "task", loop.create_future(), first)
    running = [retry]
    checks = observed(stream, running)
    checks.query_run(first)
    checks.new_checkpoint()
    checks.query_run(driver)
    checks.sink_write(0, {"c#0": [1]})
    checks.attempts.held_since[1] = [Hold(5.0, zombie), Hold(12.0, retry)]  # recorded; taken over
    dropped = Delivery(1, 2, due=40.0, owner=sibling, queued=40.0)  # delivered at 10
    checks.stalls += [(zombie, 15.0, 45.0), (retry, 2.0, 9.0)]
    checks.taken_by_another(1, [dropped], 30.0)
    assert checks.problems == ["committed, then taken by another client: message 1, batch 0"]
    checks.problems.clear()
    checks.stalls.append((retry, 15.0, 45.0))
    checks.taken_by_another(1, [dropped], 30.0)
    assert checks.problems == [] and checks.let_out == {"a stall while its ack wait ran out": 1}


@pytest.mark.parametrize("case", ["stalled", "stalled before the release", "taken over"])
def test_a_stall_of_the_attempt_taking_a_released_entry_over_lets_it_out(
    loop: asyncio.AbstractEventLoop, case: str
) -> None:
    """Seeds 976, 581 and 1278 of the worlds with early stops and another client: the attempt
    a user's job stopped recorded message 1 and released its entry as Spark closed it; the
    batch's full read, claiming that entry, stalled past the wait before its take-over landed
    (nothing keeps the wait in between), and the other client got it. Not a stall of the
    claiming attempt before the release (its holder kept the wait), nor one once another
    attempt's take-over landed (its keeper has it)."""
    stream = Stream()
    stream.publish("S.k0", 0.0)
    driver = Participant("driver#1", "driver", loop.create_future())
    early, full = (Participant(f"b0/c#{n}", "task", loop.create_future(), driver) for n in "e0")
    checks = observed(stream, [full])
    checks.query_run(driver)
    checks.sink_write(0, {"c#0": [1]})
    checks.attempts.held_since[1] = [Hold(1.0, early)]
    checks.attempts.claims.append(Claim(full, "key", 0.2))  # standing by from 0.2 s
    checks.attempts.releases["key"] = [(2.0, {1})]
    if case == "taken over":
        checks.attempts.taken_over_at["key"] = [2.5]
    checks.stalls.append(
        (full, 0.5, 1.9) if case == "stalled before the release" else (full, 3.0, 6.0)
    )
    checks.taken_by_another(1, [Delivery(1, 1, due=5.0, owner=early, queued=5.0)], 4.0)
    if case == "stalled":
        assert checks.problems == []
        assert checks.let_out == {"a stall of the attempt taking its released entry over": 1}
    else:
        assert checks.problems == ["committed, then taken by another client: message 1, batch 0"]


def test_an_earlier_checkpoints_attempt_that_holds_a_message_later_ends_no_live_hold(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """An attempt of the live checkpoint recorded message 1, then a zombie of an earlier
    checkpoint recorded a later delivery of it in its own lineage's entry, or sealed that entry:
    the live entry still names it, and its attempt's `+WPI` keeps whatever delivery is pending
    (matched by stream sequence), so the live attempt still holds it. Its stall while a sibling's
    dropped delivery waited out its wait lets the other client have the message, and so does its
    death before; the checker took the zombie's record, or seal, for the end of the live hold."""
    stream = Stream()
    stream.publish("S.k0", 0.0)
    first, driver = (Participant(f"driver#{n}", "driver", loop.create_future()) for n in (1, 2))
    sibling = Participant("b0/c#1#0", "task", loop.create_future(), driver)
    recorder = Participant("b0/c#0#0", "task", loop.create_future(), driver)
    zombie = Participant("b0/c#0#0", "task", loop.create_future(), first)
    checks = observed(stream, [recorder])
    checks.query_run(first)
    checks.new_checkpoint()
    checks.query_run(driver)
    checks.sink_write(0, {"c#0": [1]})
    checks.attempts.held_since[1] = [Hold(1.0, recorder), Hold(3.0, zombie)]
    dropped = Delivery(1, 2, due=40.0, owner=sibling, queued=40.0)  # delivered at 10
    checks.stalls.append((recorder, 15.0, 45.0))
    checks.taken_by_another(1, [dropped], 30.0)
    assert checks.problems == [] and checks.let_out == {"a stall while its ack wait ran out": 1}
    checks.stalls.clear()
    checks.let_out.clear()
    checks.attempts.held_since[1] = [Hold(1.0, recorder), Hold(3.0, zombie, sealed=True)]
    recorder.dead, recorder.died = True, 2.0
    checks.taken_by_another(1, [dropped], 30.0)
    assert checks.problems == [] and checks.let_out == {
        "the attempt whose entry held it was killed": 1
    }


def test_another_client_may_get_what_a_sibling_dropped_of_a_killed_attempts_entry(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Seed 16463 of the worlds with another client: an attempt recorded message 1 and was
    killed with its driver; its wait ran out and the server delivered it to the sibling slot
    of the next run, which dropped it as its sibling's entry's; that wait ran out too before
    the retry took the entry over, and the other client got the message the retry then
    committed. As for a delivery of the killed attempt itself, nothing keeps the wait until a
    retry has taken the entry over (once its head stood still 5 s): counted apart. Had the
    retry taken it over before the wait ran out, the attempt been killed only after, or the
    entry been sealed before, it fails (the retry, the attempt, or the driver's keeper of
    sealed entries should have kept it)."""
    stream = Stream()
    stream.publish("S.k0", 0.0)
    now = [0.0]
    first = Participant("driver#1", "driver", loop.create_future())
    second = Participant("driver#2", "driver", loop.create_future())
    killed = Participant("b1/c#0#0", "task", loop.create_future(), first)
    sibling = Participant("b1/c#1#0", "task", loop.create_future(), second)
    retry = Participant("b1/c#0#0", "task", loop.create_future(), second)
    checks, _ = with_another_client(loop, stream, now)
    checks.query_run(first)
    checks.attempts.held_since[1] = [Hold(0.5, killed), Hold(6.0, retry)]  # recorded; taken over
    first.dead = killed.dead = True
    first.died = killed.died = 1.0
    checks.run_ended(first)
    now[0] = 1.2
    checks.query_run(second)
    checks.sink_write(1, {"c#0": [1]})
    dropped = Delivery(3, 3, due=5.5, owner=sibling, queued=5.5)  # delivered at 1.5
    now[0] = 7.0
    checks.taken_by_another(1, [dropped], 4.0)
    assert checks.problems == [] and checks.let_out == {
        "the attempt whose entry held it was killed": 1
    }
    checks.attempts.held_since[1] = [Hold(0.5, killed), Hold(5.0, retry)]  # taken over in time
    checks.taken_by_another(1, [dropped], 4.0)
    assert checks.problems == ["committed, then taken by another client: message 1, batch 1"]
    checks.problems.clear()
    sealed = Hold(0.8, killed, sealed=True)
    checks.attempts.held_since[1] = [Hold(0.5, killed), sealed]  # then killed
    checks.taken_by_another(1, [dropped], 4.0)
    assert checks.problems == ["committed, then taken by another client: message 1, batch 1"]
    checks.problems.clear()
    checks.attempts.held_since[1] = [Hold(0.5, killed)]
    killed.died = 6.0  # alive while the wait ran out
    checks.taken_by_another(1, [dropped], 4.0)
    assert checks.problems == ["committed, then taken by another client: message 1, batch 1"]


class TakenBeforeCommit:
    """Message 1, recorded by a task attempt of the live checkpoint's run at 0.5, delivered to
    it at 0 (its 4 s wait ran out at 4), then to another client, which took it at 4.5."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        stream = Stream()
        stream.publish("S.k0", 0.0)
        self.now = [0.0]
        self.driver = Participant("driver#1", "driver", loop.create_future())
        self.task = Participant("b0/c#0#0", "task", loop.create_future(), self.driver)
        self.checks, self.other = with_another_client(loop, stream, self.now)
        self.checks.query_run(self.driver)
        self.checks.attempts.held_since[1] = [Hold(0.5, self.task)]
        self.held = Delivery(1, 1, due=4.0, owner=self.task, queued=4.0)
        # When the server delivered it again after the other client's delivery (never: inf).
        self.delivered_again_at = math.inf

    def take_then_commit(self, before: Delivery | None = None) -> None:
        self.now[0] = 4.5
        held = self.held if before is None else before
        self.checks.taken_by_another(1, [held], 4.0, lambda: self.now[0] >= self.delivered_again_at)
        self.checks.acked("c", 1)
        self.now[0] = 9.0
        self.checks.sink_write(0, {"c#0": [1]})


def test_another_client_taking_what_the_live_checkpoint_commits_later_fails(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The other order of `test_another_client_must_not_get_what_the_live_checkpoint_committed`:
    the other client took and acked message 1 after the wait of the query's delivery ran out
    while the query lived, then the live checkpoint committed it (from its attempt's entry): a
    duplicate in the world, which neither the sink nor the quiet check saw. So it is when the
    server delivered the message again after the take (the other client's ack lost), as the
    query's entry held it before: it would have committed it anyway."""
    world = TakenBeforeCommit(loop)
    world.take_then_commit()
    assert world.checks.problems == ["taken by another client, then committed: message 1, batch 0"]
    world = TakenBeforeCommit(loop)
    world.delivered_again_at = 6.0
    world.take_then_commit()
    assert world.checks.problems == ["taken by another client, then committed: message 1, batch 0"]
    assert world.checks.let_out == {}


def stall(world: TakenBeforeCommit) -> None:
    world.checks.stalls.append((world.task, 1.0, 6.0))


def killed(world: TakenBeforeCommit) -> None:
    world.task.dead, world.task.died = True, 2.0


def entry_holder_killed(world: TakenBeforeCommit) -> None:
    """The delivery was a sibling slot's, which dropped it as recorded in the attempt's entry."""
    killed(world)
    sibling = Participant("b0/c#1#0", "task", world.task.finished, world.driver)
    world.held = Delivery(1, 1, due=4.0, owner=sibling, queued=4.0)


def no_run_lived(world: TakenBeforeCommit) -> None:
    world.checks.runs_lived[world.driver] = (0.0, 3.0)  # stopped; a later run commits


def came_back(world: TakenBeforeCommit) -> None:
    """The query never held it before the take (delivered to the other client first); the
    other client's ack was lost in a restart and the server delivered it to the query."""
    world.checks.attempts.held_since[1] = [Hold(6.0, world.task)]
    world.held = Delivery(1, 1, due=4.0, owner=None, queued=4.0)
    world.delivered_again_at = 6.0


@pytest.mark.parametrize(
    ("world_does", "why"),
    [
        (stall, "a stall while its ack wait ran out"),
        (killed, "the attempt that held it was killed"),
        (entry_holder_killed, "the attempt whose entry held it was killed"),
        (no_run_lived, "no run of the query lived all its ack wait"),
        (came_back, CAME_BACK),
    ],
)
def test_another_client_taking_what_the_live_checkpoint_commits_later_may_be_let_out(
    loop: asyncio.AbstractEventLoop, world_does: Callable[[TakenBeforeCommit], None], why: str
) -> None:
    """What let out a take after the commit lets out one before it, as it was at the take;
    and the other client's ack lost in a restart, when the query held the message only after
    the take: all counted apart, none fails."""
    world = TakenBeforeCommit(loop)
    world_does(world)
    world.take_then_commit()
    assert world.checks.problems == []
    assert world.checks.let_out == {f"taken before its commit: {why}": 1}


def test_a_take_before_the_commit_is_let_out_by_what_was_so_at_the_take(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The query's ack lost in a restart (an earlier checkpoint committed and acked it), and
    the other client's own delivery overtaken, are let out; a delivery of the other client's
    own before its take is its own (its earlier take is judged); a take on an earlier
    checkpoint is not the live one's; the attempt killed only after the take lets nothing
    out; nor does the query's delivery given back (by a failing attempt that had recorded it)
    before the take."""
    world = TakenBeforeCommit(loop)
    world.checks.acked_in[1] = 0
    world.checks.new_checkpoint()
    world.checks.query_run(world.driver)
    world.take_then_commit()
    assert world.checks.let_out == {
        "taken before its commit: the query's ack lost in a server restart": 1
    }
    world = TakenBeforeCommit(loop)
    world.delivered_again_at = 4.2  # to the query, before the other client took its delivery
    world.take_then_commit()
    assert world.checks.let_out == {
        "taken before its commit: the other client took its delivery after its ack wait ran out": 1
    }
    world = TakenBeforeCommit(loop)
    world.take_then_commit(Delivery(1, 2, due=8.0, owner=world.other, queued=8.0))
    assert world.checks.problems == [] and world.checks.let_out == {}
    world = TakenBeforeCommit(loop)
    world.now[0] = 4.5
    world.checks.taken_by_another(1, [world.held], 4.0)
    world.checks.new_checkpoint()
    world.checks.sink_write(0, {"c#0": [1]})
    assert world.checks.problems == [] and world.checks.let_out == {}
    world = TakenBeforeCommit(loop)
    world.now[0] = 4.5
    world.checks.taken_by_another(1, [world.held], 4.0)
    killed(world)
    world.task.died = 5.0  # only after the take
    world.checks.sink_write(0, {"c#0": [1]})
    assert world.checks.problems == ["taken by another client, then committed: message 1, batch 0"]
    world = TakenBeforeCommit(loop)
    world.held.given_back = True
    world.take_then_commit()
    assert world.checks.problems == ["taken by another client, then committed: message 1, batch 0"]
