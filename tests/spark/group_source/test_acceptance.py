"""The slot's acceptance rule without a server: what it takes, skips and acks, and what it reads."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from nats_spark.errors import ConfigurationError, NotFound
from nats_spark.jetstream.acks import ACK, NAK, InProgressKeeper
from nats_spark.jetstream.pull import Deliveries
from nats_spark.loop import run_sync
from nats_spark.spark.group_source.slot_partition import ConsumerSighting, Recreation
from nats_spark.spark.group_source.task import acceptance as module
from nats_spark.spark.group_source.task.acceptance import Acceptance

pytestmark = pytest.mark.unit


SENT = 0.0  # when a chunk's pull request was sent


def chunk(*deliveries: tuple[int, int]) -> Deliveries:
    """Deliveries of (stream sequence, delivery count)."""
    found = Deliveries()
    for seq, delivered in deliveries:
        found.subjects.append(b"S.k")
        found.replies.append(f"$JS.ACK.S.C.{delivered}.{seq}.{seq}.{1000 + seq}.0".encode())
        found.data.append(b"x")
        found.headers.append(None)
    return found


class Entry:
    def __init__(self, taken: set[int], siblings: set[int]) -> None:
        self.taken = taken
        self.siblings = siblings
        self.reads = 0
        self.delivering_again = False
        self.partition = SimpleNamespace(stream="S", consumer="C")

    async def recorded_by_siblings(self) -> set[int]:
        self.reads += 1
        return self.siblings

    async def held_by_the_batch(self) -> set[int]:
        return self.taken | self.siblings


def keeper(held: dict[int, bytes]) -> InProgressKeeper:
    """The task's keeper, holding `held` (it never sends here)."""
    kept = InProgressKeeper(None, 30.0, "slot")  # type: ignore[arg-type]
    kept.held = held
    return kept


class History:
    def __init__(self, emitted: set[int]) -> None:
        self.emitted = emitted
        self.reads = 0

    async def dedupe(self) -> set[int]:
        self.reads += 1
        return self.emitted


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> dict[bytes, list[bytes]]:
    """The ack subjects acked and given back (NAKed), as sent."""
    by_kind: dict[bytes, list[bytes]] = {ACK: [], NAK: []}

    async def publish_acks(nc: Any, replies: list[bytes], kind: bytes = ACK) -> int:
        by_kind[kind].extend(replies)
        return len(replies)

    monkeypatch.setattr(module, "publish_acks", publish_acks)
    return by_kind


@pytest.fixture
def acked(sent: dict[bytes, list[bytes]]) -> list[bytes]:
    return sent[ACK]


def acceptance(
    taken: set[int] | None = None,
    held: dict[int, bytes] | None = None,
    emitted: set[int] | None = None,
    below: int = 0,
    siblings: set[int] | None = None,
    sighting: ConsumerSighting | None = None,
    created: Callable[[], Awaitable[str]] | None = None,
) -> tuple[Acceptance, Entry, History]:
    entry = Entry(taken or set(), siblings or set())
    history = History(emitted or set())
    accept = Acceptance(
        entry,  # type: ignore[arg-type]
        keeper(held or {}),
        history,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        below,
        siblings is not None,
        sighting,
        created,
    )
    return accept, entry, history


def test_new_deliveries_are_taken_whole_without_reading_anything(acked):
    accept, entry, history = acceptance(below=10)
    got = run_sync(accept.accept(chunk((11, 1), (12, 1), (13, 1)), SENT))
    assert got.rows is None and len(got.replies) == 3 and got.acked == 0
    assert entry.taken == {11, 12, 13} and set(accept.keeper.held) == {11, 12, 13}
    assert history.reads == 0 and accept.emitted is None and not acked


