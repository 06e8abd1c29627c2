"""Executor side: the pulls of one slot's task, through the one pull loop (`jetstream/pull_loop`),
as `SlotPullPolicy` decides them.

What one request delivers is handed out in one chunk once the request has ended (the caller
records it then). A request that has delivered all it asked for has the next one sent before
its deliveries are handed out, so the server serves it while they are processed; not with
siblings: deliveries of an early pull would wait unrecorded while the rows before them are
handed out, and past the ack wait come back to a sibling that cannot tell they were taken.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

from nats_spark.errors import PullError
from nats_spark.jetstream.pull import Deliveries, Pull, PullConsumer
from nats_spark.jetstream.pull_loop import PullLoop, PullPlan, Thresholds
from nats_spark.spark.group_source.task.pull_policy import SlotPullPolicy, complete

log = logging.getLogger(__name__)


class SlotPulls:
    """Pulls for one slot until the policy ends them or `want` messages were taken. The caller
    reports what it takes of each chunk (`took`): the policy's decisions rest on it."""

    def __init__(
        self,
        consumer: PullConsumer,
        policy: SlotPullPolicy,
        thresholds: Thresholds,
        want: int,
        siblings: bool,
        ack_wait: float,
        label: str,
    ) -> None:
        self.consumer = consumer
        self.policy = policy
        self.loop = PullLoop(consumer, self._plan, thresholds=thresholds)
        self.want = want  # messages still to take
        self.siblings = siblings
        self.ack_wait = ack_wait
        self.label = label
        self.took_any = False
        self.progress = 0  # deliveries taken or acked as an earlier batch's, in all
        self.progress_before = 0  # ... when the current request was sent

    def _plan(self) -> PullPlan | None:
        return self.policy.next(self.want)

    def took(self, taken: int, acked: int) -> None:
        """Of the chunk just handed out, `taken` were taken and `acked` were an earlier batch's."""
        self.want -= taken
        self.took_any = self.took_any or taken > 0
        self.progress += taken + acked

    def over(self) -> bool:
        """Whether the chunk just handed out (and reported to `took`) is the last: no more is
        wanted, and nothing more can come, late or not."""
        return self.want <= 0 and self.consumer.drained()

    async def chunks(self) -> AsyncGenerator[tuple[Deliveries, float], None]:
        """What each request delivered, in one chunk once it has ended (its pulls are `whole`:
        the caller records a batch's rows only once a request ends, and each chunk's steps,
        accept, columns and the ack numbers' parse, cost about as much per chunk as per message
        when a read brings a dozen messages, as it does while the task keeps up with the
        server); with it, when that request was sent (no delivery of it left the server
        before)."""
        loop = self.loop
        while True:
            try:
                got = await loop.next()
            except PullError as error:
                if not self.policy.refused(error):
                    log.warning("slot %s: %s; ending its batch early", self.label, error)
                    break
                loop.drop_refused()
                self.progress_before = self.progress
                continue
            if got is None:
                break
            if not isinstance(got, Deliveries):  # the request that ended
                if not self._again(got):
                    break
                continue
            pull = loop.pulls[0]  # ended: its deliveries come whole
            if len(loop.pulls) == 1 and _sent_all(pull) and not self.siblings:
                plan = self.policy.early(self.want - len(got))
                if plan is not None:
                    try:
                        await loop.send_ahead(plan)
                    except asyncio.CancelledError:  # cut off: `collect_late` hands it back
                        self.consumer.cut_off.extend(got)
                        raise
            yield got, pull.sent
        # Requests given up on may still deliver: take that too (the batch then holds a little
        # more than planned) rather than leave it unread until its ack wait runs out. It was
        # sent for a request not ended yet: no sooner than the oldest of them was made.
        requested = self.consumer.requested_since()
        late = await self.consumer.collect_late(self.ack_wait / 2)
        if late:
            yield late, requested

    def _again(self, pull: Pull) -> bool:
        """After `pull` ended: whether to pull on (the policy's decision)."""
        new = self.progress != self.progress_before
        self.progress_before = self.progress
        return self.policy.ended(pull.status, pull.received, new, self.took_any)


def _sent_all(pull: Pull) -> bool:
    """Whether `pull` delivered all it could: the next one can be sent before its messages are
    processed."""
    return pull.received > 0 and complete(pull.status)
