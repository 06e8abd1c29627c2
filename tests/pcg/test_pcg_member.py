"""Group member runtime against a real server: delivery, pins, membership changes, KV watch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from nats.errors import ConnectionClosedError
from spark_helpers import send_numbered

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import ConfigurationError, NotFound
from nats_spark.jetstream.api import to_nanos
from nats_spark.loop import run_sync
from nats_spark.pcg import (
    PartitioningFilter,
    StaticConfig,
    admin,
    elastic_stream_name,
    member_partitions,
    partition_for,
)
from nats_spark.pcg.consumers import member_consumer
from nats_spark.pcg.member import GroupConfigChanged, GroupMember, consume
from nats_spark.pcg.member_pulls import GroupMessage
from nats_spark.pcg.store import (
    GroupEntry,
    GroupKind,
    create_group,
    delete_group_entry,
    list_groups,
    update_group,
)

ACK_WAIT = 2.0  # seconds; short, so pins time out and consumers self-heal quickly
TEMPLATE = {"ack_wait": to_nanos(ACK_WAIT)}


def run(coro: Coroutine[Any, Any, None], timeout: float = 40) -> None:
    run_sync(coro, timeout=timeout)


@pytest.fixture(autouse=True)
def tidy(client: Any, unique: str) -> Iterator[None]:
    """Remove the test's streams and group entries, for servers shared between runs."""
    yield

    async def clean() -> None:
        nc: NatsClient = client.target
        for stream in await nc.api.stream_names():
            if unique not in stream:
                continue
            for kind in GroupKind:
                for group in await list_groups(nc, kind, stream):
                    await delete_group_entry(nc, kind, stream, group)
            await nc.api.delete_stream(stream)

    run(clean())


@dataclass(frozen=True)
class Got:
    instance: str
    subject: str
    partition: int
    data: bytes
    at: float


class Inbox:
    """What every instance handled, in order."""

    def __init__(self) -> None:
        self.got: list[Got] = []

    def handler(self, instance: str) -> Callable[[GroupMessage], Coroutine[Any, Any, None]]:
        async def handle(message: GroupMessage) -> None:
            self.got.append(
                Got(instance, message.subject, message.partition, message.data, time.monotonic())
            )
            await message.ack()

        return handle

    def distinct(self) -> set[bytes]:
        return {g.data for g in self.got}

    def of(self, instance: str) -> list[Got]:
        return [g for g in self.got if g.instance == instance]

    async def wait_for(self, datas: set[bytes], timeout: float = 15.0) -> None:
        await until(lambda: datas <= self.distinct(), f"{len(datas)} messages handled", timeout)

    async def wait_for_instance(self, instance: str, after: float, timeout: float = 15.0) -> None:
        """Until `instance` has handled a message at or after monotonic time `after`."""
        handled = lambda: any(g.at >= after for g in self.of(instance))  # noqa: E731
        await until(handled, f"a message handled by {instance}", timeout)


async def until(condition: Callable[[], Any], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.05)


async def final_deliveries(nc: NatsClient, entry: GroupEntry, names: list[str]) -> int:
    """The deliveries the members' consumers made, counted once none awaits its ack (then none
    can come again: the count is final)."""
    consumers = [member_consumer(entry, name, TEMPLATE) for name in names]
    while True:
        infos = [await nc.api.consumer_info(c.stream, c.name) for c in consumers]
        if not any(info.num_ack_pending or info.num_pending for info in infos):
            return sum(info["delivered"]["consumer_seq"] for info in infos)
        await asyncio.sleep(0.05)


async def make_static(
    nc: NatsClient, stream: str, group: str, config: StaticConfig
) -> tuple[str, GroupEntry]:
    """A stream storing `<p>.<prefix>.<key>` (partition of the key) and a static group on it."""
    prefix = f"ev{stream}"
    await nc.api.create_stream(
        {
            "name": stream,
            "subjects": [f"{prefix}.*"],
            "storage": "memory",
            "subject_transform": {
                "src": f"{prefix}.*",
                "dest": f"{{{{partition({config.max_members},1)}}}}.{prefix}.{{{{wildcard(1)}}}}",
            },
        }
    )
    return prefix, await create_group(nc, GroupKind.STATIC, stream, group, config)


