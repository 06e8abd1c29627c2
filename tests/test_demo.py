"""`make demo`'s entry point end to end, in a process of its own as a user runs it: it reads and
acks every message, prints its summary and no error, and every process it started (nats-server,
Spark's JVM, Python workers, the streaming source runner) is gone once it exits."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spark_helpers import wait_until

pytestmark = pytest.mark.spark

MESSAGES = 300
ERROR_LINE = re.compile(r"error|traceback|exception", re.IGNORECASE)
# What stopping the server under a running query prints (the connector's clients, Python errors).
SERVER_GONE = re.compile(
    r"NATS error|no server answered|unexpected EOF|Traceback|nats_spark\.errors"
)


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), which tells it from a later process
    given the same pid; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


def _descendants(pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of every live process below `pid`."""
    found: set[tuple[int, str]] = set()
    parents = [pid]
    while parents:
        parent = parents.pop()
        try:  # listing a process's threads fails once it has ended
            threads = list(Path(f"/proc/{parent}/task").glob("*/children"))
        except OSError:
            continue
        for children in threads:
            try:
                pids = [int(child) for child in children.read_text().split()]
            except OSError:  # the thread or process ended meanwhile
                continue
            for child in pids:
                started = _start_time(child)
                if started is not None:
                    found.add((child, started))
                    parents.append(child)
    return found


def _survivors(started: set[tuple[int, str]]) -> list[str]:
    """Command lines of the processes in `started` that still run."""
    alive = []
    for pid, start in started:
        if _start_time(pid) == start:
            try:
                with_args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:  # it ended meanwhile
                continue
            alive.append(f"{pid}: {with_args.decode(errors='replace')[:200]}")
    return alive


def _run_demo(output: Path, *args: str, interrupt_after: float | None = None) -> tuple[int, str]:
    """Run the demo with `args` (or press Ctrl-C `interrupt_after` seconds after its first lag
    line with rows: SIGINT to its process group, as a terminal does); its exit code and output,
    once it and every process it started are gone."""
    command = [sys.executable, "-m", "nats_spark.demo", "--messages", str(MESSAGES), *args]
    with output.open("w") as sink:
        demo = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=output.parent,
            start_new_session=True,
        )
    started: set[tuple[int, str]] = set()
    deadline = time.monotonic() + 240
    interrupt_at: float | None = None
    try:
        while demo.poll() is None and time.monotonic() < deadline:
            started |= _descendants(demo.pid)
            if interrupt_after is not None and interrupt_at is None and _reading(output):
                interrupt_at = time.monotonic() + interrupt_after
            if interrupt_at is not None and time.monotonic() >= interrupt_at:
                os.killpg(demo.pid, signal.SIGINT)
                interrupt_at = float("inf")
            time.sleep(0.1)
        assert demo.poll() is not None, f"the demo ran over 240 s:\n{_tail(output.read_text())}"
        wait_until(lambda: not _survivors(started), 30, "the demo's processes to end")
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for pid, start in started:  # only what the demo started, if it left it behind
            if _start_time(pid) == start:
                os.kill(pid, signal.SIGKILL)
    return demo.returncode, output.read_text()


def _reading(output: Path) -> bool:
    """Whether a lag line shows rows read (the query runs and has committed a batch)."""
    for line in output.read_text().splitlines():
        fields = line.split()
        if (
            len(fields) == 5
            and fields[0].endswith("s")
            and fields[2].isdigit()
            and fields[2] != "0"
        ):
            return True
    return False


def _tail(output: str) -> str:
    """The end of the output without Java stack frames, for failure messages."""
    lines = [line for line in output.splitlines() if not line.lstrip().startswith("at ")]
    return "\n".join(lines)[-3000:]


def _figure(output: str, label: str) -> int:
    match = re.search(rf"^  {label} +(\d+)", output, re.MULTILINE)
    assert match, f"no {label!r} in the summary:\n{_tail(output)}"
    return int(match.group(1))


def test_demo_reads_and_acks_everything_and_leaves_nothing_behind(tmp_path: Path) -> None:
    code, output = _run_demo(tmp_path / "demo.log", "--seconds", "1", "--timeout", "150")
    assert code == 0, _tail(output)
    assert _figure(output, "messages published") == MESSAGES
    assert _figure(output, "rows read") == MESSAGES
    for label in ("duplicates", "missing", "unacked"):
        assert _figure(output, label) == 0, _tail(output)
    per_partition = [int(n) for n in re.findall(r"^  partition \d \(m\d\) +(\d+)$", output, re.M)]
    assert len(per_partition) == 6 and sum(per_partition) == MESSAGES, _tail(output)
    errors = [line for line in output.splitlines() if ERROR_LINE.search(line)]
    assert not errors, "\n".join(errors)
    # The picture of the run, in the working directory: a PNG of a readable size.
    plot = tmp_path / "nats-pcg-demo.png"
    assert f"lag and input rate over the run: {plot.name}" in output, _tail(output)
    assert plot.read_bytes().startswith(b"\x89PNG") and plot.stat().st_size > 10_000


def test_ctrl_c_stops_the_query_and_spark_before_the_server(tmp_path: Path) -> None:
    code, output = _run_demo(
        tmp_path / "demo.log", "--seconds", "30", "--timeout", "150", interrupt_after=1.0
    )
    assert code == 130, _tail(output)
    assert "interrupted: stopping the query, Spark" in output
    # A batch cut short may be logged by Spark as aborted; nothing may show the server gone.
    errors = [line for line in output.splitlines() if SERVER_GONE.search(line)]
    assert not errors, "\n".join(errors)
