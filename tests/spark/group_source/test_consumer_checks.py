"""What each consumer a query reads must stay, without a server: configs under which messages could
be lost are refused with the setting and its fix, and a consumer created again under the same name
is told from the one the query read (by its creation time)."""

from __future__ import annotations

from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

import pytest

from nats_spark.errors import ConfigurationError, ErrorCode, JetStreamApiError, NotFound
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.loop import run_sync
from nats_spark.pcg.config import ElasticConfig, PartitioningFilter, StaticConfig
from nats_spark.pcg.consumers import GroupConsumer, member_consumer, partition_consumer
from nats_spark.pcg.kinds import GroupKind
from nats_spark.pcg.store import GroupEntry
from nats_spark.spark.group_source.driver.consumer_checks import (
    MOVED_CREATION,
    PlacedPastAcked,
    SeenConsumers,
    Skipped,
    check_config,
    first_own_unread,
)
from nats_spark.spark.group_source.driver.consumer_target import ConsumerTarget
from nats_spark.spark.group_source.driver.group_consumers import ensure, from_sequence
from nats_spark.spark.group_source.driver.group_target import GroupTarget
from nats_spark.spark.group_source.driver.slots import Held
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.group_source.slot_partition import UNBOUNDED, Recreation
from nats_spark.spark.shared.options import parse_starting_position

pytestmark = pytest.mark.unit

CREATED = "2026-11-28T19:00:00.123456789Z"
GO_ON = Recreation("go on from ", 9)  # a target's way on, its start 9


def info(created: str = CREATED, floor: int = 0, **config: Any) -> ConsumerInfo:
    return ConsumerInfo(
        {
            "stream_name": "S",
            "name": "C",
            "created": created,
            "ack_floor": {"stream_seq": floor},
            "config": {"ack_policy": "explicit", **config},
        }
    )


@pytest.mark.parametrize(
    ("config", "error"),
    [
        (
            {"max_deliver": 2},
            "consumer 'C' on stream 'S' has max_deliver=2: a message delivered that many times "
            "leaves the consumer unread",
        ),
        ({"max_deliver": 1, "backoff": [10**9]}, "nats consumer edit S C --max-deliver=-1"),
        ({"headers_only": True}, "nats consumer edit S C --no-headers-only"),
        ({"ack_policy": "all"}, "has ack policy 'all'; the source needs explicit acks"),
        ({"ack_policy": "none"}, "use a consumer with ack_policy explicit"),
    ],
)
def test_configs_that_lose_messages_are_refused_with_their_fix(
    config: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigurationError, match=error):
        check_config("S", "C", {"ack_policy": "explicit", **config})


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"max_deliver": -1},
        {"max_deliver": 0},
        {"max_deliver": -1, "backoff": [10**9, 5 * 10**9]},
    ],
)
def test_unlimited_deliveries_pass_backoff_only_times_them(config: dict[str, Any]) -> None:
    check_config("S", "C", {"ack_policy": "explicit", **config})


def test_the_consumers_the_source_creates_pass() -> None:
    """Both layouts of both kinds, with the template the source's options make."""
    template = {"ack_wait": 30 * 10**9, "max_ack_pending": 100_000}
    elastic = ElasticConfig(2, [PartitioningFilter("S.*", [1])]).with_members_added(["m1"])
    for entry in (
        GroupEntry(GroupKind.STATIC, "S", "g", StaticConfig(2, members=["m1"]), 1),
        GroupEntry(GroupKind.ELASTIC, "S", "g", elastic, 1),
    ):
        for consumer in (
            member_consumer(entry, "m1", template),
            partition_consumer(entry, 0, template),
        ):
            check_config(consumer.stream, consumer.name, consumer.config)


def test_a_consumer_created_again_is_told_from_the_one_read() -> None:
    seen = SeenConsumers()
    seen.record("S", "C", info(floor=41))
    seen.look("S", "C", info(floor=57), GO_ON)  # the same consumer, further on
    assert seen.next_after_acked("S", "C") == 58
    with pytest.raises(ConfigurationError) as error:
        seen.look("S", "C", info(created="2026-11-28T19:05:00Z"), GO_ON)
    assert str(error.value) == (
        "consumer 'C' on stream 'S' was deleted and created again while the query ran (created "
        f"{CREATED}, now 2026-11-28T19:05:00Z; {MOVED_CREATION}): the new one delivers again "
        "what the query already committed; go on from 9"
    )
    assert seen.next_after_acked("S", "C") == 58, "the refused consumer is not taken"