async def make_elastic(
    nc: NatsClient, stream: str, group: str, max_members: int, members: list[str]
) -> tuple[str, GroupEntry]:
    """A plain stream and an elastic group on it (with its work-queue stream), partitioned by
    the key token."""
    prefix = f"ev{stream}"
    await nc.api.create_stream({"name": stream, "subjects": [f"{prefix}.*"], "storage": "memory"})
    entry = await admin.create_elastic(
        nc, stream, group, max_members, [PartitioningFilter(f"{prefix}.*", [1])]
    )
    return prefix, await update_group(nc, entry, entry.config.with_members_added(members))


async def stop_all(members: list[GroupMember]) -> None:
    for member in members:
        await member.stop()


@pytest.mark.parametrize("kind", [GroupKind.STATIC, GroupKind.ELASTIC])
def test_each_message_to_one_member_by_key(client: Any, unique: str, kind: GroupKind) -> None:
    nc: NatsClient = client.target
    stream, group, names = f"S{unique}", "g", ["m1", "m2", "m3"]

    async def scenario() -> None:
        if kind is GroupKind.STATIC:
            prefix, entry = await make_static(nc, stream, group, StaticConfig(3, members=names))
        else:
            prefix, entry = await make_elastic(nc, stream, group, 3, names)
        inbox = Inbox()
        members = [
            await consume(nc, stream, group, name, inbox.handler(name), template=TEMPLATE)
            for name in names
        ]
        try:
            sent = await send_numbered(nc, prefix, 60)
            await inbox.wait_for(sent)
            # The server's count: a duplicate was either delivered or cannot come any more.
            delivered = await asyncio.wait_for(final_deliveries(nc, entry, names), 3 * ACK_WAIT)
        finally:
            await stop_all(members)
        assert delivered == 60 and len(inbox.got) == 60 and inbox.distinct() == sent
        owner: dict[str, str] = {}
        for got in inbox.got:
            key = got.subject.rsplit(".", 1)[1]
            assert got.subject == f"{prefix}.{key}"  # the partition token is stripped
            assert got.partition == partition_for(key, 3)
            assert got.partition in member_partitions(names, 3, None, got.instance)
            assert owner.setdefault(key, got.instance) == got.instance
        assert len(set(owner.values())) > 1

    run(scenario())


def test_one_instance_of_a_member_receives_and_hands_over(
    client: Any, settings: ConnectionSettings, unique: str
) -> None:
    nc: NatsClient = client.target
    stream, group = f"S{unique}", "g"

    async def scenario() -> None:
        prefix, _ = await make_static(nc, stream, group, StaticConfig(2, members=["m1"]))
        inbox = Inbox()
        doomed = await NatsClient.open(settings)  # its connection dies below, like a process
        a = await consume(doomed, stream, group, "m1", inbox.handler("a"), template=TEMPLATE)
        instances = [a]
        try:
            sent = await send_numbered(nc, prefix, 5)
            await inbox.wait_for(sent)
            assert a.active
            for name in ("b", "c"):
                instances.append(
                    await consume(nc, stream, group, "m1", inbox.handler(name), template=TEMPLATE)
                )
            sent |= await send_numbered(nc, prefix, 5, start=5)
            await inbox.wait_for(sent)
            assert {g.instance for g in inbox.got} == {"a"}  # the pinned one gets everything
            assert [m.active for m in instances] == [True, False, False]

            # A dead instance's pin times out (priority_timeout = ack wait): a standby takes over.
            await doomed.nc.close()
            killed = len(inbox.got)
            sent |= await send_numbered(nc, prefix, 5, start=10)
            await inbox.wait_for(sent, timeout=3 * ACK_WAIT)
            (second,) = {g.instance for g in inbox.got[killed:]}
            assert second in ("b", "c")
            # The dead instance ends with its closed connection's error (not a timeout here).
            with pytest.raises(ConnectionClosedError):
                await asyncio.wait_for(asyncio.shield(a.done), 5)

            # Stopping the active instance steps down: the last standby takes over at once.
            active = instances[1] if second == "b" else instances[2]
            assert active.active
            await active.stop()
            stopped = len(inbox.got)
            started = time.monotonic()
            sent |= await send_numbered(nc, prefix, 5, start=15)
            await inbox.wait_for(sent, timeout=3 * ACK_WAIT)
            assert time.monotonic() - started < 1.0  # well below the pin's 2 s timeout
            assert {g.instance for g in inbox.got[stopped:]} == {"b", "c"} - {second}
            assert inbox.distinct() == sent and len(inbox.got) == len(sent)  # none lost or twice
            assert await active.done is None
        finally:
            await stop_all(instances)
            await doomed.close()

    run(scenario())


