"""The streaming source's driver process, stopped by SIGTERM.

When a query stops or fails, Spark ends the Python process that runs a Python source's driver
side (its streaming source runner) with SIGTERM, more than once, without calling the reader's
`stop` first; with Python's default for SIGTERM the process ended at once and `stop` never ran.
A handler that raises in the main thread, where the runner waits for Spark's next call, lets the
runner's own clean-up call `stop`; later SIGTERMs are ignored while it runs, and an alarm bounds
it.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

STOP_GRACE = 60  # seconds the clean-up may take once SIGTERM came; then SIGALRM ends the process


def stop_on_sigterm(grace: int = STOP_GRACE) -> None:
    """From now on, SIGTERM raises `SystemExit` in the main thread, once. Only from the main
    thread, and only where SIGTERM has no handler of someone else's (or ours already)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.alarm(grace)  # SIGALRM's default ends the process: a clean-up that hangs
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