def test_an_earlier_created_time_is_the_same_consumer() -> None:
    """The reply to a create that updated an existing consumer may name the update's time; its
    info then names the time it was made (seen on a restart from an older release's store).
    Only a later time is a consumer created again."""
    seen = SeenConsumers()
    seen.record("S", "C", info(created="2026-11-28T21:14:43.287753916Z"))
    seen.look("S", "C", info(created="2026-11-25T09:57:28.627967491Z", floor=5), GO_ON)
    assert seen.next_after_acked("S", "C") == 6
    with pytest.raises(ConfigurationError, match="deleted and created again"):
        seen.look("S", "C", info(created="2026-11-25T09:57:29.1Z"), GO_ON)


def test_where_a_new_consumer_is_exact_it_is_taken() -> None:
    seen = SeenConsumers()
    seen.record("S", "C", info(floor=9))
    seen.look("S", "C", info(created="2026-11-28T19:05:00Z", floor=3), None)
    assert seen.next_after_acked("S", "C") == 4
    assert seen.next_after_acked("S", "other") == 1, "never seen: from the start"


def test_a_consumer_created_again_while_stopped_is_told_from_the_one_remembered() -> None:
    """A restarted driver remembers the consumers as the last one saw them (the pointer's):
    one found created again since is refused at its first look, with where to start; one
    the query created itself where it chose (the fix: `startingPosition`) is taken."""
    seen = SeenConsumers()
    seen.remember({"S": {"C": [CREATED, 41]}})
    seen.record("S", "C", info(created="2026-11-28T19:05:00Z"), placed=False)
    assert seen.next_after_acked("S", "C") == 42
    assert seen.stored() == {"S": {"C": [CREATED, 41]}}, "still to be checked"
    with pytest.raises(ConfigurationError) as error:
        seen.look("S", "C", info(created="2026-11-28T19:05:00Z"), GO_ON)
    assert "was deleted and created again while the query was stopped (created " in str(error.value)
    assert seen.stored() == {"S": {"C": [CREATED, 41]}}, "refused: still the one remembered"
    seen.record("S", "C", info(created="2026-11-28T19:06:00Z", floor=41))
    seen.look("S", "C", info(created="2026-11-28T19:06:00Z", floor=45), GO_ON)
    assert seen.stored() == {"S": {"C": ["2026-11-28T19:06:00Z", 45, 0]}}
    unchanged = SeenConsumers()
    unchanged.remember({"S": {"C": [CREATED, 41]}})
    unchanged.look("S", "C", info(floor=50), GO_ON)
    assert unchanged.next_after_acked("S", "C") == 51


LATER = "2026-11-28T19:05:00Z"


def created_again(floor: int, policy: str = "by_start_sequence") -> ConsumerInfo:
    """The consumer created again, its ack floor `floor` (the sequence before its start when it
    has acked nothing)."""
    return info(LATER, floor, deliver_policy=policy, opt_start_seq=floor + 1)


def remembered(floor: int) -> SeenConsumers:
    seen = SeenConsumers()
    seen.remember({"S": {"C": [CREATED, floor]}})
    return seen


def test_a_consumer_taken_as_created_again_since_the_last_driver_is_handed_on_once() -> None:
    """Created again since the previous driver saw it (the pointer's sighting) and taken: the
    next batch's tasks are told (a batch that driver planned, run again, may hold what the old
    one delivered), and only it; one created again since this driver's own look is not (its
    batches since hold only what the new one delivered)."""
    seen = remembered(0)
    seen.look("S", "C", info(LATER), GO_ON)
    assert seen.handed_started_over() == {("S", "C")}
    assert seen.handed_started_over() == set(), "told once"
    seen.look("S", "C", info("2026-11-28T19:06:00Z"), GO_ON)
    assert seen.handed_started_over() == set()


def test_a_consumer_created_again_between_two_looks_before_a_batch_is_handed_started_over() -> None:
    """This driver's first look (one slot's) saw the consumer the previous driver saw, the next
    (a sibling's, after a stall) a new one: it was created again since that driver's sighting
    all the same, and the batch that driver planned, run again, is told (seed 6791 of the
    worlds with the recreation emitted twice what the batch's first run had sealed)."""
    seen = remembered(0)
    seen.look("S", "C", info(CREATED), GO_ON)
    seen.look("S", "C", info(LATER), GO_ON)
    assert seen.handed_started_over() == {("S", "C")}