def test_elastic_membership_change_while_consuming(client: Any, unique: str) -> None:
    nc: NatsClient = client.target
    stream, group = f"S{unique}", "g"

    async def scenario() -> None:
        prefix, entry = await make_elastic(nc, stream, group, 6, ["m1", "m2"])
        inbox = Inbox()
        members = [
            await consume(nc, stream, group, name, inbox.handler(name), template=TEMPLATE)
            for name in ["m1", "m2"]
        ]
        sent: set[bytes] = set()

        async def publish_steadily(count: int) -> None:
            for i in range(count):
                sent.update(await send_numbered(nc, prefix, 1, start=i, keys=30))
                await asyncio.sleep(0.01)

        publisher = asyncio.create_task(publish_steadily(400))
        try:
            await inbox.wait_for({str(i).encode() for i in range(20)})  # m1 and m2 at work
            entry = await update_group(nc, entry, entry.config.with_members_added(["m3"]))
            members.append(
                await consume(nc, stream, group, "m3", inbox.handler("m3"), None, TEMPLATE)
            )
            added_at = time.monotonic()
            await inbox.wait_for_instance("m3", added_at)  # m3 took over its partitions
            await update_group(nc, entry, entry.config.with_members_dropped(["m1"]))
            dropped_at = time.monotonic()
            await publisher
            await inbox.wait_for(sent, timeout=20)
        finally:
            publisher.cancel()
            await stop_all(members)
        assert inbox.distinct() == sent  # at least once: nothing lost
        assert any(g.at > added_at for g in inbox.of("m3"))
        assert not [g for g in inbox.of("m1") if g.at > dropped_at + 1.0]
        assert any(g.at > dropped_at + 1.0 for g in inbox.of("m2"))
        assert all(not m.done.done() or m.done.exception() is None for m in members)

    run(scenario(), timeout=60)


def test_static_group_changed_or_deleted_stops_members(client: Any, unique: str) -> None:
    nc: NatsClient = client.target

    async def scenario() -> None:
        config = StaticConfig(2, members=["m1", "m2"])
        _, changed = await make_static(nc, f"S{unique}", "changed", config)
        _, deleted = await make_static(nc, f"T{unique}", "deleted", config)
        inbox = Inbox()
        a = await consume(
            nc, changed.stream, "changed", "m1", inbox.handler("a"), GroupKind.STATIC, TEMPLATE
        )
        b = await consume(nc, deleted.stream, "deleted", "m1", inbox.handler("b"), None, TEMPLATE)
        try:
            changed = await update_group(nc, changed, changed.config)  # same value: ignored
            applied = lambda: a.entry is not None and a.entry.revision == changed.revision  # noqa: E731
            await until(lambda: applied() or a.done.done(), "the update applied")
            assert not a.done.done() and applied()  # the ignored update ended nothing
            await update_group(nc, changed, config.with_members_added(["m3"]))
            with pytest.raises(GroupConfigChanged, match="static groups are immutable"):
                await asyncio.wait_for(asyncio.shield(a.done), 5)
            await delete_group_entry(nc, GroupKind.STATIC, deleted.stream, "deleted")
            assert await asyncio.wait_for(asyncio.shield(b.done), 5) is None
            for entry in (changed, deleted):  # as Go members do, the durable is deleted
                with pytest.raises(NotFound):
                    await nc.api.consumer_info(entry.stream, f"{entry.group}-m1")
            assert not a.active and not b.active
        finally:
            await stop_all([a, b])

    run(scenario())


def test_elastic_group_reshaped_or_deleted_stops_members(client: Any, unique: str) -> None:
    nc: NatsClient = client.target

    async def scenario() -> None:
        _, reshaped = await make_elastic(nc, f"S{unique}", "g", 2, ["m1"])
        _, deleted = await make_elastic(nc, f"T{unique}", "g", 2, ["m1"])
        inbox = Inbox()
        a = await consume(nc, reshaped.stream, "g", "m1", inbox.handler("a"), None, TEMPLATE)
        b = await consume(nc, deleted.stream, "g", "m1", inbox.handler("b"), None, TEMPLATE)
        try:
            config = type(reshaped.config).from_json(reshaped.config.to_json())
            config.max_members = 3
            await update_group(nc, reshaped, config)
            with pytest.raises(GroupConfigChanged, match="max_members, buffer limits"):
                await asyncio.wait_for(asyncio.shield(a.done), 5)
            await admin.delete_elastic(nc, deleted.stream, "g")
            assert await asyncio.wait_for(asyncio.shield(b.done), 5) is None
        finally:
            await stop_all([a, b])

    run(scenario())


