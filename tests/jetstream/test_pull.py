"""Priority-group pulls against a real server: pins, standby, overflow, priorities, every status."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from spark_helpers import in_background, make_consumer, needs_server, publish, puller, wait_until

from nats_spark.client import NatsClient, open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import (
    ConfigurationError,
    JetStreamApiError,
    NotFound,
    PriorityGroupMisconfigured,
    PullError,
)
from nats_spark.jetstream.api import JetStreamApi, to_nanos
from nats_spark.jetstream.pull import (
    PIN_ID_HEADER,
    Deliveries,
    FetchResult,
    PullConsumer,
    PullStatus,
)
from nats_spark.loop import Blocking, event_loop, run_sync
from nats_spark.server import EmbeddedServer

GROUP = "jobs"


@pytest.fixture
def api(client: Blocking[NatsClient]) -> Blocking[JetStreamApi]:
    return Blocking(client.api)


@pytest.fixture
def stream(api: Blocking[JetStreamApi], unique: str) -> Iterator[str]:
    name = f"PULL_{unique}"
    api.create_stream({"name": name, "subjects": [f"{name}.>"], "storage": "memory"})
    yield name
    with contextlib.suppress(NotFound):
        api.delete_stream(name)


def waiting(api: Blocking[JetStreamApi], stream: str, consumer: str) -> int:
    return api.consumer_info(stream, consumer)["num_waiting"]


def stream_seqs(result: FetchResult) -> list[int]:
    return [msg.metadata.sequence.stream for msg in result.messages]


def pinned_id(api: Blocking[JetStreamApi], stream: str, consumer: str) -> str | None:
    return api.consumer_info(stream, consumer)["priority_groups"][0].get("pinned_client_id")


def test_pinned_client_standby_and_takeover(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(
        client, stream, "PIN", "pinned_client", priority_timeout=to_nanos(2.0), group=GROUP
    )
    publish(client, stream, 4)
    active, standby = puller(client, stream, "PIN", GROUP), puller(client, stream, "PIN", GROUP)

    first = active.fetch(1, expires=0.5)
    assert (first.status, stream_seqs(first)) == (PullStatus.BATCH_COMPLETE, [1])
    old_pin = active.pin_id
    assert old_pin and first.messages[0].headers[PIN_ID_HEADER] == old_pin

    waited = standby.fetch(1, expires=0.3)
    assert (waited.status, waited.messages, standby.pin_id) == (PullStatus.TIMEOUT, [], None)

    # The active client keeps the pin by pulling with its id; without the id it would get 408.
    second = active.fetch(1, expires=0.5)
    assert stream_seqs(second) == [2] and active.pin_id == old_pin
    assert pinned_id(api, stream, "PIN") == old_pin

    # It stops pulling: after priority_timeout the server pins the waiting standby instead.
    took_over = standby.fetch(1, expires=5.0)
    assert (took_over.status, stream_seqs(took_over)) == (PullStatus.BATCH_COMPLETE, [3])
    new_pin = standby.pin_id
    assert new_pin and new_pin != old_pin
    assert took_over.messages[0].headers[PIN_ID_HEADER] == new_pin
    assert pinned_id(api, stream, "PIN") == new_pin

    stale = active.fetch(1, expires=0.5)
    assert (stale.status, stale.messages, active.pin_id) == (PullStatus.PIN_MISMATCH, [], None)
    # Without an id it is now the standby.
    assert active.fetch(1, expires=0.3).status == PullStatus.TIMEOUT
    assert stream_seqs(standby.fetch(1, expires=0.5)) == [4]


def test_unpin_mid_stream(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(
        client, stream, "PIN", "pinned_client", priority_timeout=to_nanos(30), group=GROUP
    )
    publish(client, stream, 3)
    pull = puller(client, stream, "PIN", GROUP)
    assert stream_seqs(pull.fetch(1, expires=0.5)) == [1]
    first_pin = pull.pin_id
    assert first_pin and pinned_id(api, stream, "PIN") == first_pin

    api.unpin(stream, "PIN", GROUP)
    assert pinned_id(api, stream, "PIN") is None
    stale = pull.fetch(1, expires=0.5)
    assert (stale.status, stale.messages, pull.pin_id) == (PullStatus.PIN_MISMATCH, [], None)

    repinned = pull.fetch(1, expires=0.5)
    assert stream_seqs(repinned) == [2]
    second_pin = pull.pin_id
    assert second_pin and second_pin != first_pin
    assert repinned.messages[0].headers[PIN_ID_HEADER] == second_pin
    assert pinned_id(api, stream, "PIN") == second_pin


def test_overflow_min_pending(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(client, stream, "OVF", "overflow", group=GROUP)
    overflow = puller(client, stream, "OVF", GROUP)
    publish(client, stream, 2)

    below = overflow.fetch(1, expires=0.3, min_pending=3)
    assert (below.status, below.messages) == (PullStatus.TIMEOUT, [])

    publish(client, stream, 1)
    reached = overflow.fetch(1, expires=0.5, min_pending=3)
    assert (reached.status, stream_seqs(reached)) == (PullStatus.BATCH_COMPLETE, [1])

    # Two pending now: a threshold pull waits, a plain one is served.
    assert overflow.fetch(1, expires=0.3, min_pending=3).status == PullStatus.TIMEOUT
    assert stream_seqs(overflow.fetch(1, expires=0.5)) == [2]


def test_prioritized_serves_lowest_priority_number_first(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    needs_server(client, (2, 12, 0), "the prioritized policy")
    make_consumer(client, stream, "PRI", "prioritized", group=GROUP)
    backup, primary = puller(client, stream, "PRI", GROUP), puller(client, stream, "PRI", GROUP)
    # The backup (priority 5) waits first, so plain arrival order would serve it.
    backup_pull = in_background(backup, 1, expires=2.5, priority=5)
    wait_until(lambda: waiting(api, stream, "PRI") == 1, 3, "the backup's pull", every=0.02)
    primary_pull = in_background(primary, 1, expires=2.5, priority=0)
    wait_until(lambda: waiting(api, stream, "PRI") == 2, 3, "the primary's pull", every=0.02)

    publish(client, stream, 1)
    served = primary_pull.result(5)
    assert (served.status, stream_seqs(served)) == (PullStatus.BATCH_COMPLETE, [1])
    left = backup_pull.result(5)
    assert (left.status, left.messages) == (PullStatus.TIMEOUT, [])


def test_idle_heartbeats_are_counted(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(client, stream, "HB", "overflow", group=GROUP)
    result = puller(client, stream, "HB", GROUP).fetch(1, expires=1.2, idle_heartbeat=0.25)
    assert result.status == PullStatus.TIMEOUT
    assert result.heartbeats >= 2


def test_heartbeat_missed_when_nobody_answers(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str, unique: str
) -> None:
    # Pull requests go to a subscriber that swallows them: no message, no heartbeat, no status.
    prefix = f"void.{unique}"
    sink = run_sync(client.nc.subscribe(f"{prefix}.CONSUMER.MSG.NEXT.>"))
    try:
        pull = Blocking(PullConsumer(client.nc, stream, "C", api_prefix=prefix))
        started = time.monotonic()
        missed = pull.fetch(1, expires=10, idle_heartbeat=0.2)
        assert missed.status == PullStatus.HEARTBEAT_MISSED
        assert time.monotonic() - started < 2
        # Without heartbeats the client gives up a few seconds after the request's expiry.
        started = time.monotonic()
        assert pull.fetch(1, expires=0.1).status == PullStatus.CLIENT_TIMEOUT
        assert 5 <= time.monotonic() - started < 7
        assert sink.pending_msgs == 2  # both requests reached the sink
    finally:
        run_sync(sink.unsubscribe())


def test_a_whole_pull_given_up_hands_out_what_it_delivered(
    client: Blocking[NatsClient], unique: str
) -> None:
    """A server that forgets a pull after it delivered part of the batch (a restart) never ends
    it: the client gives up past its expiry and hands out what it delivered then, not with the
    next request's end (held by nothing meanwhile, its ack wait ran out: seed 5797 on a real
    server). The server here is a subscriber that answers with one delivery and nothing more."""
    prefix = f"forgets.{unique}"

    async def deliver_once(request: Any) -> None:
        await client.nc.publish(request.reply, b"delivered", reply=f"{prefix}.ack")

    server = run_sync(client.nc.subscribe(f"{prefix}.CONSUMER.MSG.NEXT.>", cb=deliver_once))
    try:
        pull = Blocking(PullConsumer(client.nc, "S", "C", api_prefix=prefix))
        result = pull.fetch(5, expires=0.1, grace=0.2, whole=True)
    finally:
        run_sync(server.unsubscribe())
    assert result.status == PullStatus.CLIENT_TIMEOUT
    assert result.deliveries.data == [b"delivered"]


def test_heartbeat_missed_when_server_dies_mid_pull() -> None:
    with EmbeddedServer() as server:
        settings = ConnectionSettings(servers=(server.url,), reconnect_time_wait=0.2)
        own = open_blocking(settings)
        try:
            api = Blocking(own.api)
            api.create_stream({"name": "DIE", "subjects": ["die.>"], "storage": "memory"})
            make_consumer(own, "DIE", "C", "overflow", group=GROUP)
            pull = puller(own, "DIE", "C", GROUP)
            pending = in_background(pull, 1, expires=30, idle_heartbeat=0.2)
            time.sleep(0.7)  # time under test: 0.2 s heartbeats arrive before the kill
            server.kill()
            killed = time.monotonic()
            result = pending.result(5)
            assert result.status == PullStatus.HEARTBEAT_MISSED
            assert result.heartbeats >= 1
            assert time.monotonic() - killed < 3
        finally:
            run_sync(own.target.close())


def test_a_pull_a_restart_forgot_stops_dating_later_deliveries() -> None:
    """A standalone server was killed and started again while a pull waited on it (a clean
    shutdown ends it, 409 Server Shutdown): it forgot the pull and never ends it. After the
    reconnect (a server of another id), a later pull's delivery is dated from that pull's
    making, not the forgotten one's (seed 1656 of helper-69's world of dying drivers: dated
    16 s back, over half the ack wait, its give-back skipped the NAK)."""
    with EmbeddedServer() as server:
        settings = ConnectionSettings(servers=(server.url,), reconnect_time_wait=0.2)
        own = open_blocking(settings)
        try:
            api = Blocking(own.api)
            api.create_stream({"name": "RST", "subjects": ["rst.>"], "storage": "file"})
            make_consumer(own, "RST", "C", None, group=GROUP)
            consumer = own.pull_consumer("RST", "C")
            nc = own.target.nc

            async def scenario() -> tuple[float, float, float]:
                forgotten = await consumer.pull(1, expires=60)
                await nc.flush()
                await asyncio.to_thread(server.kill)
                await asyncio.to_thread(server.start)
                while nc.stats["reconnects"] < 1 or not nc.is_connected:
                    await asyncio.sleep(0.05)
                later = await consumer.pull(1, expires=5, whole=True)
                await own.js.publish("rst.k", b"x")
                while not len(consumer.inbox._received):
                    await asyncio.sleep(0.01)
                return forgotten.sent, later.sent, consumer.requested_since()

            forgotten_sent, later_sent, since = run_sync(scenario())
        finally:
            run_sync(own.target.close())
    assert forgotten_sent < since <= later_sent


PRIORITY_REJECTIONS = [
    # (policy, group the client pulls with, fetch options, pin id sent, server text)
    ("pinned_client", None, {}, None, "Priority Group missing"),
    ("pinned_client", "other", {}, None, "Invalid Priority Group"),
    ("pinned_client", GROUP, {"min_pending": 3}, None, "Not a Overflow Priority consumer"),
    ("pinned_client", GROUP, {"min_ack_pending": 3}, None, "Not a Overflow Priority consumer"),
    ("overflow", None, {}, None, "Priority Group missing"),
    ("overflow", GROUP, {}, "bogus", "Not a Pinned Client Priority consumer"),
    ("prioritized", GROUP, {"priority": 10}, None, "Priority must be between 0 and 9"),
    ("prioritized", GROUP, {"priority": -1}, None, "Priority must be between 0 and 9"),
    ("prioritized", GROUP, {"min_pending": 1}, None, "Not a Overflow Priority consumer"),
    ("prioritized", GROUP, {}, "bogus", "Not a Pinned Client Priority consumer"),
]


@pytest.mark.parametrize(("policy", "group", "options", "pin", "text"), PRIORITY_REJECTIONS)
def test_priority_rejections_are_misconfigurations(
    client: Blocking[NatsClient],
    api: Blocking[JetStreamApi],
    stream: str,
    policy: str,
    group: str | None,
    options: dict[str, int],
    pin: str | None,
    text: str,
) -> None:
    if policy == "prioritized":
        needs_server(client, (2, 12, 0), "the prioritized policy")
    make_consumer(client, stream, "BAD", policy, group=GROUP)
    pull = Blocking(client.pull_consumer(stream, "BAD", group=group, pin_id=pin))
    with pytest.raises(PriorityGroupMisconfigured) as caught:
        pull.fetch(1, expires=0.5, **options)
    error = caught.value
    assert isinstance(error, ConfigurationError)
    assert (error.status, error.description.split(" (")[0]) == (400, f"Bad Request - {text}")
    message = str(error)
    assert "\n" not in message and f"{stream} > BAD" in message and f"group {group!r}" in message


def test_other_bad_requests_are_pull_errors(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(client, stream, "HB", "overflow", group=GROUP)
    with pytest.raises(PullError) as caught:
        puller(client, stream, "HB", GROUP).fetch(1, expires=1, idle_heartbeat=0.8)
    assert not isinstance(caught.value, PriorityGroupMisconfigured)
    assert caught.value.status == 400
    assert "heartbeat value too large" in str(caught.value) and "idle heartbeat" in str(
        caught.value
    )


def test_consumer_deleted_during_long_pull(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(client, stream, "GONE", "pinned_client", group=GROUP)
    pending = in_background(puller(client, stream, "GONE", GROUP), 1, expires=5)
    wait_until(lambda: waiting(api, stream, "GONE") == 1, 3, "the pull", every=0.02)
    api.delete_consumer(stream, "GONE")
    with pytest.raises(PullError) as caught:
        pending.result(3)
    assert caught.value.status == 409
    message = str(caught.value)
    assert "Consumer Deleted" in message and f"{stream} > GONE" in message
    assert "recreate" in message and "\n" not in message


def test_no_wait_with_nothing_available(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(client, stream, "NW", "overflow", group=GROUP)
    pull = puller(client, stream, "NW", GROUP)
    empty = pull.fetch(5, no_wait=True)
    assert (empty.status, empty.messages) == (PullStatus.NO_MESSAGES, [])
    publish(client, stream, 2)
    # The consumer learns of stored messages after the publish is confirmed: a no-wait pull in
    # between is answered "no messages" (seen in CI).
    wait_until(lambda: api.consumer_info(stream, "NW").num_pending == 2, 10, "2 messages pending")
    some = pull.fetch(5, no_wait=True)
    assert (some.status, stream_seqs(some)) == (PullStatus.NO_MESSAGES, [1, 2])


@pytest.mark.parametrize("missing", ["consumer", "stream"])
def test_pull_on_missing_consumer_is_a_clear_error(
    client: Blocking[NatsClient], stream: str, missing: str
) -> None:
    stream_name = stream if missing == "consumer" else f"{stream}_NOPE"
    started = time.monotonic()
    with pytest.raises(PullError) as caught:
        puller(client, stream_name, "NOPE", GROUP).fetch(1, expires=5)
    assert time.monotonic() - started < 1  # no responders: no need to wait for the expiry
    assert caught.value.status == 503
    message = str(caught.value)
    assert f"{stream_name} > NOPE" in message and "does not exist" in message
    assert "\n" not in message


def test_acks_from_another_connection(
    client: Blocking[NatsClient],
    api: Blocking[JetStreamApi],
    stream: str,
    settings: ConnectionSettings,
) -> None:
    make_consumer(client, stream, "ACK", "pinned_client", ack_wait=to_nanos(30), group=GROUP)
    publish(client, stream, 3)
    fetched = puller(client, stream, "ACK", GROUP).fetch(3, expires=1)
    assert stream_seqs(fetched) == [1, 2, 3]
    assert api.consumer_info(stream, "ACK")["num_ack_pending"] == 3

    other = open_blocking(settings)
    try:
        for msg in fetched.messages:
            # With a reply subject the server confirms the ack once it is applied.
            run_sync(other.nc.request(msg.reply, b"+ACK", timeout=2))
    finally:
        run_sync(other.target.close())
    info = api.consumer_info(stream, "ACK")
    assert info["num_ack_pending"] == 0
    assert info["ack_floor"]["stream_seq"] == 3


@pytest.mark.parametrize("policy", ["pinned_client", "overflow", "prioritized"])
def test_create_consumer_keeps_priority_fields(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str, policy: str
) -> None:
    if policy == "prioritized":
        needs_server(client, (2, 12, 0), "the prioritized policy")
    extra = {"priority_timeout": to_nanos(1.5)} if policy == "pinned_client" else {}
    created = make_consumer(client, stream, "KEEP", policy, **extra, group=GROUP)
    for config in (created["config"], api.consumer_info(stream, "KEEP")["config"]):
        assert config["priority_groups"] == [GROUP]
        assert config["priority_policy"] == policy
        assert config["durable_name"] == "KEEP"
        if extra:
            assert config["priority_timeout"] == to_nanos(1.5)

    make_consumer(
        client, stream, "KEEP", policy, **extra, group=GROUP
    )  # the same config again: a no-op
    with pytest.raises(JetStreamApiError) as caught:
        make_consumer(client, stream, "KEEP", policy, **extra, max_ack_pending=7, group=GROUP)
    assert caught.value.err_code == 10148
    assert "\n" not in str(caught.value) and f"CONSUMER.CREATE.{stream}.KEEP" in str(caught.value)

    # An explicit update changes the config and keeps the priority fields.
    config = {"durable_name": "KEEP", "ack_policy": "explicit", "max_ack_pending": 7, **extra}
    config |= {"priority_groups": [GROUP], "priority_policy": policy}
    api.create_consumer(stream, "KEEP", config, action="update")
    updated = api.consumer_info(stream, "KEEP")["config"]
    assert updated["max_ack_pending"] == 7 and updated["priority_policy"] == policy


def test_max_bytes_loses_nothing(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(client, stream, "MB", None, group=GROUP)
    for _ in range(3):
        run_sync(client.js.publish(f"{stream}.m", b"x" * 200))
    pull = puller(client, stream, "MB", None)

    too_small = pull.fetch(1, expires=0.5, max_bytes=100)
    assert (too_small.status, too_small.messages) == (PullStatus.MAX_BYTES, [])
    assert "Message Size Exceeds MaxBytes" in too_small.description

    partial = pull.fetch(10, expires=0.5, max_bytes=450)  # room for one 200-byte message only
    assert (partial.status, stream_seqs(partial)) == (PullStatus.MAX_BYTES, [1])

    rest = pull.fetch(10, expires=0.3, max_bytes=10_000)
    assert (rest.status, stream_seqs(rest)) == (PullStatus.TIMEOUT, [2, 3])


def test_stored_messages_with_status_headers_are_delivered(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(client, stream, "HDR", None, group=GROUP)
    for status, description in (("100", "Idle Heartbeat"), ("408", "Request Timeout")):
        headers = {"Status": status, "Description": description}
        run_sync(client.js.publish(f"{stream}.h", b"", headers=headers))
    result = puller(client, stream, "HDR", None).fetch(2, expires=0.5)
    assert (result.status, stream_seqs(result), result.heartbeats) == (
        PullStatus.BATCH_COMPLETE,
        [1, 2],
        0,
    )


def test_what_a_request_given_up_on_delivers_is_collected(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    """The client stops waiting for a pull before the server ends it (a busy server ends it
    late); messages published then are still delivered to it. `collect_late` waits for the server's
    end of that request and hands them over instead of leaving them unread until the ack wait
    runs out."""
    make_consumer(client, stream, "LATE", None, group=GROUP)
    consumer = client.pull_consumer(stream, "LATE")

    async def scenario() -> tuple[PullStatus, Deliveries]:
        pull = await consumer.pull(10, expires=2.0, grace=-1.5)  # gives up at 0.5 s of 2 s
        async for _ in pull:
            pass
        for _ in range(3):
            await client.js.publish(f"{stream}.m", b"late")
        return pull.status, await consumer.collect_late(patience=10)

    status, late = run_sync(scenario())
    assert status is PullStatus.CLIENT_TIMEOUT
    assert late.data == [b"late"] * 3
    assert api.consumer_info(stream, "LATE").num_ack_pending == 3  # taken by us, not acked


def test_what_a_cancelled_whole_pull_gathered_is_collected(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    """A whole pull of 10 has taken 3 deliveries from the inbox when its reader is cancelled (a
    packed task that Spark stops early cancels its slots): `collect_late` hands them over, so
    that the give-back can return them, instead of leaving them to their ack wait."""
    make_consumer(client, stream, "CUT", None, group=GROUP)
    consumer = client.pull_consumer(stream, "CUT")

    async def scenario() -> Deliveries:
        # with idle heartbeats it wakes at each arrival and takes what came
        pull = await consumer.pull(10, expires=5.0, idle_heartbeat=1.0, whole=True)
        reading = asyncio.ensure_future(anext(pull))
        for _ in range(3):
            await client.js.publish(f"{stream}.m", b"taken")
        while pull.received < 3:
            await asyncio.sleep(0.01)
        assert not reading.done()
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        return await consumer.collect_late(patience=0.1)

    late = run_sync(scenario())
    assert late.data == [b"taken"] * 3


def _chunks_of_whole_pull(
    consumer: PullConsumer, batch: int, expires: float
) -> tuple[list[int], PullStatus, PullError | None]:
    """The chunk sizes a `whole` pull hands out, why it ended, and the error it raised last."""

    async def scenario() -> tuple[list[int], PullStatus, PullError | None]:
        pull = await consumer.pull(batch, expires=expires, whole=True)
        sizes = []
        try:
            async for chunk in pull:
                sizes.append(len(chunk))
        except PullError as error:
            return sizes, pull.status, error
        return sizes, pull.status, None

    return run_sync(scenario())


@pytest.mark.parametrize(("batch", "status"), [(3000, "BATCH_COMPLETE"), (5000, "TIMEOUT")])
def test_a_whole_pull_hands_out_all_it_delivered_at_once(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str, batch, status
) -> None:
    """3,000 deliveries take many socket reads; a `whole` pull hands them out in one chunk when
    its batch is in, or when its status ends it short of its batch."""
    make_consumer(client, stream, "WHOLE", None, group=GROUP, max_ack_pending=-1)
    publish(client, stream, 3000)
    consumer = client.pull_consumer(stream, "WHOLE")
    sizes, ended, error = _chunks_of_whole_pull(consumer, batch, expires=1.0)
    assert (sizes, ended, error) == ([3000], PullStatus[status], None)


def test_a_whole_pull_that_fails_hands_out_nothing(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    make_consumer(client, stream, "WHOLEGONE", None, group=GROUP)
    publish(client, stream, 3)
    consumer = client.pull_consumer(stream, "WHOLEGONE")

    async def delete_once_delivered() -> None:
        """Deletes the consumer once the pull's 3 deliveries are out, before its batch of 10."""
        while (await client.target.api.consumer_info(stream, "WHOLEGONE")).num_ack_pending < 3:
            await asyncio.sleep(0.02)
        await client.target.api.delete_consumer(stream, "WHOLEGONE")

    deleting = asyncio.run_coroutine_threadsafe(delete_once_delivered(), event_loop())
    sizes, _, error = _chunks_of_whole_pull(consumer, 10, expires=5.0)
    deleting.result(5)
    # Not taken: the deliveries come back after their ack wait (or to the recreated consumer).
    assert sizes == [] and error is not None and error.status == 409


def test_a_whole_pull_with_heartbeats_is_not_given_up_while_messages_trickle_in(
    client: Blocking[NatsClient], api: Blocking[JetStreamApi], stream: str
) -> None:
    """The server sends no idle heartbeat while it delivers, so a `whole` pull must not take a
    quiet spell of heartbeats for a dead server while deliveries short of its batch arrive."""
    make_consumer(client, stream, "TRICKLE", None, group=GROUP, max_ack_pending=-1)
    consumer = client.pull_consumer(stream, "TRICKLE")

    async def trickle() -> None:
        for n in range(12):
            await client.target.js.publish(f"{stream}.k", b"%d" % n)
            await asyncio.sleep(0.1)  # under the 0.25 s heartbeat: the server sends none

    async def scenario() -> tuple[list[int], PullStatus]:
        pull = await consumer.pull(100, expires=2.0, idle_heartbeat=0.25, whole=True)
        publishing = asyncio.ensure_future(trickle())
        sizes = [len(chunk) async for chunk in pull]
        await publishing
        return sizes, pull.status

    assert run_sync(scenario()) == ([12], PullStatus.TIMEOUT)