def test_a_consumer_created_again_right_after_the_floor_is_read_on_and_kept() -> None:
    """Created again starting right after the floor the query saw (`nats consumer add
    --deliver 31` after 30 acked): it delivers nothing the query read and skips nothing it did
    not, so it is taken, and later looks take it as the one read."""
    seen = remembered(30)
    assert seen.skipped("S", "C", created_again(30)) == range(31, 31)
    seen.look("S", "C", created_again(30), GO_ON)
    assert seen.stored() == {"S": {"C": [LATER, 30, 0]}}
    seen.look("S", "C", info(LATER, 40), GO_ON)
    assert seen.next_after_acked("S", "C") == 41
    assert seen.skipped("S", "C", info(LATER, 40)) is None, "not created again"


def test_a_consumer_created_again_at_or_before_the_floor_is_refused() -> None:
    for policy in ("by_start_sequence", "all", "by_start_time"):
        seen = remembered(30)
        with pytest.raises(ConfigurationError) as error:
            seen.look("S", "C", created_again(29, policy), GO_ON)
        assert str(error.value) == (
            "consumer 'C' on stream 'S' was deleted and created again while the query was "
            f"stopped (created {CREATED}, now {LATER}; {MOVED_CREATION}): the new one delivers "
            "again what the query already committed; go on from 9"
        )
        assert seen.stored() == {"S": {"C": [CREATED, 30]}}, "refused: not taken"


def test_a_consumer_created_again_past_the_floor_is_read_on_only_past_what_was_committed() -> None:
    """Between the floor seen and the new consumer's, every sequence must be one the query
    committed (the ledger's: acked, or sealed in a committed batch), or the new one skips it."""
    seen = remembered(30)
    with pytest.raises(ConfigurationError, match="starts past stream sequence 34, which the query"):
        seen.look("S", "C", created_again(35), GO_ON, Skipped({31, 32, 33}))
    seen.look("S", "C", created_again(35), GO_ON, Skipped(set(range(31, 36))))
    assert seen.next_after_acked("S", "C") == 36


def test_what_a_consumer_created_again_skips_that_the_stream_lost_is_data_loss() -> None:
    seen = remembered(30)
    gone = Skipped({31}, first_seq=40)
    with pytest.raises(ConfigurationError, match="32, which the query never read, is gone"):
        seen.look("S", "C", created_again(39), GO_ON, gone)
    seen.look("S", "C", created_again(39), GO_ON, Skipped({31}, 40, lost_ok=True))
    with pytest.raises(ConfigurationError, match="starts past stream sequence 40"):
        remembered(30).look("S", "C", created_again(41), GO_ON, Skipped((), 40, lost_ok=True))


def test_what_a_consumer_created_again_skips_of_other_subjects_is_not_its_to_read() -> None:
    """A partition's consumer created again past 31-35, of which the query committed 31 and 32:
    33 and 34 are another partition's (`own_from` 35, the first its filter matches), which no
    start of it delivers, so only 35 is refused (seed 46 of the simulation's worlds whose
    operator follows the advice was refused for another partition's message, not committed
    yet). One gone from the stream (below its first sequence) counts as its, subject unknown."""
    seen = remembered(30)
    with pytest.raises(ConfigurationError, match="starts past stream sequence 35, which the query"):
        seen.look("S", "C", created_again(35), GO_ON, Skipped({31, 32}, 20, own_from=35))
    seen.look("S", "C", created_again(34), GO_ON, Skipped({31, 32}, 20, own_from=35))
    with pytest.raises(ConfigurationError, match="33, which the query never read, is gone"):
        remembered(30).look("S", "C", created_again(34), GO_ON, Skipped({31, 32}, 34, own_from=35))


class Messages:
    """A stream's messages by sequence (their subjects); counts the gets."""

    def __init__(self, subjects: dict[int, str]) -> None:
        self.subjects = subjects
        self.gets = 0

    async def get_message(self, stream: str, seq: int, next_by_subject: str) -> Any:
        self.gets += 1
        prefix = next_by_subject.removesuffix(">")
        found = [s for s, subject in sorted(self.subjects.items()) if s >= seq]
        matching = [s for s in found if self.subjects[s].startswith(prefix)]
        if not matching:
            raise NotFound("$JS.API.STREAM.MSG.GET.S", 404, 10037, "no message found")
        return SimpleNamespace(seq=matching[0])


