"""A running member of a partitioned consumer group, behaving as a Go `pcgroups` member does.

`consume(...)` joins the group as one instance of a member: it creates the member's consumer,
pulls from it in the priority group `PCG` and hands each message to an async handler, with the
partition token stripped from the subject. Several instances of one member may run at once; the
server pins one of them and the others stand by until the pin is released or times out.

Each instance watches the group's KV entry: a static group stops on any change (static groups
are immutable) and stops cleanly when deleted; an elastic group follows membership changes by
recreating the member consumer with its new partitions.

Handler contract: messages of one instance are handled one at a time, in delivery order. The
handler acks (`await message.ack()`); a handler that raises is logged and its message is left
unacknowledged, so the server redelivers it after the ack wait (as with a Go callback that does
not ack). The pull after each batch refreshes the pin; a batch whose handling outlasts the ack
wait (which is also the pin timeout) loses the pin, as its messages are redelivered anyway.

This module supervises an instance (joining, the KV watch, self-heal, shutdown); the pulling and
handing over is `member_pulls.MemberPulls`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec

from nats.errors import Error as NatsError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from nats_spark.errors import (
    ConfigurationError,
    ErrorCode,
    JetStreamApiError,
    NatsSparkError,
    NotFound,
)
from nats_spark.pcg.config import ElasticConfig
from nats_spark.pcg.consumers import (
    PRIORITY_GROUP,
    GroupConsumer,
    ensure_group_consumer,
    member_consumer,
)
from nats_spark.pcg.kinds import GroupKind
from nats_spark.pcg.member_pulls import Handler, MemberPulls
from nats_spark.pcg.store import GroupConfig, GroupEntry, load_group

if TYPE_CHECKING:  # annotations only: parsing a format's options imports pcg, not the connection
    from nats_spark.client import NatsClient

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500
SELF_HEAL_MARGIN = 0.5  # seconds added to the ack wait before a missing consumer is recreated
MEMBERSHIP_BACKOFF = (0.4, 0.5)  # seconds an unpinned instance waits on a membership change

P = ParamSpec("P")


class GroupConfigChanged(ConfigurationError):
    """The group's KV entry changed in a way running members cannot follow."""


def _in_membership(config: GroupConfig, member: str) -> bool:
    return member in config.members or any(m.member == member for m in config.member_mappings)


async def _next_entry(watcher: KeyValue.KeyWatcher, key: str) -> KeyValue.Entry | None:
    try:
        return await anext(watcher)
    except StopAsyncIteration:
        raise NatsSparkError(
            f"the watch on consumer group key {key!r} ended; restart the member"
        ) from None


