"""The ledger bucket's contract (`nats_spark.spark.group_source.ledger.Bucket`) as cases that run
against any bucket: the memory one and a real one (tests/spark/group_source/test_ledger_bucket.py),
and a real one reached through a domain or an imported API (tests/test_deployments_*.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from nats_spark.client import NatsClient
from nats_spark.loop import run_sync
from nats_spark.spark.group_source.ledger import Bucket, Ledger

Case = Callable[[Bucket], Awaitable[None]]


async def create_refuses_a_key_that_has_a_value(kv: Bucket) -> None:
    first = await kv.create("a.1", b"x")
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.create("a.1", b"y")
    entry = await kv.get("a.1")
    assert (entry.value, entry.revision) == (b"x", first)


async def update_is_compare_and_set_on_the_revision(kv: Bucket) -> None:
    first = await kv.create("a.1", b"x")
    other = await kv.put("b.1", b"z")  # revisions are the bucket's, across keys
    assert other > first
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update("a.1", b"y", last=other)
    second = await kv.update("a.1", b"y", last=first)
    assert second > other
    with pytest.raises(KeyWrongLastSequenceError):  # a zombie's write with what it last saw
        await kv.update("a.1", b"old", last=first)
    assert (await kv.get("a.1")).value == b"y"


async def update_of_a_missing_key_needs_revision_zero(kv: Bucket) -> None:
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update("a.1", b"x", last=5)
    assert await kv.update("a.1", b"x", last=0) > 0


async def remove_takes_the_key_and_those_below_it_and_leaves_nothing(kv: Bucket) -> None:
    await kv.create("a.1", b"head")
    await kv.put("a.1.att.0", b"chunk")
    await kv.put("a.10", b"another entry")
    await kv.remove("a.1")
    for gone in ("a.1", "a.1.att.0"):
        with pytest.raises(KeyNotFoundError):
            await kv.get(gone)
    assert await kv.keys_matching("a.*") == ["a.10"]
    assert await kv.create("a.1", b"again") > 0  # no marker left to refuse it
    await kv.remove("never.written")


async def keys_of_an_empty_bucket(kv: Bucket) -> None:
    assert await kv.keys_matching("a.*") == []
    with pytest.raises(KeyNotFoundError):
        await kv.get("a.1")


async def keys_matching_takes_whole_tokens(kv: Bucket) -> None:
    for key in ("L.1.p0", "L.1.p0.att.0", "L.12.p1", "L2.1.p0", "M.1.p0"):
        await kv.put(key, b"x")
    assert sorted(await kv.keys_matching("L.*.*")) == ["L.1.p0", "L.12.p1"]
    assert sorted(await kv.keys_matching("L.1.p0.*.*")) == ["L.1.p0.att.0"]
    assert sorted(await kv.keys_matching("L.>")) == ["L.1.p0", "L.1.p0.att.0", "L.12.p1"]


CASES = [
    create_refuses_a_key_that_has_a_value,
    update_is_compare_and_set_on_the_revision,
    update_of_a_missing_key_needs_revision_zero,
    remove_takes_the_key_and_those_below_it_and_leaves_nothing,
    keys_of_an_empty_bucket,
    keys_matching_takes_whole_tokens,
]


def run_contract(client: NatsClient, name: str, cases: list[Case] = CASES) -> None:
    """`cases` on a new ledger bucket each (`<name>-<n>`), reached through `client`. Not one
    name again: a stream deleted and created again at once on a hub may still hold the deleted
    one's messages (nats-server 2.15 through a leaf node, with nats-py's KV as well)."""
    for n, case in enumerate(cases):
        kv = run_sync(Ledger.bucket(client, f"{name}-{n}", create=True))
        try:
            run_sync(case(kv))
        finally:
            run_sync(client.js.delete_key_value(kv.name))