def test_the_first_unread_message_of_a_consumer_s_subjects_is_asked_of_the_stream() -> None:
    """Partition 0's consumer skips 11-20, of which the query did not commit 11, 12, 14 and 19
    (`unread`): 11 and 12 are partition 1's, 13 partition 0's (committed), 14 partition 0's: the
    first of its own is 14, found in two asks. With a filter per partition, each is asked; none
    of its own: `UNBOUNDED`; no filter (the whole stream): not asked."""
    subjects = {seq: "S.p1.k" for seq in range(11, 21)} | {13: "S.p0.k", 14: "S.p0.k"}
    stream = Messages(subjects)
    api: Any = stream
    assert run_sync(first_own_unread(api, "S", ["S.p0.>"], [11, 12, 14, 19])) == 14
    assert stream.gets == 2
    assert run_sync(first_own_unread(api, "S", ["S.p2.>", "S.p0.>"], [11, 12, 14])) == 14
    assert run_sync(first_own_unread(api, "S", ["S.p0.>"], [11, 12, 19])) == UNBOUNDED
    assert run_sync(first_own_unread(api, "S", ["S.p2.>"], [11])) == UNBOUNDED
    before = stream.gets
    assert run_sync(first_own_unread(api, "S", [], [11, 12])) == 0
    assert stream.gets == before


def test_a_consumer_created_again_below_what_an_earlier_checkpoint_acked_is_refused() -> None:
    """Server restarts lost the acks of 1-3 while a query on an earlier checkpoint acked 4-8,
    so the floor stayed 0, and the give-back to this query removed the entry of 4-8: a new
    consumer whose floor is not below the one seen (0) still delivers 4-8 again, which the
    ledger no longer drops (seed 11950 of the simulation's worlds with the recreation). One
    starting past 8 is read on, and a floor at or past the mark drops it."""
    seen = remembered(0)
    seen.given_back({("S", "C"): range(4, 9)})
    with pytest.raises(ConfigurationError) as error:
        seen.look("S", "C", created_again(0, "all"), GO_ON)
    assert str(error.value).endswith(
        ": a query on an earlier checkpoint acked messages up to stream sequence 8, above the "
        "old consumer's ack floor, and the new one would deliver them again; go on from 9"
    )
    with pytest.raises(ConfigurationError, match="up to stream sequence 8"):
        seen.look("S", "C", created_again(7), GO_ON, Skipped(set(range(1, 8))))
    assert seen.stored_acked_earlier() == {"S": {"C": [[4, 8]]}}
    seen.look("S", "C", created_again(8), GO_ON, Skipped({1, 2, 3}))
    assert seen.acked_earlier == {}


def test_the_start_a_refusal_advises_is_past_what_an_earlier_checkpoint_acked() -> None:
    """The refusal's way on (`next_after_acked`, the `--deliver` of the "created again" line)
    starts past what the earlier checkpoint's query acked, not right after the floor seen: a
    consumer created there is read on, what lies between the floors being what this query
    committed (1-3, given back and read again) or what that one acked (4-8). Where a sequence
    between was neither (given back and not read again yet), no start reads on exactly: the
    line names both starts and what each costs, and advises neither (the advice past the marks
    is the consumer just refused)."""
    seen = remembered(0)
    seen.given_back({("S", "C"): range(4, 9)})
    assert seen.next_after_acked("S", "C") == 9
    with pytest.raises(ConfigurationError) as refused:
        seen.look("S", "C", created_again(8), GO_ON, Skipped({1, 2}))
    assert str(refused.value).endswith(
        ": no start reads exactly once: stream sequence 3 was given back by a query on an "
        "earlier checkpoint and never read again, while that query acked messages up to 8; a "
        "consumer that starts at 3 delivers those again, one that starts at 9 skips 3: create "
        "it at either and restart the query"
    ), refused.value
    seen.look("S", "C", created_again(8), GO_ON, Skipped({1, 2, 3}))
    assert seen.next_after_acked("S", "C") == 9


def test_what_a_batch_run_again_holds_counts_as_read_and_bounds_the_advised_start() -> None:
    """Seed 2550 of the simulation's worlds whose operator follows the advice: a query on an
    earlier checkpoint acked 4-5 (their acks lost to a server restart: floor 3), and this
    one's first batch took 4-6 again before its tasks refused the consumer, created again. That
    batch runs again first: a consumer created at 4 delivers 4-6 again, which its entries drop,
    so it is read on (what the ledger holds again of the marks refuses nothing); a mark it does
    not hold still refuses. A refusal as it runs again advises a start no later than what it
    replays: past it (`--deliver 6`), a purge of what the new consumer acked took 4-5 from
    under the batch, which failed on DataLoss at every run."""
    seen = remembered(3)
    seen.given_back({("S", "C"): [4, 5]})
    assert seen.next_after_acked("S", "C") == 6
    replayed = Skipped({4, 5, 6}, replayed={4, 5, 6})
    with pytest.raises(ConfigurationError) as refused:
        seen.look("S", "C", created_again(2), GO_ON, replayed)
    assert str(refused.value).endswith("the query already committed; go on from 4")
    with pytest.raises(ConfigurationError, match="acked messages up to stream sequence 5"):
        seen.look("S", "C", created_again(3), GO_ON, Skipped({4}, replayed={4}))
    seen.look("S", "C", created_again(3), GO_ON, replayed)