def test_a_redelivery_within_the_batch_is_skipped_and_its_new_reply_held(acked):
    accept, entry, _ = acceptance(taken={5}, held={5: b"old"})
    deliveries = chunk((5, 2), (6, 1), (6, 2))
    got = run_sync(accept.accept(deliveries, SENT))
    assert got.rows == [1] and got.replies == [deliveries.replies[1]]
    assert accept.keeper.held == {5: deliveries.replies[0], 6: deliveries.replies[2]}
    assert entry.taken == {5, 6} and not acked


def test_what_an_earlier_batch_emitted_is_acked_and_dropped(acked):
    accept, entry, history = acceptance(emitted={3, 4}, below=4)
    deliveries = chunk((3, 2), (4, 2), (5, 1))
    got = run_sync(accept.accept(deliveries, SENT))
    assert got.rows == [2] and got.acked == 2 and accept.redundant == 2
    assert acked == deliveries.replies[:2] and entry.taken == {5}
    run_sync(accept.accept(chunk((2, 2)), SENT))
    assert history.reads == 1, "the earlier batches' sequences are read once"


def test_below_the_earlier_batches_but_taken_already_reads_nothing(acked):
    accept, _, history = acceptance(taken={3}, held={3: b"old"}, below=4)
    run_sync(accept.accept(chunk((3, 2), (7, 1)), SENT))
    assert history.reads == 0


def test_what_a_sibling_recorded_is_skipped_once_a_redelivery_comes(acked):
    accept, entry, _ = acceptance(siblings={8})
    got = run_sync(accept.accept(chunk((9, 1)), SENT))
    assert got.rows is None and entry.reads == 0, "first deliveries need no look"
    got = run_sync(accept.accept(chunk((8, 2), (10, 1)), SENT))
    assert got.rows == [1] and entry.reads == 1
    assert entry.taken == {9, 10} and 8 not in accept.keeper.held and not acked


RECREATION = Recreation("to read nothing twice, recreate it at ", 11)
CREATED = "2026-11-29T10:00:00Z"  # when the driver saw the consumer created


def test_a_delivery_at_or_below_the_floor_no_batch_holds_stops_the_batch(sent):
    """A consumer delivers what it acked again only when its server lost the ack (an earlier
    batch not settled yet holds it: acked and dropped) or when it is a new one (DeliverAll):
    the batch stops before it takes anything (its task gives the chunk back whole as it stops:
    `test_a_chunk_of_a_consumer_created_again_is_given_back_whole`)."""
    accept, entry, _ = acceptance(
        emitted={9}, below=9, sighting=ConsumerSighting(10, 0, RECREATION)
    )
    got = run_sync(accept.accept(chunk((9, 2), (11, 1)), SENT))  # a lost ack's redelivery, then new
    assert got.rows == [1] and sent[ACK] == [chunk((9, 2)).replies[0]]
    again = chunk((1, 1), (2, 1), (12, 1))
    with pytest.raises(ConfigurationError) as refused:
        run_sync(accept.accept(again, SENT))
    assert "'C' on stream 'S' was deleted and created again while a batch read it" in str(
        refused.value
    )
    assert "stream sequence 1 again, at or below its ack floor 10" in str(refused.value)
    assert str(refused.value).endswith(str(RECREATION))
    assert not sent[NAK] and len(sent[ACK]) == 1
    assert entry.taken == {11}, "nothing of the new consumer taken"


def test_a_refusal_advises_a_start_no_later_than_what_the_batch_holds(sent):
    """What this slot and its siblings recorded in the batch, a run again of it replays from the
    stream: the advice starts no later than the first of it (seed 2550 of the simulation's
    worlds whose operator follows the advice: a sibling took 4-6 from the consumer created
    again, the advice said 6, past what an earlier checkpoint acked, and a purge of what the
    consumer created there acked took 4-5 from under the batch: DataLoss at every run)."""
    sighting = ConsumerSighting(3, 0, Recreation("recreate it at ", 6))
    accept, entry, _ = acceptance(siblings={4, 5, 6}, sighting=sighting)
    run_sync(accept.accept(chunk((7, 1)), SENT))
    with pytest.raises(ConfigurationError) as refused:
        run_sync(accept.accept(chunk((2, 1)), SENT))
    assert str(refused.value).endswith("recreate it at 4")
    assert entry.taken == {7}


