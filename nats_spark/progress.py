"""A progress bar for long operations on a terminal (bulk publish, consume --count)."""

from __future__ import annotations

import sys


def progress_bar(done: int, total: int, label: str, width: int = 30) -> None:
    """Redraw one line on a terminal's stderr; off a terminal (logs, pipes) draw nothing."""
    if not sys.stderr.isatty():
        return
    filled = width * min(done, total) // max(total, 1)
    end = "\n" if done >= total else ""
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}{end}")
    sys.stderr.flush()