def test_an_advice_below_marks_the_batch_does_not_hold_says_to_keep_what_it_holds() -> None:
    """Seed 8 of the simulation's worlds whose operator follows the advice: a query on an
    earlier checkpoint acked 1-6 (their acks lost to server restarts: floor 0); this one
    committed 1-2 again, and the batch it runs again took 3-4 before the consumer was created
    again. The advice bounded by what the batch holds (3) delivers 5-6 again, which nothing
    drops: a consumer created there was refused with that same advice, for ever. No start reads
    exactly once unless the stream keeps 3-4 for the batch: the advice is 7, past both, saying
    so, and a consumer created there is read on; a task's refusal, which knows only what the
    batch holds, says the same."""
    seen = remembered(0)
    seen.given_back({("S", "C"): range(1, 7)})
    go_on = Recreation("go on from ", seen.next_after_acked("S", "C"), "", seen.marks("S", "C"))
    skipped = Skipped({1, 2, 3, 4}, replayed={3, 4})
    advice = (
        "go on from 7, and keep stream sequences 3-4 (do not purge them) until the query has "
        "committed them: no start reads exactly once without them, since the batch it runs "
        "again replays them, and a consumer that starts at or before 6 delivers again what a "
        "query on an earlier checkpoint acked (5-6)"
    )
    for floor in (0, 2):  # created again (DeliverAll), then where the old advice said
        with pytest.raises(ConfigurationError) as refused:
            seen.look("S", "C", created_again(floor), go_on, skipped)
        assert str(refused.value).endswith(advice)
    assert go_on.starting_by({3, 4}) == advice
    assert go_on.starting_by({5, 6}) == "go on from 5", "the batch holds what is marked above"
    seen.look("S", "C", created_again(6), go_on, skipped)


def test_what_an_earlier_checkpoint_acked_is_marked_only_above_the_floor_seen() -> None:
    """The pointer's spans come back (`restore_acked_earlier`) with those taken since; what is
    at or below the floor seen is kept not (a new consumer below that floor is refused anyway),
    nor what the floor of a later sighting the query judged (or placed) passed."""
    seen = remembered(30)
    seen.given_back({("S", "C"): [29, 30], ("S", "D"): [5, 7]})
    assert seen.acked_earlier == {("S", "D"): {5, 7}}
    seen.restore_acked_earlier({"S": {"C": [[28, 31]], "D": [[4, 4], [6, 6]]}})
    assert seen.stored_acked_earlier() == {"S": {"C": [[31, 31]], "D": [[4, 7]]}}
    assert seen.next_after_acked("S", "D") == 8
    seen.look("S", "D", info(floor=5), GO_ON)
    assert seen.stored_acked_earlier() == {"S": {"C": [[31, 31]], "D": [[6, 7]]}}


def test_marks_a_consumer_found_created_again_passed_stay_until_it_is_judged() -> None:
    """A restarted checkpoint's driver on 4.2+ first adopts a lineage of its own (Spark asks
    `initialOffset`), with the pointer's marks (4-5, acked by an earlier checkpoint's query
    whose acks a server restart lost, so the floor seen stayed 3) and no sighting to judge the
    consumer by: it finds the consumer as it is (created again past 5, as the refusal of a
    task of the checkpoint's first run advised) and keeps the marks, in the pointer too. Then
    it adopts the checkpoint's lineage, whose sighting (floor 3) the consumer is judged by:
    4-5 were acked, so it is read on (seed 2550 of the worlds whose operator follows a
    refusal's advice: the found consumer's floor dropped the marks, and it was refused as
    starting past 4, never read, advising a start at 4, before what that query acked)."""
    seen = SeenConsumers()
    seen.restore_acked_earlier({"S": {"C": [[4, 5]]}})
    seen.record("S", "C", created_again(5), placed=False)
    pointer = seen.stored_acked_earlier()
    assert pointer == {"S": {"C": [[4, 5]]}}
    seen.remember({"S": {"C": [CREATED, 3]}})
    seen.restore_acked_earlier(pointer)
    seen.look("S", "C", created_again(5), GO_ON, Skipped(first_seq=4))
    assert seen.stored() == {"S": {"C": [LATER, 5, 0]}}
    assert seen.acked_earlier == {}, "judged: its floor passed them"


