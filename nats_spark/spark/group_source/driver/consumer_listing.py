"""Driver side: the consumer infos planning reads at every trigger, many at once.

Planning looks at every slot's consumer at every trigger, an idle one too: how much is pending,
ack pending and pinned. Where many of the query's consumers read one stream, one `CONSUMER.LIST`
page reports up to 256 of them, so planning at 256 slots sends one request where it sent 256,
and an idle trigger costs the server a page instead of a request per slot. Below `LIST_FROM` on
a stream, a request per consumer (all at once) costs as little. A consumer the pages do not
show (offline on a cluster node, created since, or gone) gets a request of its own, which heals
what is gone.

Whether the user may list a stream's consumers is learnt by a first listing sent beside
planning's own requests, not waited for: the first planning asks each consumer, as it would
without the permission (users whose permissions predate the listing lack it). Refused, the
stream is asked a request per consumer from then on, with a warning naming the subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from nats_spark.client import NatsClient
from nats_spark.errors import NatsSparkError, NotFound, PermissionDenied
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.requests_at_once import all_results
from nats_spark.spark.group_source.driver.targets import Slot

log = logging.getLogger(__name__)

LIST_FROM = 8  # slots on one stream from which planning lists its consumers


class ConsumerListing:
    """The infos of planning's slots, listed per stream where many read it."""

    def __init__(self) -> None:
        self.allowed: dict[str, bool] = {}  # by stream, once a listing was answered
        self.trying: dict[str, asyncio.Future[None]] = {}  # first listings on their way

    async def infos(
        self,
        client: NatsClient,
        slots: Sequence[Slot],
        single: Callable[[Slot], Awaitable[ConsumerInfo]],
    ) -> list[ConsumerInfo]:
        """The info of each slot's consumer, in the order of `slots`; `single` asks for one."""
        listed: dict[tuple[str, str], ConsumerInfo] = {}
        for stream, count in Counter(slot.stream for slot in slots).items():
            if count < LIST_FROM:
                continue
            if self.allowed.get(stream):
                infos = await self._listed(client, stream)
                listed.update(((stream, name), info) for name, info in infos.items())
            elif stream not in self.allowed and stream not in self.trying:
                self.trying[stream] = asyncio.ensure_future(self._try(client, stream))

        found = [listed.get((slot.stream, slot.consumer)) for slot in slots]
        unlisted = [slot for slot, info in zip(slots, found, strict=True) if info is None]
        asked = iter(await all_results(single(slot) for slot in unlisted))
        return [f if f is not None else next(asked) for f in found]

    async def _try(self, client: NatsClient, stream: str) -> None:
        """A first listing of `stream`, to learn whether the user may list it."""
        try:
            await self._listed(client, stream)
        except Exception as error:  # not known yet: the next planning tries again
            log.debug("listing the consumers of stream %s failed: %s", stream, error)
        finally:
            self.trying.pop(stream, None)

    async def _listed(self, client: NatsClient, stream: str) -> dict[str, ConsumerInfo]:
        try:
            infos = await client.api.consumer_infos(stream)
        except NotFound:
            return {}  # the stream is gone: each slot's own request says so
        except PermissionDenied:
            self.allowed[stream] = False
            log.warning(
                "the user may not list the consumers of stream %s: planning asks for each "
                "consumer's info instead (allow $JS.API.CONSUMER.LIST.%s to save the requests)",
                stream,
                stream,
            )
            return {}
        except NatsSparkError as error:
            log.info("listing the consumers of stream %s failed: %s", stream, error)
            return {}  # each slot's own request, this time
        self.allowed[stream] = True
        return infos

    async def close(self) -> None:
        for trying in list(self.trying.values()):
            trying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trying
