"""Bulk publishes with message ids against a real server: two attempts of one task at once (a
speculative copy, or a zombie beside its retry) store each message once, row by row and in
atomic batches, and a retry after a complete attempt stores nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from spark_helpers import needs_server

from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NotFound
from nats_spark.jetstream.publish import OutMessage, Publisher, PublishStats
from nats_spark.loop import Blocking, run_sync

COUNT = 2500


@pytest.fixture(params=[0, 200], ids=["row-by-row", "atomic"])
def atomic_batch(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def stream(client: Blocking[NatsClient], unique: str, atomic_batch: int) -> Iterator[str]:
    if atomic_batch:  # 2.11 ignores allow_atomic (the sink then publishes row by row)
        needs_server(client, (2, 12, 0), "atomic batch publish")
    name = f"PUB_{unique}"
    config = {"name": name, "subjects": [f"{name}.>"], "allow_atomic": bool(atomic_batch)}
    run_sync(client.api.create_stream(config))
    yield name
    with contextlib.suppress(NotFound):
        run_sync(client.api.delete_stream(name))


def messages(stream: str) -> list[OutMessage]:
    return [
        OutMessage(f"{stream}.k{n % 7}", str(n).encode(), [("n", str(n))], f"task-1.{n}")
        for n in range(COUNT)
    ]


async def attempt(
    settings: ConnectionSettings, stream: str, atomic_batch: int, pause: float
) -> PublishStats:
    """One task attempt on a connection of its own: publish every message, in chunks of 300
    with `pause` seconds between them, and wait for the stream's confirmations."""
    client = await NatsClient.open(settings)
    publisher = Publisher(client.nc, 1000, 2.0, 30.0, atomic_batch)
    await publisher.start()
    try:
        everything = messages(stream)
        for start in range(0, COUNT, 300):
            await publisher.send(everything[start : start + 300])
            await asyncio.sleep(pause)
        return await publisher.finish()
    finally:
        await publisher.stop()
        await client.close()


def stored_values(client: Blocking[NatsClient], stream: str) -> list[int]:
    count = run_sync(client.api.stream_info(stream))["state"]["messages"]
    return [
        int(run_sync(client.api.get_message(stream, seq)).data.decode())
        for seq in range(1, count + 1)
    ]


def test_two_attempts_at_once_store_each_message_once(client, settings, stream, atomic_batch):
    async def both() -> list[PublishStats]:
        return await asyncio.gather(
            attempt(settings, stream, atomic_batch, 0.0),
            attempt(settings, stream, atomic_batch, 0.01),
        )

    first, second = run_sync(both(), timeout=120)
    values = stored_values(client, stream)
    assert sorted(values) == list(range(COUNT)), "a message stored twice or not at all"
    assert first.published + second.published == COUNT
    # each message was confirmed to each attempt: stored by one, a duplicate to the other
    assert first.published + first.duplicates == COUNT
    assert second.published + second.duplicates == COUNT
    if atomic_batch:
        assert first.batches + second.batches == COUNT // atomic_batch + 1


def test_a_retry_after_a_complete_attempt_stores_nothing(client, settings, stream, atomic_batch):
    done = run_sync(attempt(settings, stream, atomic_batch, 0.0), timeout=120)
    again = run_sync(attempt(settings, stream, atomic_batch, 0.0), timeout=120)
    assert (done.published, again.published, again.duplicates) == (COUNT, 0, COUNT)
    assert sorted(stored_values(client, stream)) == list(range(COUNT))