def static_partition_consumer() -> GroupConsumer:
    """Partition 0's consumer of a static group: one the query creates where it chooses."""
    entry = GroupEntry(GroupKind.STATIC, "S", "g", StaticConfig(2, members=["m1"]), 1)
    return partition_consumer(entry, 0, {"ack_wait": 30 * 10**9})


def seen_before(name: str, floor: int, acked_earlier: Collection[int]) -> SeenConsumers:
    """Consumer `name` as the query's pointer remembers it (created at CREATED, its ack floor
    `floor`), with what a query on an earlier checkpoint acked of it (`acked_earlier`)."""
    seen = SeenConsumers()
    seen.remember({"S": {name: [CREATED, floor]}})
    seen.given_back({("S", name): acked_earlier})
    return seen


def refusal_placing(api: Any, consumer: GroupConsumer, seen: SeenConsumers, start: int) -> str:
    """The line the query refuses `consumer` with as it creates it at `start` through `api`."""
    client: Any = SimpleNamespace(api=api)
    with pytest.raises(ConfigurationError) as error:
        run_sync(ensure(client, consumer, seen, from_sequence(start)))
    return str(error.value)


class CreatingApi:
    """Creates a consumer where its config starts it (its floor the sequence before) and notes
    the deletions."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def create_consumer(self, stream: str, name: str, config: dict[str, Any]) -> ConsumerInfo:
        return info(LATER, int(config.get("opt_start_seq", 1)) - 1, **config)

    async def delete_consumer(self, stream: str, name: str) -> None:
        self.deleted.append(name)


def static_target(seen: SeenConsumers) -> tuple[GroupTarget, Any]:
    """A static group's target reading partition 0's consumer, its sightings `seen`, and the
    slot of that consumer (what `GroupTarget.recreation` reads of it)."""
    options = parse_options({"servers": "nats://127.0.0.1:1", "stream": "S", "group": "g"})
    target = GroupTarget(options)
    target.kind = GroupKind.STATIC
    target.seen = seen
    slot: Any = SimpleNamespace(stream="S", consumer=static_partition_consumer().name)
    return target, slot


def placing(api: Any, consumer: GroupConsumer, seen: SeenConsumers, start: int) -> ConsumerInfo:
    """What the query records of `consumer` as it creates it at `start` through `api`."""
    client: Any = SimpleNamespace(api=api)
    run_sync(ensure(client, consumer, seen, from_sequence(start)))
    return info(LATER, start - 1, **{**consumer.config, **(from_sequence(start) or {})})


def test_a_consumer_the_query_places_below_what_an_earlier_checkpoint_acked_is_judged() -> None:
    """A static group's consumer the query creates where it chose (`startingPosition`, or a
    layout move) is held to what a query on an earlier checkpoint acked, as one created again
    by someone is: placed at 4 below 4-8, it would deliver them again, and nothing drops them.
    It is judged at its first look (what a batch run again holds of them is known only then),
    against the sighting the pointer remembers, which it keeps: refused, it is left to the
    operator as the line says, and the next run judges it again; placed past 8, it is read."""
    consumer = static_partition_consumer()
    seen = seen_before(consumer.name, 0, range(4, 9))
    target, slot = static_target(seen)
    api = CreatingApi()
    placed = placing(api, consumer, seen, 4)
    assert seen.stored() == {"S": {consumer.name: [CREATED, 0]}}, "the pointer's kept"
    with pytest.raises(ConfigurationError) as refused:
        target.look(slot, placed, Skipped(set(range(1, 4))))
    assert str(refused.value).endswith(
        ": a query on an earlier checkpoint acked messages up to stream sequence 8, above the "
        "old consumer's ack floor, and the new one would deliver them again; to read nothing "
        f"twice, delete it (nats consumer rm S {consumer.name}) and restart the query with "
        "startingPosition=sequence:9, so it creates the consumer right after the last message "
        "it acked, or at the first one a batch not committed yet holds (the option applies only "
        "to consumers it creates)"
    )
    assert api.deleted == []
    assert seen.stored() == {"S": {consumer.name: [CREATED, 0]}}, "still judged next run"
    placing(api, consumer, seen, 9)  # as the line says, on the next run
    assert seen.stored() == {"S": {consumer.name: [LATER, 8, 0]}}
    assert seen.acked_earlier == {}


def test_a_static_group_s_advice_followed_runs_the_logged_batch_again_exactly() -> None:
    """Seed 2550 of the simulation's worlds whose operator follows the advice, for a static
    group's consumer (not simulated: the worlds read a plain one). A query on an earlier
    checkpoint acked 4-5 (their acks lost to a server restart: floor 3); this one's batch took
    4-6 again, logged, and is refused as it runs again: the consumer was created again (from
    the start). The advice starts at 4, the first the batch holds: past it
    (`startingPosition=sequence:6`), what purges acked messages (an interest stream, an
    operator) takes 4-5 from under the batch, which fails on `DataLoss` at every run. Created
    there, it was refused in turn as below the marks, advising 6 again. It is read on now: the
    batch's entries drop its deliveries of 4-6, and its tasks are told it started over."""
    consumer = static_partition_consumer()
    key = ("S", consumer.name)
    replayed = Skipped({4, 5, 6}, replayed={4, 5, 6})
    target, slot = static_target(seen_before(consumer.name, 3, [4, 5]))
    with pytest.raises(ConfigurationError) as refused:
        target.look(slot, info(LATER, 0, **consumer.config), replayed)
    assert f"delete it (nats consumer rm S {consumer.name}) and restart the query with " in str(
        refused.value
    )
    assert "startingPosition=sequence:4, so it creates the consumer" in str(refused.value)
    seen = seen_before(consumer.name, 3, [4, 5])  # the next run, the consumer deleted
    target, slot = static_target(seen)
    placed = placing(CreatingApi(), consumer, seen, 4)
    target.look(slot, placed, replayed)
    assert seen.handed_started_over() == {key}
    assert seen.stored() == {"S": {consumer.name: [LATER, 3, 0]}}
    assert seen.stored_acked_earlier() == {"S": {consumer.name: [[4, 5]]}}, "until acked past"


