"""Trigger pacing (`minMessagesPerTrigger`, `maxTriggerDelay`), as Spark's Kafka source has it.

A micro-batch is held back while fewer messages than the minimum are available, until the delay
since the previous batch (or the query's start) has passed; then whatever is available goes.
Decided by the source itself in `latestOffset` (returning the start again means "no batch"), so
it works alike whether or not Spark passes a read limit. `Trigger.AvailableNow` ignores it, as
Kafka's does: that run must end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class TriggerPacing:
    def __init__(
        self,
        min_messages: int | None,
        max_delay: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_messages = min_messages
        self.max_delay = max_delay
        self.clock = clock
        self.last_batch = clock()

    def holds_back(self, available: int) -> bool:
        """Whether a batch of `available` messages waits for more."""
        if not self.min_messages or available <= 0 or available >= self.min_messages:
            return False
        waited = self.clock() - self.last_batch
        if waited >= self.max_delay:
            return False
        log.debug(
            "holding the batch back: %d of minMessagesPerTrigger=%d available, %.1fs of "
            "maxTriggerDelay=%.0fs waited",
            available,
            self.min_messages,
            waited,
            self.max_delay,
        )
        return True

    def batch_planned(self) -> None:
        self.last_batch = self.clock()
