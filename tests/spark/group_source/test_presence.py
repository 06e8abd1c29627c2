"""Presence records (`driver.presence`) on a real ledger bucket: a live driver's record is
respected, a killed one's goes stale and is removed, a stopped one's is gone."""

from __future__ import annotations

import asyncio

import pytest

from nats_spark.client import NatsClient
from nats_spark.loop import Blocking, run_sync
from nats_spark.spark.group_source.driver import presence
from nats_spark.spark.group_source.driver.presence import Presence
from nats_spark.spark.group_source.ledger import Ledger


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refreshes and staleness in tenths of seconds: the verdicts, not the figures, are tested."""
    monkeypatch.setattr(presence, "REFRESH_SECONDS", 0.2)
    monkeypatch.setattr(presence, "STALE_SECONDS", 1.0)
    monkeypatch.setattr(presence, "SWEEP_SECONDS", 0.5)


def test_live_respected_killed_released_stopped_gone(
    client: Blocking[NatsClient], unique: str
) -> None:
    async def scenario() -> None:
        nc = client.target
        kv = await Ledger.bucket(nc, f"L{unique}", create=True)
        live = "query.S.g.live.*"
        old = Presence(lambda: nc, lambda: kv, "query.S.g")
        new = Presence(lambda: nc, lambda: kv, "query.S.g")
        await old.start()
        await new.start()
        assert not await new.is_dead(old.driver, until_sure=True)  # written again: live
        assert not await new.is_dead("never-ran")  # no record proves nothing
        old.stopping.set()  # its writes stop, its record stays: as under kill -9
        assert old.running is not None
        await old.running
        assert not await new.is_dead(old.driver)  # not stale yet
        assert await new.is_dead(old.driver, until_sure=True)
        assert await kv.keys_matching(live) == [new.key]  # the dead one's removed
        await new.stop()
        assert await kv.keys_matching(live) == []

    run_sync(scenario())


def test_a_new_driver_removes_a_dead_one_s_stale_record(
    client: Blocking[NatsClient], unique: str
) -> None:
    """Records of drivers that died go when a driver of the target finds them stale: at its
    start, and while it runs (a driver killed after it started)."""

    async def scenario() -> None:
        nc = client.target
        kv = await Ledger.bucket(nc, f"L{unique}", create=True)
        await kv.put("query.S.g.live.dead1", b"")
        await kv.put("query.S.other.live.dead2", b"")  # another target's: not this driver's
        await kv.put("query.S.g.live.fresh", b"")
        newcomer = Presence(lambda: nc, lambda: kv, "query.S.g")
        await asyncio.sleep(1.2)  # time under test: both went stale; a live driver's is
        await kv.put("query.S.g.live.fresh", b"")  # written again
        await newcomer.start()
        assert sorted(await kv.keys_matching("query.S.*.live.*")) == sorted(
            ["query.S.g.live.fresh", "query.S.other.live.dead2", newcomer.key]
        )
        await asyncio.sleep(2.5)  # time under test: fresh goes stale; the running one sweeps
        assert sorted(await kv.keys_matching("query.S.*.live.*")) == sorted(
            ["query.S.other.live.dead2", newcomer.key]
        )
        await newcomer.stop()

    run_sync(scenario())