def test_a_consumer_placed_below_the_marks_with_no_sighting_is_judged_as_placed() -> None:
    """With no sighting to judge it by (a new checkpoint, or a restarted one's driver on the
    lineage of its own it began as Spark asked `initialOffset`, before it takes up the
    checkpoint's), a consumer the query placed below the pointer's marks (4-5) is judged as
    placed: refused when the ledger does not hold them again (the caller deletes it, so the
    next run creates it again where it is told), its advice no later than what a batch run
    again holds unless that start delivers marks nothing holds; read on when that batch holds
    them."""
    consumer = static_partition_consumer()
    name = consumer.name
    seen = SeenConsumers()
    seen.restore_acked_earlier({"S": {name: [[4, 5]]}})
    placed = placing(CreatingApi(), consumer, seen, 4)
    line = (
        f"consumer {name!r} on stream 'S' was to start at stream sequence 4, but a query on an "
        "earlier checkpoint acked messages up to stream sequence 5 of it, which it would deliver "
        "again; the source deleted it: to read nothing twice, restart the query with "
        "startingPosition=sequence:{}, so it creates the consumer right after the last message "
        "it acked, or at the first one a batch not committed yet holds (the option applies only "
        "to consumers it creates)"
    )
    # Held by the batch run again, 4 bounds the advice only where 5 is held too: 4 delivers 5
    # again, so it is 6 then, with 4 to keep (`Recreation.starting_by`).
    keep = (
        ", and keep stream sequences 4 (do not purge them) until the query has committed them: "
        "no start reads exactly once without them, since the batch it runs again replays them, "
        "and a consumer that starts at or before 5 delivers again what a query on an earlier "
        "checkpoint acked (5)"
    )
    for skipped, end in [(Skipped(), ""), (Skipped({4}, replayed={4}), keep)]:
        with pytest.raises(PlacedPastAcked) as refused:
            seen.look("S", name, placed, GO_ON, skipped)
        assert str(refused.value) == line.format(6) + end
    seen.look("S", name, placed, GO_ON, Skipped({4, 5}, replayed={4, 5}))
    seen.look("S", name, placed, GO_ON)  # judged once: what the batch took is its own now


class FindingApi(CreatingApi):
    """Finds the consumer created meanwhile by someone else (DeliverAll, as a member of the group
    heals its own), of the same membership: a create with another start is refused as existing
    with another config, and `ensure_group_consumer` takes the one found as it is."""

    def __init__(self, found: ConsumerInfo) -> None:
        super().__init__()
        self.found = found

    async def create_consumer(self, stream: str, name: str, config: dict[str, Any]) -> ConsumerInfo:
        raise JetStreamApiError(
            f"$JS.API.CONSUMER.CREATE.{stream}.{name}",
            400,
            ErrorCode.CONSUMER_EXISTS_WITH_OTHER_CONFIG,
            "consumer already exists",
        )

    async def consumer_info(self, stream: str, name: str) -> ConsumerInfo:
        return self.found