class GroupMember:
    """One instance of a group member: joins, pulls, hands messages to `handler`, follows the group.

    `template` holds consumer config overrides in wire form (e.g. `{"ack_wait": <ns>}`), like the
    consumer config a Go member passes when it joins. `batch` caps the messages of one pull.
    """

    def __init__(
        self,
        client: NatsClient,
        stream: str,
        group: str,
        member: str,
        handler: Handler,
        kind: GroupKind | None = None,
        template: dict[str, Any] | None = None,
        *,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        if batch < 1:
            raise ConfigurationError(f"batch is {batch}; give the messages per pull, 1 or more")
        self.client = client
        self.stream = stream
        self.group = group
        self.member = member
        self.handler = handler
        self.kind = kind
        self.template = template
        self.batch = batch
        self._entry: GroupEntry | None = None
        self._ack_wait = 0.0
        self._consumer: GroupConsumer | None = None  # the consumer being pulled; None: not joined
        self._pulls: MemberPulls | None = None
        self._pull_task: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        self._done: asyncio.Future[None] | None = None

    @property
    def done(self) -> asyncio.Future[None]:
        """Resolves with None when the instance ends cleanly (stopped, or group deleted), or
        with the error that ended it (static group changed, fatal pull error, ...)."""
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        return self._done

    @property
    def entry(self) -> GroupEntry | None:
        """The group's KV entry as this instance last applied it; None before `start`."""
        return self._entry

    @property
    def pin_id(self) -> str | None:
        return self._pulls.pin_id if self._pulls is not None else None

    @property
    def active(self) -> bool:
        """Whether this instance holds the pin (as far as it knows) and is pulling."""
        task = self._pull_task
        return task is not None and not task.done() and self.pin_id is not None

    @property
    def _name(self) -> str:
        return f"member {self.member!r} of group {self.group!r} on stream {self.stream!r}"

    async def start(self) -> None:
        """Load the group, check membership, create the member consumer and start pulling."""
        if self._supervisor is not None:
            raise RuntimeError("GroupMember.start() was already called; make a new GroupMember")
        done = self.done  # made now, inside the running loop
        entry = await load_group(self.client, self.stream, self.group, self.kind)
        if not _in_membership(entry.config, self.member):
            raise ConfigurationError(
                f"member {self.member!r} is not in {entry.kind.value} consumer group "
                f"{self.group!r} on stream {self.stream!r}; add it to the group's members or "
                "mappings first, or pick one of its members"
            )
        consumer = member_consumer(entry, self.member, self.template)
        if entry.kind is GroupKind.STATIC and not consumer.filter_subjects:
            raise ConfigurationError(
                f"member {self.member!r} of static consumer group {self.group!r} gets no "
                f"partitions: the group lists more members than its {entry.config.max_members} "
                "partitions (max_members); recreate the group with fewer members"
            )
        self._entry = entry
        self._ack_wait = consumer.ack_wait
        kv = await self.client.js.key_value(entry.kind.bucket)
        watcher = await kv.watch(entry.key)
        try:
            if consumer.filter_subjects:  # an elastic member past max_members waits for a slot
                await self._join(consumer)
        except BaseException:
            await watcher.stop()
            raise
        self._supervisor = asyncio.create_task(self._run(watcher, done), name=self._name)

    async def stop(self) -> None:
        """Stop pulling and watching. The member consumer stays: a static durable keeps its
        progress, an elastic consumer goes away after its inactive threshold. If this instance
        holds the pin it steps down, so a standby instance takes over at once. Waits for the
        message in hand to be handled.

        Called from inside the handler, it returns at once; the instance ends when the handler
        returns (await `done` elsewhere, not in the handler).
        """
        task = self._supervisor
        if task is None or task.done():
            return
        if not self._stopping:  # once: a second cancel would break off the shutdown itself
            self._stopping = True
            if self._pulls is not None:
                self._pulls.halt.set()  # no further message reaches the handler
            task.cancel()
        if asyncio.current_task() is not self._pull_task:
            await asyncio.wait([task])

    # --- supervision: KV watch, self-heal, shutdown ---------------------------------------------

    async def _run(self, watcher: KeyValue.KeyWatcher, done: asyncio.Future[None]) -> None:
        outcome: Exception | None = None
        try:
            await self._supervise(watcher)
        except asyncio.CancelledError:
            pass  # stop()
        except Exception as error:
            outcome = error
            log.error("%s: %s", self._name, error)
        finally:
            await self._shut_down(watcher)
            if not done.done():
                if outcome is None:
                    done.set_result(None)
                else:
                    done.set_exception(outcome)

    async def _shut_down(self, watcher: KeyValue.KeyWatcher) -> None:
        # Network steps are best effort: the connection may be closed before a member is stopped.
        consumer, step_down = self._consumer, False
        if self._stopping:
            with contextlib.suppress(Exception):
                step_down = await self._holds_pin()
        await self._halt_pulling()
        if step_down and consumer is not None:
            # Only now that our pulls are gone, so that the server cannot pin one of them again.
            with contextlib.suppress(Exception):
                await self.client.api.unpin(consumer.stream, consumer.name, PRIORITY_GROUP)
        with contextlib.suppress(Exception):
            await watcher.stop()

    async def _supervise(self, watcher: KeyValue.KeyWatcher) -> None:
        """Follow KV updates and the pull task; returns when the group is deleted."""
        entry = self._require_entry()
        heal_interval = self._ack_wait + SELF_HEAL_MARGIN
        update = asyncio.ensure_future(_next_entry(watcher, entry.key))
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {update}
                if self._pull_task is not None:
                    waiting.add(self._pull_task)
                finished, _ = await asyncio.wait(
                    waiting, timeout=heal_interval, return_when=asyncio.FIRST_COMPLETED
                )
                if self._pull_task is not None and self._pull_task in finished:
                    error = await self._reap_pull_task()
                    if error is not None:
                        raise error
                if update in finished:
                    kv_entry = update.result()
                    update = asyncio.ensure_future(_next_entry(watcher, entry.key))
                    if kv_entry is not None and await self._on_update(kv_entry):
                        return
                if not finished:
                    await self._self_heal()
        finally:
            update.cancel()

    async def _on_update(self, kv_entry: KeyValue.Entry) -> bool:
        """Apply a KV update of the group's key; True when the group was deleted."""
        entry = self._require_entry()
        if kv_entry.operation in (KV_DEL, KV_PURGE):
            log.info("%s: the group was deleted; stopping", self._name)
            if entry.kind is GroupKind.STATIC:
                await self._halt_pulling()
                await self._delete_durable()
            return True
        if (kv_entry.revision or 0) <= entry.revision:
            return False  # the value start() loaded, replayed by the watch
        kind = entry.kind
        config = kind.config_type.from_json(kv_entry.value or b"", key=f"{kind.bucket}/{entry.key}")
        config.validate()
        new = GroupEntry(kind, entry.stream, entry.group, config, kv_entry.revision or 0)
        if kind is GroupKind.STATIC:
            if config != entry.config:
                # As Go members do: the durable's filters no longer fit the group.
                await self._halt_pulling()
                await self._delete_durable()
                raise GroupConfigChanged(
                    f"static consumer group {self.group!r} on stream {self.stream!r} was changed "
                    f"in KV bucket {kind.bucket}, so member {self.member!r} stopped; static "
                    "groups are immutable: delete and recreate the group, then restart members"
                )
            self._entry = new
            return False
        assert isinstance(config, ElasticConfig) and isinstance(entry.config, ElasticConfig)
        if _elastic_shape(config) != _elastic_shape(entry.config):
            raise GroupConfigChanged(
                f"elastic consumer group {self.group!r} on stream {self.stream!r} changed its "
                "max_members, buffer limits or partitioning filters, which members cannot "
                "follow; delete and recreate the group, then restart the members"
            )
        self._entry = new
        wanted = member_consumer(new, self.member, self.template).filter_subjects
        if self._consumer is not None and self._consumer.filter_subjects == wanted:
            return False  # our partitions did not change
        await self._follow_membership()
        return False

    async def _follow_membership(self) -> None:
        """Recreate the consumer with the new partitions, as Go members do: the pinned instance
        deletes it, so that partitions gained restart from their oldest unacked message."""
        pinned = await self._holds_pin()
        consumer = self._consumer
        await self._halt_pulling()
        if pinned and consumer is not None:
            with contextlib.suppress(NotFound):
                await self.client.api.delete_consumer(consumer.stream, consumer.name)
        else:
            # Give a pinned instance of this member the time to delete and recreate it first.
            await asyncio.sleep(random.uniform(*MEMBERSHIP_BACKOFF))
        await self._try_join()

    async def _self_heal(self) -> None:
        """Rejoin when the member has partitions but no consumer (it vanished, or a create
        failed), unless the group is gone (its deletion then arrives through the watch)."""
        if self._pull_task is not None:
            return
        if not member_consumer(self._require_entry(), self.member, self.template).filter_subjects:
            return
        try:
            await load_group(self.client, self.stream, self.group, self._require_entry().kind)
        except (NatsSparkError, NatsError) as error:  # gone, or unreachable: try again later
            log.debug("%s: not rejoining now: %s", self._name, error)
            return
        log.info("%s: has partitions but no consumer; creating it", self._name)
        await self._try_join()

    async def _try_join(self) -> None:
        consumer = member_consumer(self._require_entry(), self.member, self.template)
        if not consumer.filter_subjects:
            log.info("%s: not in the membership now; waiting to be added", self._name)
            return
        try:
            await self._join(consumer)
        except NatsSparkError as error:
            log.warning(
                "%s: could not create its consumer (%s); retrying in %.1fs",
                self._name,
                error,
                self._ack_wait + SELF_HEAL_MARGIN,
            )

    async def _join(self, consumer: GroupConsumer) -> None:
        """Create or adopt the member consumer and start pulling from it."""
        try:
            await ensure_group_consumer(self.client, consumer)
        except JetStreamApiError as error:
            if error.err_code == ErrorCode.FILTER_NOT_UNIQUE_ON_WORK_QUEUE:
                # Normal while members process a membership change; the self-heal retries.
                log.info(
                    "%s: its partitions are still held by another consumer; retrying in %.1fs",
                    self._name,
                    self._ack_wait + SELF_HEAL_MARGIN,
                )
                return
            if error.stream_missing:
                raise ConfigurationError(
                    f"stream {consumer.stream!r} of consumer group {self.group!r} does not "
                    "exist; create the group (nats-pcg elastic|static create) or check the names"
                ) from None
            raise
        self._consumer = consumer
        pulls = MemberPulls(
            self.client, consumer, self.handler, self.batch, self._ack_wait, self._name
        )
        self._pulls = pulls
        self._pull_task = asyncio.create_task(pulls.run())

    async def _holds_pin(self) -> bool:
        """Whether the server's pin of the consumer is ours."""
        pin, consumer = self.pin_id, self._consumer
        if pin is None or consumer is None:
            return False
        try:
            info = await self.client.api.consumer_info(consumer.stream, consumer.name)
        except NotFound:
            return False
        return info.pinned_id(PRIORITY_GROUP) == pin

    async def _delete_durable(self) -> None:
        consumer = member_consumer(self._require_entry(), self.member, self.template)
        with contextlib.suppress(NotFound):
            await self.client.api.delete_consumer(consumer.stream, consumer.name)

    async def _halt_pulling(self) -> None:
        """End the pull task after the message in hand; safe to call again if interrupted."""
        task, pulls = self._pull_task, self._pulls
        if task is None or pulls is None:
            return
        pulls.halt.set()
        if pulls.waiting:
            task.cancel()  # a waiting pull holds nothing: its messages would be redelivered
        await asyncio.wait([task])
        error = await self._reap_pull_task()
        if error is not None:
            log.warning("%s: pulling had failed while stopping: %s", self._name, error)

    async def _reap_pull_task(self) -> BaseException | None:
        """Forget the finished pull task and its consumer; returns the error it ended with."""
        task, pulls = self._pull_task, self._pulls
        self._pull_task, self._pulls, self._consumer = None, None, None
        if pulls is not None:
            with contextlib.suppress(Exception):  # the connection may be closed already
                await pulls.puller.close()
        if task is None or task.cancelled():
            return None
        return task.exception()

    def _require_entry(self) -> GroupEntry:
        if self._entry is None:
            raise RuntimeError("GroupMember is not started; call start() first")
        return self._entry


def _elastic_shape(config: ElasticConfig) -> tuple[Any, ...]:
    """The parts of an elastic config whose change members cannot follow (as Go compares them:
    partitioning filters deeply, where None differs from [])."""
    return (
        config.max_members,
        config.max_buffered_msgs,
        config.max_buffered_bytes,
        config.partitioning_filters,
    )


def _started(make: Callable[P, GroupMember]) -> Callable[P, Awaitable[GroupMember]]:
    async def consume(*args: P.args, **kwargs: P.kwargs) -> GroupMember:
        """Join `group` on `stream` as an instance of `member` and start handing messages to
        `handler` (the arguments of `GroupMember`); returns the running member (`await
        member.stop()`, `await member.done`)."""
        instance = make(*args, **kwargs)
        await instance.start()
        return instance

    return consume


consume = _started(GroupMember)
