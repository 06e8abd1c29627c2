"""Group administration against a real server: KV bytes as Go writes them, CAS, streams, members."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from spark_helpers import (
    api,
    key_for,
    kv,
    make_stream,
    needs_server,
    publish_one,
    static_stream,
    wait_until,
)

from nats_spark.errors import ConfigurationError, ServerTooOld
from nats_spark.jetstream.api import to_nanos
from nats_spark.loop import run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.config import MemberMapping, PartitioningFilter
from nats_spark.pcg.consumers import PRIORITY_GROUP, ensure_group_consumer, member_consumer
from nats_spark.pcg.partitioning import elastic_subject_transforms, partition_for
from nats_spark.pcg.store import GroupChanged, GroupKind, GroupNotFound

STATIC, ELASTIC = GroupKind.STATIC, GroupKind.ELASTIC


def by_token(unique: str) -> list[PartitioningFilter]:
    """Partitioning on the second token of `<unique>.<token>` (any server since 2.11)."""
    return [PartitioningFilter(f"{unique}.*", [1])]


def stored(client, kind: GroupKind, stream: str, group: str) -> bytes:
    return kv(client, kind).get(f"{stream}.{group}").value


# --- KV entries in Go's shapes ----------------------------------------------------------------


def test_static_entries_are_written_in_go_field_shapes(client, unique):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    run_sync(admin.create_static(client.target, stream, "b", 3, ["m1", "m2"], filters=["foo.*"]))
    assert stored(client, STATIC, stream, "b") == (
        b'{"max_members":3,"filters":["foo.*"],"members":["m1","m2"]}'
    )
    mappings = [MemberMapping("a", [1]), MemberMapping("b", [0])]
    run_sync(admin.create_static(client.target, stream, "m", 2, member_mappings=mappings))
    assert stored(client, STATIC, stream, "m") == (
        b'{"max_members":2,"member_mappings":[{"member":"a","partitions":[1]},'
        b'{"member":"b","partitions":[0]}]}'
    )
    assert run_sync(admin.list_static(client.target, stream)) == ["b", "m"]
    info = run_sync(admin.static_info(client.target, stream, "b"))
    assert (info.config.max_members, info.config.members) == (3, ["m1", "m2"])


def test_static_create_errors_are_one_line(client, unique):
    with pytest.raises(admin.StreamNotFound, match="stream 'nope-.*' does not exist"):
        run_sync(admin.create_static(client.target, f"nope-{unique}", "g", 2, ["a"]))
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    with pytest.raises(ConfigurationError, match="max_members is 0"):
        run_sync(admin.create_static(client.target, stream, "g", 0, ["a"]))
    run_sync(admin.create_static(client.target, stream, "g", 2, ["a"]))
    with pytest.raises(ConfigurationError, match="already exists") as raised:
        run_sync(admin.create_static(client.target, stream, "g", 2, ["a"]))
    assert "\n" not in str(raised.value)
    with pytest.raises(GroupNotFound, match="'missing'.*not found"):
        run_sync(admin.static_info(client.target, stream, "missing"))


def test_elastic_entries_are_written_in_go_field_shapes(client, unique):
    needs_server(client, admin.WHOLE_SUBJECT_HASHING, "hashing whole subjects")
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    filters = [PartitioningFilter(f"{unique}.*", [1])]
    run_sync(admin.create_elastic(client.target, stream, "w", 4, filters, 100, 2048))
    assert stored(client, ELASTIC, stream, "w") == (
        b'{"max_members":4,"partitioning_filters":[{"filter":"' + unique.encode() + b'.*",'
        b'"partitioning_wildcards":[1]}],"max_buffered_msg":100,"max_buffered_bytes":2048}'
    )
    run_sync(admin.create_elastic(client.target, stream, "n", 2, None))
    assert stored(client, ELASTIC, stream, "n") == b'{"max_members":2,"partitioning_filters":null}'
    run_sync(admin.add_members(client.target, stream, "n", ["m2", "m1", "m2"]))
    assert stored(client, ELASTIC, stream, "n") == (
        b'{"max_members":2,"partitioning_filters":null,"members":["m2","m1"]}'
    )
    run_sync(admin.drop_members(client.target, stream, "n", ["m2", "unknown"]))
    assert stored(client, ELASTIC, stream, "n") == (
        b'{"max_members":2,"partitioning_filters":null,"members":["m1"]}'
    )
    assert run_sync(admin.list_elastic(client.target, stream)) == ["n", "w"]


@pytest.mark.unit
@pytest.mark.parametrize(
    "filters",
    [None, [PartitioningFilter("orders.*", [1]), PartitioningFilter("audit.>", [])]],
    ids=["no-filters", "a-filter-without-wildcards"],
)
def test_whole_subject_hashing_is_refused_by_name_before_2_12(filters):
    """nats-server 2.11 refuses a `{{Partition(n)}}` transform without wildcard indexes with
    'invalid mapping destination: not enough arguments': the group is refused first, naming
    the version and the fix, before anything is written (the client has no API to write
    with)."""
    older = SimpleNamespace(server_version=(2, 11, 11))
    with pytest.raises(ServerTooOld) as refused:
        run_sync(admin.create_elastic(older, "S", "g", 4, filters))
    message = str(refused.value)
    assert "2.12 or newer" in message and "2.11.11" in message
    assert "--partition-wildcards" in message
    assert "\n" not in message


# As Go's json.Marshal writes them (it escapes '>' as \u003e).
GO_WRITTEN = [
    b'{"max_members":4,"partitioning_filters":null,"max_buffered_msg":-1,'
    b'"max_buffered_bytes":-1,"members":["b","a"]}',
    b'{"max_members":4,"partitioning_filters":[{"filter":"foo.\\u003e",'
    b'"partitioning_wildcards":null}],"max_buffered_msg":-1,"members":["b","a"]}',
]


@pytest.mark.parametrize("value", GO_WRITTEN)
def test_go_written_entry_changes_only_in_members(client, unique, value):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    kv(client, ELASTIC).put(f"{stream}.g", value)
    entry = run_sync(admin.add_members(client.target, stream, "g", ["c", "a"]))
    expected = value.replace(b'"members":["b","a"]', b'"members":["b","a","c"]')
    assert stored(client, ELASTIC, stream, "g") == expected
    assert entry.config.members == ["b", "a", "c"]
    run_sync(admin.set_mappings(client.target, stream, "g", [MemberMapping("x", [0, 1, 2, 3])]))
    run_sync(admin.delete_mappings(client.target, stream, "g"))
    run_sync(admin.add_members(client.target, stream, "g", ["b", "a"]))
    # Back to the original members through mappings: the bytes are Go's original ones.
    assert stored(client, ELASTIC, stream, "g") == value


def test_membership_change_retries_a_lost_compare_and_set(client, unique, monkeypatch):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    run_sync(admin.create_elastic(client.target, stream, "g", 4, by_token(unique)))
    bucket = kv(client, ELASTIC)
    real_update = admin.update_group
    calls = []

    async def racing_update(nats, entry, config):
        calls.append(entry.revision)
        if len(calls) == 1:  # another writer gets in between our read and our write
            other = b'{"max_members":4,"partitioning_filters":null,"members":["other"]}'
            await bucket.target.put(f"{stream}.g", other)
        return await real_update(nats, entry, config)

    monkeypatch.setattr(admin, "update_group", racing_update)
    entry = run_sync(admin.add_members(client.target, stream, "g", ["m1"]))
    assert len(calls) == 2 and calls[1] > calls[0]
    assert entry.config.members == ["other", "m1"]
    assert stored(client, ELASTIC, stream, "g").endswith(b'"members":["other","m1"]}')


def test_membership_change_gives_up_after_repeated_conflicts(client, unique, monkeypatch):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    run_sync(admin.create_elastic(client.target, stream, "g", 4, by_token(unique)))
    bucket = kv(client, ELASTIC)
    real_update = admin.update_group
    counter = iter(range(100))

    async def always_racing(nats, entry, config):
        body = f'{{"max_members":4,"partitioning_filters":null,"members":["o{next(counter)}"]}}'
        await bucket.target.put(f"{stream}.g", body.encode())
        return await real_update(nats, entry, config)

    monkeypatch.setattr(admin, "update_group", always_racing)
    with pytest.raises(GroupChanged, match="changed while it was being updated"):
        run_sync(admin.add_members(client.target, stream, "g", ["m1"]))
    assert next(counter) == admin.CAS_ATTEMPTS


# --- Static delete ----------------------------------------------------------------------------


def test_delete_static_removes_only_its_own_members_durables(client, unique):
    stream = static_stream(client, unique, 2)
    run_sync(admin.create_static(client.target, stream, "g", 2, ["m1", "m2"], filters=[">"]))
    run_sync(admin.create_static(client.target, stream, "g-x", 2, ["y"], filters=[">"]))
    for group, member in (("g", "m1"), ("g-x", "y")):
        entry = run_sync(admin.static_info(client.target, stream, group))
        run_sync(ensure_group_consumer(client.target, member_consumer(entry, member)))
    assert sorted(api(client).consumer_names(stream)) == ["g-m1", "g-x-y"]

    assert run_sync(admin.delete_static(client.target, stream, "g")) == ["g-m1"]
    assert api(client).consumer_names(stream) == ["g-x-y"]
    assert run_sync(admin.list_static(client.target, stream)) == ["g-x"]
    with pytest.raises(GroupNotFound):
        run_sync(admin.delete_static(client.target, stream, "g"))


# --- Elastic streams --------------------------------------------------------------------------


def wait_for_messages(client, stream: str, count: int, timeout: float = 10.0) -> None:
    arrived = lambda: api(client).stream_info(stream)["state"]["messages"] >= count  # noqa: E731
    wait_until(arrived, timeout, f"{stream} to receive {count} messages", every=0.05)


def test_elastic_create_makes_the_work_queue_stream(client, unique):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"], storage="memory")
    filters = [PartitioningFilter(f"{unique}.*.*", [2])]
    entry = run_sync(admin.create_elastic(client.target, stream, "g", 4, filters, 1000))
    config = api(client).stream_info(f"{stream}-g")["config"]
    assert config["retention"] == "workqueue"
    assert config["discard"] == "new"
    assert config["allow_direct"] is True
    assert (config["storage"], config["num_replicas"]) == ("memory", 1)
    assert (config["max_msgs"], config["max_bytes"]) == (1000, -1)
    assert not config.get("subjects")
    [source] = config["sources"]
    assert source["name"] == stream
    assert source["subject_transforms"] == elastic_subject_transforms(entry.config)
    dest = f"{{{{Partition(4,2)}}}}.{unique}.{{{{Wildcard(1)}}}}.{{{{Wildcard(2)}}}}"
    assert source["subject_transforms"] == [{"src": f"{unique}.*.*", "dest": dest}]

    subjects = [f"{unique}.orders.k{i}" for i in range(8)]
    for subject in subjects:
        publish_one(client, subject, b"x")
    wait_for_messages(client, f"{stream}-g", len(subjects))
    got = [api(client).get_message(f"{stream}-g", seq).subject for seq in range(1, 9)]
    assert got == [f"{partition_for([s.split('.')[-1]], 4)}.{s}" for s in subjects]
    assert len({g.split(".")[0] for g in got}) > 1  # really spread over partitions

    run_sync(admin.delete_elastic(client.target, stream, "g"))
    assert f"{stream}-g" not in api(client).stream_names()
    assert run_sync(admin.list_elastic(client.target, stream)) == []


def test_elastic_create_leaves_no_entry_when_the_stream_cannot_be_made(client, unique):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    make_stream(client, f"{stream}-g", [f"other{unique}"])  # name taken by an unrelated stream
    with pytest.raises(Exception, match="already in use"):
        run_sync(admin.create_elastic(client.target, stream, "g", 2, by_token(unique)))
    assert run_sync(admin.list_elastic(client.target, stream)) == []


# --- Members ----------------------------------------------------------------------------------


def test_static_member_info_active_and_step_down(client, unique):
    stream = static_stream(client, unique, 2)
    run_sync(admin.create_static(client.target, stream, "g", 2, ["m1", "m2"]))
    entry = run_sync(admin.static_info(client.target, stream, "g"))
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1")))

    info = run_sync(admin.member_info(client.target, STATIC, stream, "g", "m1"))
    assert info == admin.MemberInfo(
        "m1", True, False, False, [0], stream, "g-m1", 0, 0, num_waiting=0, last_active=None
    )
    assert run_sync(admin.list_active_members(client.target, STATIC, stream, "g")) == []

    publish_one(client, f"{unique}.{key_for(0, 2)}", b"hello")
    puller = client.pull_consumer(stream, "g-m1", group=PRIORITY_GROUP)
    result = run_sync(puller.fetch(1, expires=2))
    assert [m.data for m in result.messages] == [b"hello"] and puller.pin_id

    info = run_sync(admin.member_info(client.target, STATIC, stream, "g", "m1"))
    assert (info.active, info.pinned, info.num_pending, info.num_ack_pending) == (
        True,
        True,
        0,
        1,
    )
    assert run_sync(admin.list_active_members(client.target, STATIC, stream, "g")) == ["m1"]

    run_sync(admin.step_down(client.target, STATIC, stream, "g", "m1"))
    groups = api(client).consumer_info(stream, "g-m1")["priority_groups"]
    assert not groups[0].get("pinned_client_id")
    info = run_sync(admin.member_info(client.target, STATIC, stream, "g", "m1"))
    # Still active: the message it took is ack-pending (a partition-layout query refuses beside it).
    assert (info.active, info.pinned, info.state) == (True, False, "holding")
    run_sync(puller.close())

    m2 = run_sync(admin.member_info(client.target, STATIC, stream, "g", "m2"))
    assert (m2.in_membership, m2.active, m2.partitions, m2.num_pending) == (True, False, [1], None)
    with pytest.raises(ConfigurationError, match="has no consumer 'g-m2'"):
        run_sync(admin.step_down(client.target, STATIC, stream, "g", "m2"))


def test_elastic_active_means_the_members_own_consumer_exists(client, unique):
    stream = make_stream(client, f"S{unique}", [f"{unique}.>"])
    run_sync(admin.create_elastic(client.target, stream, "g", 4, by_token(unique)))
    entry = run_sync(admin.add_members(client.target, stream, "g", ["m1", "m2"]))
    template = {"ack_wait": to_nanos(30)}  # keeps the consumer past its inactive threshold
    run_sync(ensure_group_consumer(client.target, member_consumer(entry, "m1", template)))

    assert run_sync(admin.list_active_members(client.target, ELASTIC, stream, "g")) == ["m1"]
    m1 = run_sync(admin.member_info(client.target, ELASTIC, stream, "g", "m1"))
    assert (m1.active, m1.pinned, m1.partitions, m1.stream, m1.consumer) == (
        True,
        False,
        [0, 1],
        f"{stream}-g",
        "m1",
    )
    m2 = run_sync(admin.member_info(client.target, ELASTIC, stream, "g", "m2"))
    assert (m2.in_membership, m2.active) == (True, False)  # Go would report m2 active too
    stranger = run_sync(admin.member_info(client.target, ELASTIC, stream, "g", "zz"))
    assert (stranger.in_membership, stranger.active, stranger.partitions) == (False, False, [])
    run_sync(admin.step_down(client.target, ELASTIC, stream, "g", "m1"))  # nothing pinned: fine

    api(client).delete_stream(f"{stream}-g")
    with pytest.raises(admin.StreamNotFound, match=f"stream '{stream}-g' does not exist"):
        run_sync(admin.list_active_members(client.target, ELASTIC, stream, "g"))
