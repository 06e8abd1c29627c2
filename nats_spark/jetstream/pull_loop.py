"""One pull loop, as nats.go's `Consume`/`Messages`: keeps pull requests out on a consumer and
hands out what they deliver as it arrives. The `nats` format's range reads, the group source's
slot reads and the groups library's members pull through it; each says, per request, what to ask
for next."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from nats_spark.jetstream.pull import CLIENT_GRACE, Deliveries, Pull, PullConsumer


@dataclass(frozen=True)
class PullPlan:
    """One pull request to send: `expires` None for a no-wait pull; `max_bytes` 0: uncapped;
    `idle_heartbeat`: how often the server shows it is alive while the request waits; `whole`:
    its deliveries are handed out at once when it has ended, not as they arrive (see `Pull`);
    `grace`: how long past its expiry the client waits for the server to end it."""

    batch: int
    expires: float | None
    max_bytes: int = 0
    idle_heartbeat: float | None = None
    whole: bool = False
    grace: float = CLIENT_GRACE


@dataclass(frozen=True)
class Thresholds:
    """What every pull of a priority-group client asks beyond its size: an overflow client's
    thresholds (served only while num_pending or num_ack_pending reaches one), a prioritized
    client's priority (0-9, lower served first). The pin, and a 423 clearing it, are the
    `PullConsumer`'s, made with the group."""

    min_pending: int = 0
    min_ack_pending: int = 0
    priority: int | None = None


async def send(consumer: PullConsumer, plan: PullPlan, thresholds: Thresholds) -> Pull:
    """Send the pull request `plan` describes."""
    return await consumer.pull(
        plan.batch,
        expires=plan.expires or 0,
        max_bytes=plan.max_bytes,
        no_wait=plan.expires is None,
        idle_heartbeat=plan.idle_heartbeat,
        min_pending=thresholds.min_pending,
        min_ack_pending=thresholds.min_ack_pending,
        priority=thresholds.priority,
        whole=plan.whole,
        grace=plan.grace,
    )


class PullLoop:
    """Pulls from `consumer`: keeps up to `in_flight` requests out, each as `plan` says when it
    is about to be sent (None: none now), served in the order sent."""

    def __init__(
        self,
        consumer: PullConsumer,
        plan: Callable[[], PullPlan | None],
        *,
        in_flight: int = 1,
        thresholds: Thresholds = Thresholds(),
    ) -> None:
        self.consumer = consumer
        self.plan = plan
        self.in_flight = in_flight
        self.thresholds = thresholds
        self.pulls: deque[Pull] = deque()  # sent and not ended, oldest first

    async def next(self) -> Deliveries | Pull | None:
        """Deliveries as they arrive, or a request that has ended (its `status` says why); None
        once `plan` wants no more and no request is out. A request the server refuses raises
        (`PullError`) and stays first in `pulls`."""
        while len(self.pulls) < self.in_flight and (plan := self.plan()) is not None:
            await self._send(plan)
        if not self.pulls:
            return None
        try:
            return await anext(self.pulls[0])
        except StopAsyncIteration:
            return self.pulls.popleft()

    async def send_ahead(self, plan: PullPlan) -> None:
        """Send a request now, behind those out: for a reader that knows the first one has
        delivered all it will, so the server serves this one while that one's deliveries are
        processed."""
        await self._send(plan)

    def drop_refused(self) -> None:
        """Forget the first request, which the server refused (`next` raised): it delivers
        nothing more, and the next call plans afresh."""
        self.pulls.popleft()

    async def _send(self, plan: PullPlan) -> None:
        self.pulls.append(await send(self.consumer, plan, self.thresholds))
