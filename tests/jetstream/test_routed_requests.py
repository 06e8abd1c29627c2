"""Requests whose replies come raw to one subscription (`RoutedRequests`, the ack ledger's KV
calls) fail as nats-py's `request` does: no responders, and no reply within the timeout; many at
once each get their own reply. The KV semantics on top are in
tests/spark/group_source/test_ledger_bucket.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from nats_spark.client import NatsClient
from nats_spark.loop import Blocking, run_sync


def test_no_responders_and_no_reply(client: Blocking[NatsClient], unique: str) -> None:
    requests = client.target.routed_requests
    with pytest.raises(NoRespondersError):
        run_sync(requests.request(f"nobody.{unique}", b"", 5.0))
    silent = run_sync(client.target.nc.subscribe(f"silent.{unique}"))
    started = time.monotonic()
    with pytest.raises(NatsTimeout):
        run_sync(requests.request(f"silent.{unique}", b"", 0.3))
    assert 0.25 < time.monotonic() - started < 3
    run_sync(silent.unsubscribe())
    assert not requests._waiting  # nothing left behind by either


def test_replies_reach_their_requests(client: Blocking[NatsClient], unique: str) -> None:
    nc = client.target.nc

    async def echo(msg: Msg) -> None:
        await asyncio.sleep(0.001 * (int(msg.data) % 5))  # answered out of order
        await msg.respond(msg.data + msg.headers["H"].encode())

    async def many() -> list[bytes]:
        await nc.subscribe(f"echo.{unique}", cb=echo)
        requests = client.target.routed_requests
        return await asyncio.gather(
            *(requests.request(f"echo.{unique}", b"%d" % i, 5.0, {"H": "h"}) for i in range(50))
        )

    assert run_sync(many()) == [b"%dh" % i for i in range(50)]