def test_member_outside_the_group_is_refused(client: Any, unique: str) -> None:
    nc: NatsClient = client.target

    async def noop(_: GroupMessage) -> None:
        pass

    async def scenario() -> None:
        await make_static(nc, f"S{unique}", "g", StaticConfig(2, members=["m1"]))
        await make_elastic(nc, f"T{unique}", "g", 2, ["m1"])
        for stream in (f"S{unique}", f"T{unique}"):
            with pytest.raises(ConfigurationError, match="'m9' is not in .* group 'g'"):
                await consume(nc, stream, "g", "m9", noop, template=TEMPLATE)
        with pytest.raises(ConfigurationError, match="not found"):
            await consume(nc, f"S{unique}", "nogroup", "m1", noop)

    run(scenario())


def test_elastic_member_waits_for_its_partitions_and_recreates_its_consumer(
    client: Any, unique: str
) -> None:
    nc: NatsClient = client.target
    stream, group = f"S{unique}", "g"
    work_queue = elastic_stream_name(stream, group)

    async def scenario() -> None:
        prefix, _ = await make_elastic(nc, stream, group, 2, ["m1"])
        # A stale consumer still holding partition 0, as in the middle of a membership change.
        await nc.api.create_consumer(
            work_queue, "old", {"ack_policy": "explicit", "filter_subjects": ["0.>"]}
        )
        inbox = Inbox()
        member = await consume(nc, stream, group, "m1", inbox.handler("m1"), template=TEMPLATE)
        try:
            sent = await send_numbered(nc, prefix, 5)
            # The work-queue stream refused the member's consumer, which overlaps "old": no
            # consumer, so nothing can be delivered, and the member waits to retry.
            with pytest.raises(NotFound):
                await nc.api.consumer_info(work_queue, "m1")
            assert not inbox.got and not member.done.done()
            await nc.api.delete_consumer(work_queue, "old")
            await inbox.wait_for(sent, timeout=ACK_WAIT + 2)  # the self-heal retries the create

            await nc.api.delete_consumer(work_queue, "m1")
            sent |= await send_numbered(nc, prefix, 5, start=5)
            await inbox.wait_for(sent, timeout=ACK_WAIT + 2)
            info = await nc.api.consumer_info(work_queue, "m1")
            assert info["config"]["filter_subjects"] == [f"0.{prefix}.*", f"1.{prefix}.*"]
            assert not member.done.done()
        finally:
            await member.stop()

    run(scenario())


def test_failed_message_comes_back_and_handler_may_stop_the_member(
    client: Any, unique: str
) -> None:
    nc: NatsClient = client.target
    stream, group = f"S{unique}", "g"

    async def scenario() -> None:
        prefix, _ = await make_static(nc, stream, group, StaticConfig(1, members=["m1"]))
        attempts: list[bytes] = []

        async def handle(message: GroupMessage) -> None:
            attempts.append(message.data)
            if attempts == [b"0", b"1"]:
                raise RuntimeError("handler bug")  # logged; the message is redelivered
            await message.ack()
            if attempts.count(b"1") == 2:
                await member.stop()  # from inside the handler: must not deadlock

        member = GroupMember(nc, stream, group, "m1", handle, template=TEMPLATE)
        await member.start()
        await send_numbered(nc, prefix, 3)
        assert await asyncio.wait_for(asyncio.shield(member.done), 3 * ACK_WAIT) is None
        assert attempts == [b"0", b"1", b"2", b"1"]
        await send_numbered(nc, prefix, 1, start=3)
        # Another instance gets the next message: the stopped one, pinned were it still pulling,
        # handles nothing more; the durable stayed, with its progress (no redelivery of 0-2).
        inbox = Inbox()
        successor = await consume(nc, stream, group, "m1", inbox.handler("b"), template=TEMPLATE)
        try:
            await inbox.wait_for({b"3"})
        finally:
            await successor.stop()
        assert len(attempts) == 4 and not member.active
        assert [g.data for g in inbox.got] == [b"3"]

    run(scenario())
