"""The README's quick start as written: its Python blocks, taken from README.md itself, run against
the test server with only the server URL and the stream name replaced, so the README cannot drift
from the code. The script's `getOrCreate()` finds this module's Spark session."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import ACKS_LAST_BATCH, SPARK_VERSION, unacked

from nats_spark.errors import ConfigurationError
from nats_spark.loop import run_sync
from nats_spark.spark.registration import register_formats

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[1] / "README.md"
MESSAGES = 100  # what the quick start publishes


def quick_start_blocks() -> list[str]:
    """The ```python blocks of the README's "Quick start" section, in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def with_values(code: str, **values: str) -> str:
    """`code` with each `NAME = ...` line set to the given value."""
    for name, value in values.items():
        code, found = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", code, flags=re.MULTILINE)
        assert found == 1, f"the quick start has no line `{name} = ...`"
    return code


def run_block(code: str, namespace: dict[str, Any]) -> None:
    exec(compile(code, str(README), "exec"), namespace)


def test_quick_start_runs_as_written(spark, nats_url, client, unique, capsys) -> None:
    script, registration = quick_start_blocks()
    stream = f"QUICK_{unique}"
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        run_block(with_values(script, NATS_URL=nats_url, STREAM=stream), namespace)
        shown = capsys.readouterr().out
        assert namespace["spark"] is spark  # the script's getOrCreate() found the session
        rows = namespace["rows"].select("data", "partition", "member").collect()
        assert sorted(int(row.data.decode().split()[1]) for row in rows) == list(range(MESSAGES))
        assert {row.member for row in rows} == {"m1", "m2", "m3"}
        assert "|partition|member|count|" in shown, shown
        if ACKS_LAST_BATCH:
            assert unacked(client, stream, namespace["GROUP"]) == 0
        run_block(registration, namespace)  # registers again; the workers run this Python
    finally:
        run_sync(client.target.api.delete_stream(stream))


@pytest.mark.skipif(
    SPARK_VERSION < (4, 2), reason="Spark 4.0/4.1 keep a session's first registration of a name"
)
def test_register_formats_names_the_python_of_workers_that_cannot_load_it(spark, tmp_path) -> None:
    # A Python without site-packages (so without nats-spark) and without the working directory
    # on sys.path (so not the checkout), as `python3` from PATH is outside the virtualenv.
    bare = tmp_path / "python-without-nats-spark"
    bare.write_text(f'#!/bin/sh\nPYTHONSAFEPATH=1 exec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    context = spark.sparkContext
    usual = context.pythonExec  # what registrations made from now on run their workers with
    context.pythonExec = str(bare)
    try:
        with pytest.raises(ConfigurationError) as refused:
            register_formats(spark)
    finally:
        context.pythonExec = usual
        register_formats(spark)  # the formats as before, for the rest of the session
    message = str(refused.value)
    assert "\n" not in message
    assert "No module named 'nats_spark'" in message, message
    assert f"they run {bare}" in message and "set PYSPARK_PYTHON" in message, message
    assert sys.executable in message, message
