"""The monotonic clock the ack protocol reads (ack waits, keepers, settling).

One indirection, so that the deterministic simulation (tests/simulation) can run the real
driver and task code on its virtual time: it points `monotonic` at its event loop's clock.
Everywhere else it is `time.monotonic`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

_source: Callable[[], float] = time.monotonic


def monotonic() -> float:
    return _source()


def use(source: Callable[[], float]) -> Callable[[], float]:
    """Read time from `source` from now on; returns the source it replaces."""
    global _source
    previous, _source = _source, source
    return previous
