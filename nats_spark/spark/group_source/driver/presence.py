"""Driver: a running query's presence record in the ledger bucket, so that a query that finds
the pins of the target's last query can tell a live holder from a dead one.

A driver writes `<pointer key>.live.<driver id>` when it connects and again every
`REFRESH_SECONDS` (one key, overwritten: nothing grows with the run), names its id in the
pointer (`Pointer.driver`), and removes the record at stop. A driver killed with kill -9 never
unpins and never removes it: its record then stops being written. A record last written more
than `STALE_SECONDS` ago, by the clock of the server that stored it (compared with a write made
just now, so that no two machines' clocks meet), is a dead driver's; its pins may be released at
once instead of waiting out the priority timeout. No record (a query of the previous release, or
one that stopped and released its pins) proves nothing: its pins are waited out, as before.
Records of dead drivers are removed by a driver of the target that finds them stale (at its
start and every `SWEEP_SECONDS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime

from nats_spark import clock
from nats_spark.client import NatsClient
from nats_spark.errors import NatsSparkError
from nats_spark.spark.group_source.ledger import Bucket
from nats_spark.spark.group_source.runtime import PROCESS

log = logging.getLogger(__name__)

REFRESH_SECONDS = 2.0  # between a live driver's writes of its record
# A record not written for this long is a dead driver's: a live one's loop would have to stall
# five refreshes in a row to look dead.
STALE_SECONDS = 10.0
SWEEP_SECONDS = 60.0  # between a running driver's looks for dead drivers' records to remove


class Presence:
    """This driver's record, and the verdicts on other drivers' records of the same target."""

    def __init__(
        self,
        client_of: Callable[[], NatsClient],
        kv_of: Callable[[], Bucket],
        pointer_key: str,
        new_id: Callable[[], str] = PROCESS.new_id,
    ) -> None:
        # The driver may replace its connection, and with it the bucket's handle.
        self.client_of = client_of
        self.kv_of = kv_of
        self.prefix = f"{pointer_key}.live"
        self.driver = new_id()[:12]
        self.stopping = asyncio.Event()
        self.dead: set[str] = set()  # drivers whose record was found stale (and removed)
        self.fresh: dict[str, float] = {}  # by driver: when (monotonic) its record was fresh
        self.running: asyncio.Future[None] | None = None
        self.swept = 0.0  # when (monotonic) the records of dead drivers were last looked for

    @property
    def key(self) -> str:
        return f"{self.prefix}.{self.driver}"

    async def start(self) -> None:
        """Write the record, then keep it fresh in the background; remove the stale records of
        drivers of this target that died."""
        await self.kv_of().put(self.key, b"")
        self.running = asyncio.ensure_future(self._refresh())
        await self._sweep()

    async def _sweep(self) -> None:
        """Remove the records of this target's drivers that went stale."""
        self.swept = clock.monotonic()
        try:
            for key in await self.kv_of().keys_matching(f"{self.prefix}.*"):
                driver = key.rsplit(".", 1)[1]
                if driver != self.driver:
                    await self.is_dead(driver)
        except NatsSparkError as error:  # left for a later sweep: this driver reads on
            log.warning("removing dead queries' presence records failed: %s", error)

    async def _refresh(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), REFRESH_SECONDS)
            if self.stopping.is_set():
                return
            try:
                await self.kv_of().put(self.key, b"")
            except Exception as error:  # a failed write is retried at the next refresh
                log.warning("writing the query's presence record failed: %s", error)
            if clock.monotonic() - self.swept > SWEEP_SECONDS:  # a driver killed since
                await self._sweep()

    async def stop(self) -> None:
        """At stop: no more writes, and the record removed."""
        self.stopping.set()
        if self.running is not None:
            await self.running
        await self.kv_of().remove(self.key)

    async def is_dead(self, driver: str, until_sure: bool = False) -> bool:
        """Whether `driver`'s record shows it dead (removing the record once it does); False
        while the record is fresh, or when there is none and it was not found dead before.
        `until_sure`: a record not written lately is watched until it is written again (live)
        or goes stale (dead), at most `STALE_SECONDS`."""
        if driver in self.dead:
            return True
        looked = self.fresh.get(driver, -REFRESH_SECONDS)
        if not until_sure and clock.monotonic() - looked < REFRESH_SECONDS:
            return False  # looked at lately: at most one look per refresh
        key = f"{self.prefix}.{driver}"
        first = await self._written_at(key)
        while first is not None:
            last = await self._written_at(key)
            if last is None or last != first:
                break  # removed at its stop, or written again: live
            await self.kv_of().put(self.key, b"")  # now, by the same clock
            now = await self._written_at(self.key)
            age = 0.0 if now is None else (now - last).total_seconds()
            if age > STALE_SECONDS:
                self.dead.add(driver)
                await self.kv_of().remove(key)
                log.info("the query of driver %s is gone: its presence record went stale", driver)
                return True
            if not until_sure:
                break
            await asyncio.sleep(min(REFRESH_SECONDS, STALE_SECONDS - age) / 2)
        self.fresh[driver] = clock.monotonic()
        return False

    async def _written_at(self, key: str) -> datetime | None:
        bucket = self.kv_of().name
        found = await self.client_of().api.last_message(f"KV_{bucket}", f"$KV.{bucket}.{key}")
        return None if found is None else datetime.fromisoformat(found.time)