@pytest.mark.parametrize("created_now", [CREATED, "2026-11-29T10:00:05Z", "", None])
def test_below_the_floor_the_consumer_s_creation_time_tells_a_lost_ack_from_a_new_consumer(
    acked: list[bytes], created_now: str | None
) -> None:
    """A query on a new checkpoint gave back (and so holds no longer) a batch the consumer
    acked; a server restart lost those acks and one comes back: the consumer is the one the
    driver saw (created no later), so the delivery is taken as the new query's. Created later,
    or not known (None: the consumer is gone), it is a new consumer's: the batch stops."""

    async def created() -> str:
        if created_now is None:
            raise NotFound("$JS.API.CONSUMER.INFO.S.C", 404, 10014, "consumer not found")
        return created_now

    accept, entry, _ = acceptance(
        sighting=ConsumerSighting(10, 0, RECREATION, CREATED), created=created
    )
    if created_now == CREATED:
        got = run_sync(accept.accept(chunk((4, 2), (11, 1)), SENT))
        assert got.rows is None and entry.taken == {4, 11}
    else:
        with pytest.raises(ConfigurationError, match="deleted and created again"):
            run_sync(accept.accept(chunk((4, 2), (11, 1)), SENT))
        assert not entry.taken


def test_with_siblings_a_consumer_sequence_seen_before_checks_every_delivery(acked):
    """A consumer sequence at or below the one the driver saw is a new consumer's: its first
    deliveries may be of what a sibling took in this batch before, so they are checked against
    the siblings' records (and at record time, `SlotEntry.record`)."""
    accept, entry, _ = acceptance(siblings={12}, sighting=ConsumerSighting(0, 20, RECREATION))
    got = run_sync(accept.accept(chunk((21, 1)), SENT))  # consumer sequence 21: the same consumer
    assert got.rows is None and entry.reads == 0 and not entry.delivering_again
    got = run_sync(accept.accept(chunk((12, 1), (13, 1)), SENT))  # consumer sequences 12, 13
    assert entry.delivering_again and entry.reads == 1
    assert got.rows == [1] and entry.taken == {21, 13}


def test_with_siblings_a_consumer_created_again_since_planning_checks_every_delivery(acked):
    """A batch run again after a restart, whose consumer the driver saw created again since it
    was planned (`started_over`): the new one's first deliveries, whatever their consumer
    sequence, may be of what a sibling took in the batch's earlier run (seeds 632 and 1650 of
    the simulation's worlds with the recreation emitted one twice)."""
    sighting = ConsumerSighting(0, 0, RECREATION, CREATED, started_over=True)
    accept, entry, _ = acceptance(siblings={1}, sighting=sighting)
    got = run_sync(accept.accept(chunk((1, 1), (2, 1)), SENT))  # consumer sequences 1, 2
    assert entry.delivering_again and entry.reads == 1
    assert got.rows == [1] and entry.taken == {2}, "the sibling's 1 is left to it"


def test_with_siblings_a_first_delivery_of_what_a_batch_holds_checks_every_delivery(acked):
    """A first delivery of a message an earlier batch emitted is a new consumer's too."""
    accept, entry, _ = acceptance(
        emitted={3}, below=3, siblings={8}, sighting=ConsumerSighting(0, 0, RECREATION)
    )
    run_sync(accept.accept(chunk((3, 1)), SENT))
    assert entry.delivering_again and acked == chunk((3, 1)).replies
    got = run_sync(accept.accept(chunk((8, 1), (9, 1)), SENT))
    assert got.rows == [1] and entry.taken == {9}
