"""SIGTERM in the source's driver process runs the clean-up around the main thread (stop_signal),
in a process of its own."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

SCRIPT = """
import signal, sys, threading
from nats_spark.spark.shared.stop_signal import stop_on_sigterm
how = sys.argv[1]
if how == "taken":
    signal.signal(signal.SIGTERM, lambda *_: print("theirs", flush=True))
if how == "thread":
    threading.Thread(target=stop_on_sigterm).start()
else:
    stop_on_sigterm(grace=1 if how == "hangs" else 60)
try:
    print("ready", flush=True)
    sys.stdin.readline()  # blocked, as the runner waits for Spark's next call
finally:
    print("cleaning up", flush=True)
    if how == "hangs":
        signal.pause()
    sys.stdin.readline()  # the clean-up's work, while more SIGTERMs come
    print("cleaned up", flush=True)
"""


def script(how: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    return process


def ended(process: subprocess.Popen[str], stdin: str = "") -> tuple[int, str]:
    try:
        out, _ = process.communicate(stdin, timeout=30)
    finally:
        process.kill()
    return process.returncode, out


def test_sigterm_runs_the_clean_up_and_ignores_more_sigterms_meanwhile() -> None:
    process = script("main")
    assert process.stdout is not None and process.stdout.readline() == "cleaning up\n"
    process.send_signal(signal.SIGTERM)  # Spark sends more than one
    assert ended(process, "done\n") == (128 + signal.SIGTERM, "cleaned up\n")


def test_a_clean_up_that_hangs_is_ended_after_the_grace() -> None:
    assert ended(script("hangs")) == (-signal.SIGALRM, "cleaning up\n")


def test_a_handler_already_there_is_kept() -> None:
    code, out = ended(script("taken"), "\n\n")  # theirs prints; the reads then end normally
    assert (code, out) == (0, "theirs\ncleaning up\ncleaned up\n")


def test_off_the_main_thread_nothing_changes() -> None:
    assert ended(script("thread")) == (-signal.SIGTERM, "")  # Python's default: no clean-up
