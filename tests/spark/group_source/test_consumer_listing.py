"""Planning's consumer infos (`ConsumerListing`) without a server: a stream many slots read is
listed, the rest asked one by one; what a listing misses, and a listing refused, fall back to a
request per consumer."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from nats_spark.errors import NatsSparkError, NotFound, PermissionDenied
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.loop import run_sync
from nats_spark.spark.group_source.driver.consumer_listing import LIST_FROM, ConsumerListing
from nats_spark.spark.group_source.driver.targets import Slot

pytestmark = pytest.mark.unit


def slots(stream: str, count: int) -> list[Slot]:
    return [
        Slot(f"partition-{p}", stream, f"g-partition-{p}", "PCG", "pinned_client", "m1", True)
        for p in range(count)
    ]


class Api:
    """Listings and single infos as asked: `listed` holds each stream's listed consumers, or the
    error its listing raises."""

    def __init__(self, listed: dict[str, list[str] | Exception]) -> None:
        self.listed = listed
        self.listings: list[str] = []
        self.singles: list[str] = []

    async def consumer_infos(self, stream: str) -> dict[str, ConsumerInfo]:
        self.listings.append(stream)
        names = self.listed[stream]
        if isinstance(names, Exception):
            raise names
        return {name: ConsumerInfo({"name": name, "listed": True}) for name in names}

    async def single(self, slot: Slot) -> ConsumerInfo:
        self.singles.append(slot.consumer)
        return ConsumerInfo({"name": slot.consumer, "listed": False})


def infos(listing: ConsumerListing, api: Api, of: list[Slot]) -> list[ConsumerInfo]:
    """Planning's infos, once the first listings it started (not waited for) are answered."""
    client: Any = SimpleNamespace(api=api)

    async def planned() -> list[ConsumerInfo]:
        got = await listing.infos(client, of, api.single)
        await asyncio.gather(*listing.trying.values())
        return got

    return run_sync(planned())


def test_few_slots_on_a_stream_are_asked_one_by_one() -> None:
    api = Api({})
    few = slots("S", LIST_FROM - 1)
    got = infos(ConsumerListing(), api, few)
    assert [info["name"] for info in got] == [s.consumer for s in few]
    assert api.listings == [] and len(api.singles) == LIST_FROM - 1


def test_many_slots_on_a_stream_are_listed_and_what_the_listing_missed_is_asked() -> None:
    many, few = slots("S", LIST_FROM + 2), slots("T", 2)
    missed = many[3].consumer  # created after the listing, offline, or gone
    api, listing = Api({"S": [s.consumer for s in many if s.consumer != missed]}), ConsumerListing()
    first = infos(listing, api, many + few)  # learns the listing is allowed, beside them
    assert not any(info["listed"] for info in first)
    assert api.listings == ["S"] and len(api.singles) == len(many + few)
    api.singles.clear()
    got = infos(listing, api, many + few)
    assert [info["name"] for info in got] == [s.consumer for s in many + few]  # in order
    assert [info["listed"] for info in got] == [s.consumer != missed for s in many] + [False] * 2
    assert api.listings == ["S", "S"]
    assert api.singles == [missed] + [s.consumer for s in few]


def test_a_first_listing_is_not_waited_for() -> None:
    """A refused request answers only at its timeout: planning does not wait for the first."""
    many, answered = slots("S", LIST_FROM), asyncio.Event()
    api, listing = Api({"S": [s.consumer for s in many]}), ConsumerListing()
    listed = api.consumer_infos

    async def slow(stream: str) -> dict[str, ConsumerInfo]:
        await answered.wait()
        return await listed(stream)

    api.consumer_infos = slow  # type: ignore[method-assign]
    client: Any = SimpleNamespace(api=api)

    async def plan_twice() -> None:
        await listing.infos(client, many, api.single)
        await listing.infos(client, many, api.single)  # still not answered: not sent again
        answered.set()
        await asyncio.gather(*listing.trying.values())

    run_sync(plan_twice())
    assert len(api.singles) == 2 * LIST_FROM and listing.allowed == {"S": True}


def test_a_listing_refused_falls_back_for_good_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusal = PermissionDenied("permission denied to publish $JS.API.CONSUMER.LIST.S")
    api, listing, many = Api({"S": refusal}), ConsumerListing(), slots("S", LIST_FROM)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            got = infos(listing, api, many)
            assert [info["name"] for info in got] == [s.consumer for s in many]
    assert api.listings == ["S"]  # not asked again
    assert len(api.singles) == 3 * LIST_FROM and listing.allowed == {"S": False}
    warned = [r.getMessage() for r in caplog.records if "CONSUMER.LIST" in r.getMessage()]
    assert len(warned) == 1 and "allow $JS.API.CONSUMER.LIST.S " in warned[0], warned


def test_a_listing_of_a_stream_gone_leaves_it_to_each_slots_request() -> None:
    gone = NotFound("$JS.API.CONSUMER.LIST.S", 404, 10059, "stream not found")
    api, listing, many = Api({"S": gone}), ConsumerListing(), slots("S", LIST_FROM)
    infos(listing, api, many)
    infos(listing, api, many)
    assert api.listings == ["S", "S"] and listing.allowed == {}
    assert len(api.singles) == 2 * LIST_FROM


def test_a_listing_that_failed_otherwise_is_tried_again() -> None:
    failed = NatsSparkError("JetStream request $JS.API.CONSUMER.LIST.S failed: cluster busy")
    api, listing, many = Api({"S": failed}), ConsumerListing(), slots("S", LIST_FROM)
    infos(listing, api, many)
    infos(listing, api, many)
    assert api.listings == ["S", "S"] and listing.allowed == {}