@pytest.mark.parametrize("acked_earlier", [range(0), range(4, 9)])
def test_a_consumer_someone_else_created_as_the_query_placed_it_is_refused_and_left(
    acked_earlier: range,
) -> None:
    """A static group's consumer the query creates at 9 (`startingPosition`, or a layout move
    that deleted it first) was created meanwhile by someone else from the start (a member of the
    group healing its own), and the create finds it. It is not the query's: taken as placed at
    9, it was read on from 1, delivering again what the query committed (its sighting, floor 3,
    dropped, nothing judged it); below what an earlier checkpoint acked (4-8), the query deleted
    it as its own. It is refused, neither deleted nor recorded."""
    consumer = static_partition_consumer()
    seen = seen_before(consumer.name, 3, acked_earlier)
    api = FindingApi(info(LATER, 0, **{**consumer.config, "deliver_policy": "all"}))
    assert refusal_placing(api, consumer, seen, 9) == (
        f"consumer {consumer.name!r} on stream 'S' was created by someone else as the query "
        "created it to start with deliver policy by_start_sequence at 9: it starts with deliver "
        "policy all, and would deliver again what the query read or skip what it did not; the "
        "source left it as it is: stop what creates it (a member of the group running beside the "
        f"query), delete it (nats consumer rm S {consumer.name}) and restart the query"
    )
    assert api.deleted == []
    assert seen.stored() == {"S": {consumer.name: [CREATED, 3]}}, "not recorded"


def test_a_consumer_created_at_a_start_time_is_the_query_s_as_the_server_writes_it() -> None:
    """The server writes a start time its own way (a fraction without its trailing zeros): the
    consumer the query placed there is still its own."""
    consumer = static_partition_consumer()
    position = parse_starting_position("time:2026-11-23T08:00:00.5Z")
    written = {"deliver_policy": "by_start_time", "opt_start_time": "2026-11-23T08:00:00.5Z"}
    api = FindingApi(info(LATER, 0, **{**consumer.config, **written}))
    client: Any = SimpleNamespace(api=api)
    seen = SeenConsumers()
    run_sync(ensure(client, consumer, seen, position.deliver))
    assert seen.stored() == {"S": {consumer.name: [LATER, 0, 0]}}


@pytest.mark.parametrize("policy", ["new", "last", "last_per_subject"])
def test_a_consumer_created_again_whose_start_may_move_is_refused(policy: str) -> None:
    with pytest.raises(ConfigurationError, match=f"its deliver policy {policy} lets the server"):
        remembered(30).look("S", "C", created_again(30, policy), GO_ON)


def test_an_edit_while_the_query_runs_is_refused_at_the_next_look() -> None:
    seen = SeenConsumers()
    seen.record("S", "C", info())
    with pytest.raises(ConfigurationError, match="has max_deliver=3"):
        seen.look("S", "C", info(max_deliver=3), GO_ON)


class Api:
    def __init__(self, shown: ConsumerInfo) -> None:
        self.shown = shown

    async def consumer_info(self, stream: str, consumer: str) -> ConsumerInfo:
        return self.shown


def plain_target(shown: ConsumerInfo) -> tuple[ConsumerTarget, Any]:
    options = parse_options({"servers": "nats://127.0.0.1:1", "stream": "S", "consumer": "C"})
    return ConsumerTarget(options), SimpleNamespace(api=Api(shown))


def test_plain_consumer_with_max_deliver_is_refused_when_resolved() -> None:
    target, client = plain_target(info(max_deliver=2))
    with pytest.raises(ConfigurationError, match="--max-deliver=-1"):
        run_sync(target.resolve(client, Held()))


def test_plain_consumer_deleted_or_created_again_says_where_to_start() -> None:
    target, client = plain_target(info(floor=120))
    [slot] = run_sync(target.resolve(client, Held()))
    fix = (
        "to read nothing twice, (re)create it with nats consumer add S C --deliver 121 (its other "
        "settings as before): it starts right after the last message the query acked, or at the "
        "first one a batch not committed yet holds; then restart the query"
    )
    with pytest.raises(ConfigurationError) as error:
        target.look(slot, info(created="2026-11-28T19:05:00Z"))
    assert str(error.value).endswith(fix)
    with pytest.raises(ConfigurationError) as error:
        run_sync(target.heal(client, slot))
    assert str(error.value).startswith("consumer 'C' on stream 'S' was deleted while the query ran")
    assert str(error.value).endswith(fix)
    target.seen.given_back({("S", "C"): [125, 126]})
    assert str(target.recreation(slot)).startswith(
        "to read nothing twice, (re)create it with nats consumer add S C --deliver 127 "
    ), "past what a query on an earlier checkpoint acked above the floor"
