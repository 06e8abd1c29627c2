"""Driver side: the consumer infos planning reads at every trigger, many at once.

Planning looks at every slot's consumer at every trigger, an idle one too: how much is pending,
ack pending and pinned. Where many of the query's consumers read one stream, one `CONSUMER.LIST`
page reports up to 256 of them, so planning at 256 slots sends one request where it sent 256,
and an idle trigger costs the server a page instead of a request per slot. Below `LIST_FROM` on
a stream, a request per consumer (all at once) costs as little. A consumer the pages do not
show (offline on a cluster node, created since, or gone) gets a request of its own, which heals
what is gone; a user not allowed the listing gets a request per consumer from then on.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from nats_spark.client import NatsClient
from nats_spark.errors import NatsSparkError, NotFound
from nats_spark.jetstream.replies import ConsumerInfo
from nats_spark.requests_at_once import all_results
from nats_spark.spark.group_source.driver.targets import Slot

log = logging.getLogger(__name__)

LIST_FROM = 8  # slots on one stream from which planning lists its consumers


class ConsumerListing:
    """The infos of planning's slots, listed per stream where many read it."""

    def __init__(self) -> None:
        self.refused = False  # the user may not list consumers: one request per consumer

    async def infos(
        self,
        client: NatsClient,
        slots: Sequence[Slot],
        single: Callable[[Slot], Awaitable[ConsumerInfo]],
    ) -> list[ConsumerInfo]:
        """The info of each slot's consumer, in the order of `slots`; `single` asks for one."""
        listed: dict[tuple[str, str], ConsumerInfo] = {}
        many = Counter(slot.stream for slot in slots)
        for stream in [] if self.refused else [s for s, n in many.items() if n >= LIST_FROM]:
            infos = await self._listed(client, stream)
            listed.update(((stream, name), info) for name, info in infos.items())

        async def info(slot: Slot) -> ConsumerInfo:
            found = listed.get((slot.stream, slot.consumer))
            return found if found is not None else await single(slot)

        return await all_results(info(slot) for slot in slots)

    async def _listed(self, client: NatsClient, stream: str) -> dict[str, ConsumerInfo]:
        try:
            return await client.api.consumer_infos(stream)
        except NotFound:
            return {}  # the stream is gone: each slot's own request says so
        except NatsSparkError as error:
            self.refused = True
            log.warning(
                "listing the consumers of stream %s failed (%s); planning asks for each "
                "consumer's info instead (allow $JS.API.CONSUMER.LIST.%s to save the requests)",
                stream,
                error,
                stream,
            )
            return {}
