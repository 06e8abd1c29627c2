"""What a slot's task does after each pull: pull again (how many, waiting or not, capped how),
stop, or fail. Pure: `SlotPulls` does the pulling and hands this the outcomes.

The first pull does not wait: what is ready is taken at once. A pull that ends empty (404 or 408)
is followed by a wait (`fetchTimeout`, or an availableNow run's wait for redeliveries, the
longer), for redeliveries or for a pin to free up, once; after that, or once this task has taken
anything, an empty pull ends the batch. A waiting pull lasts at most a third of the ack wait, and
the wait goes on in further pulls, and the client waits at most a sixth of the ack wait past a
pull's expiry for the server to end it: what a request delivers is handed out only when it ends,
and held by nothing until then, so within half the ack wait of its sending (seed 5797 of the
worlds with another client: a server restart forgot a pull that had delivered a message, the
client waited 5 s past its expiry, the message's 4 s ack wait ran out meanwhile, another client
took it, and the batch committed it too). A lost pin (423) is asked for
again a few times; other interruptions (leadership change, server shutdown, a missed heartbeat)
are retried a few times; pulls that bring back only what the batch holds already (a stall past
the ack wait) end it, as pulling on would take the same ones over and over.
"""

from __future__ import annotations

from nats_spark.errors import PullError
from nats_spark.jetstream.pull import CLIENT_GRACE, PullStatus, max_bytes_after
from nats_spark.jetstream.pull_loop import PullPlan
from nats_spark.jetstream.status import StatusKind, classify
from nats_spark.spark.shared.columns import BATCH_BYTES, BATCH_ROWS

PIN_RETRIES = 3
TRANSIENT_RETRIES = 5
HELD_ONLY_PULLS = 3  # pulls in a row that bring back only what the batch holds: stop pulling
WAITING_PULL_SHARE = 1 / 3  # of the ack wait: the longest a waiting pull lasts
GRACE_SHARE = 1 / 6  # of the ack wait: the longest the client waits past a pull's expiry


def complete(status: PullStatus) -> bool:
    """Whether a pull that ended with `status` got all it could: more may be ready at once."""
    return status is PullStatus.BATCH_COMPLETE or status is PullStatus.MAX_BYTES


class SlotPullPolicy:
    """The decisions of one slot's pull loop, and the little state they need."""

    def __init__(
        self,
        fetch_batch_size: int,
        fetch_timeout: float,
        redelivery_wait: float = 0.0,
        ack_wait: float = 30.0,
    ) -> None:
        self.fetch_batch_size = fetch_batch_size
        self.fetch_timeout = fetch_timeout
        self.redelivery_wait = redelivery_wait  # the wait's least length
        self.longest_pull = ack_wait * WAITING_PULL_SHARE
        self.grace = min(CLIENT_GRACE, ack_wait * GRACE_SHARE)
        # A pull's deliveries become one record batch whole: the record batch's bounds cap it,
        # which bounds what a worker holds at a time.
        self.max_bytes = BATCH_BYTES
        self.wait = False  # the next pull waits (`fetch_timeout`) for messages
        self.waited = False
        self.wait_left = 0.0  # of the wait, after the pulls that waited so far
        self.expires = 0.0  # the last waiting pull's
        self.pin_retries = 0
        self.transient = 0
        self.held_only = 0

    def next(self, want: int) -> PullPlan | None:
        """The next pull, for at most `want` more messages; None when none is wanted."""
        if not self.wait:
            return self._plan(want, None)
        self.expires = min(self.wait_left, self.longest_pull)
        return self._plan(want, self.expires)

    def early(self, want: int) -> PullPlan | None:
        """The pull sent while the last one's deliveries are processed (it was served in full,
        so more is likely ready): no wait."""
        return self._plan(want, None)

    def _plan(self, want: int, expires: float | None) -> PullPlan | None:
        if want <= 0:
            return None
        batch = min(self.fetch_batch_size, BATCH_ROWS, want)
        return PullPlan(batch, expires, self.max_bytes, whole=True, grace=self.grace)

    def ended(self, status: PullStatus, received: int, new: bool, got_any: bool) -> bool:
        """After a pull that ended with `status` and delivered `received` messages (`new`: any
        of them new to this batch, or acked as an earlier batch's; `got_any`: this task took
        messages already): whether to pull again, as `next` then says."""
        if received and not new:
            self.held_only += 1
            if self.held_only >= HELD_ONLY_PULLS:
                return False
        else:
            self.held_only = 0
        if complete(status):
            self.wait = False
            self.max_bytes = max_bytes_after(status, received, self.max_bytes)
            return True
        if status is PullStatus.PIN_MISMATCH:
            self.pin_retries += 1  # the pin id was cleared: the next pull asks for a new pin
            return self.pin_retries <= PIN_RETRIES
        if status is PullStatus.NO_MESSAGES or status is PullStatus.TIMEOUT:
            if received:
                self.wait = False  # drained what was ready; look again without waiting
                return True
            if self.wait and self.wait_left > self.expires:  # a pull's share of the wait ended
                self.wait_left -= self.expires
                return True
            if self.waited or got_any:
                return False
            self.wait = self.waited = True  # nothing ready: wait once
            self.wait_left = max(self.fetch_timeout, self.redelivery_wait)
            return True
        self.transient += 1
        return self.transient <= TRANSIENT_RETRIES

    def refused(self, error: PullError) -> bool:
        """After the server refused a pull: True to pull again (`next`), False to end the batch
        with what it holds; raises `error` when the task must fail on it."""
        if error.consumer_gone:
            # Elastic member consumers come and go (inactivity, membership changes): the driver
            # recreates the consumer.
            return False
        if self.max_bytes and classify(error.status, error.description) is StatusKind.BYTES_LIMIT:
            self.max_bytes = 0  # the consumer caps a pull's bytes below ours: pull uncapped
            return True
        raise error
