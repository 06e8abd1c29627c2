"""The ready job nats_spark/job.py: under spark-submit, as `python -m` with conf/job.properties,
and its one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from spark_helpers import (
    JOB_FILE,
    REPO,
    Launched,
    assert_exactly_once,
    committed_rows,
    job_flags,
    launch,
    publish,
    row_payloads,
    settled,
    spark_bin,
    spark_env,
    static_group,
    wait_until,
)

import nats_spark.job
from nats_spark.client import open_blocking
from nats_spark.connection import ConnectionSettings
from nats_spark.loop import run_sync
from nats_spark.pcg import admin
from nats_spark.pcg.config import StaticConfig
from nats_spark.server import find_server_binary

pytestmark = pytest.mark.spark

CONF = REPO / "conf"


JOB_SECONDS = 240  # the module's fixture starts four jobs at once: four JVMs on two cores


@dataclass
class Runs:
    submit: Launched
    config: Launched
    failing: Launched
    sink: Launched
    streams: dict[str, str]
    dirs: dict[str, Path]


@pytest.fixture(scope="module")
def runs(settings: ConnectionSettings, nats_url: str, tmp_path_factory) -> Iterator[Runs]:
    """The four Spark runs of this module, started together: JVM start-up dominates each."""
    tmp = tmp_path_factory.mktemp("job")
    unique = os.urandom(4).hex()
    client = open_blocking(settings)
    streams = {
        "submit": f"JS{unique}",
        "config": f"JC{unique}",
        "sink_in": f"JN{unique}",
        "sink_out": f"JO{unique}",
    }
    static_group(client, streams["submit"], "g", ["m1", "m2"], partitions=4)
    publish(client, streams["submit"], 400)
    static_group(client, streams["sink_in"], "g", ["m1", "m2"], partitions=4)
    publish(client, streams["sink_in"], 200)
    out = streams["sink_out"]
    run_sync(client.api.create_stream({"name": out, "subjects": [f"{out}.>"]}))
    # The group of conf/group-example.json (members mapped to partitions 0-1 and 2-3).
    example = StaticConfig.from_json((CONF / "group-example.json").read_bytes())
    run_sync(
        client.api.create_stream(
            {
                "name": streams["config"],
                "subjects": [f"{streams['config']}.*"],
                "subject_transform": {
                    "src": f"{streams['config']}.*",
                    "dest": f"{{{{partition({example.max_members},1)}}}}."
                    f"{streams['config']}.{{{{wildcard(1)}}}}",
                },
            }
        )
    )
    run_sync(
        admin.create_static(
            client.target,
            streams["config"],
            "orders",  # the group named in conf/job.properties
            example.max_members,
            member_mappings=example.member_mappings,
        )
    )
    publish(client, streams["config"], 300)
    dirs = {name: tmp / name for name in ("submit", "config", "failing", "sink")}
    env = spark_env()
    submit = launch(
        "submit",
        [
            spark_bin("spark-submit"),
            "--master",
            "local[2]",
            "--properties-file",
            str(CONF / "spark-defaults.conf"),
            "--conf",
            "spark.ui.enabled=false",
            JOB_FILE,
            "--group",
            "g",
            *job_flags(nats_url, streams["submit"], dirs["submit"]),
        ],
        tmp / "logs",
        env,
    )
    config = launch(
        "config",
        [
            sys.executable,
            "-m",
            "nats_spark.job",
            "--config",
            str(CONF / "job.properties"),
            "--master",
            "local[2]",
            *job_flags(nats_url, streams["config"], dirs["config"]),
        ],
        tmp / "logs",
        env,
    )
    failing = launch(
        "failing",
        [
            spark_bin("spark-submit"),
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            JOB_FILE,
            "--group",
            "missing",
            *job_flags(nats_url, streams["submit"], dirs["failing"]),
        ],
        tmp / "logs",
        env,
    )
    sink = launch(
        "sink",
        [
            sys.executable,
            "-m",
            "nats_spark.job",
            "--group",
            "g",
            "--master",
            "local[2]",
            *job_flags(nats_url, streams["sink_in"], dirs["sink"]),
            "--format",
            "nats",
            "--sink-prefix",
            out,
            "--sink-stream",
            out,
        ],
        tmp / "logs",
        env,
    )
    yield Runs(submit, config, failing, sink, streams, dirs)
    for run in (submit, config, failing, sink):
        run.stop()
    for stream in streams.values():
        run_sync(client.api.delete_stream(stream))
    run_sync(client.target.close())


def test_spark_submit_available_now_exactly_once(runs: Runs, client) -> None:
    code, out, _ = runs.submit.wait(JOB_SECONDS)
    assert code == 0, runs.submit.tail()
    assert "batch 0: 400 rows" in out
    rows = committed_rows(runs.dirs["submit"] / "data")
    assert_exactly_once(row_payloads(rows), 400)
    assert {row["member"] for row in rows} == {"m1", "m2"}
    assert settled(client, runs.streams["submit"], "g")


@pytest.mark.parametrize("run", ["submit", "config"])
def test_a_normal_run_shows_the_jobs_lines_not_sparks_info(runs: Runs, run: str) -> None:
    """By default the job's own lines (its options, a line per batch) are what it prints:
    Spark's log starts at WARN (its INFO is hundreds of lines a start), and registering the
    formats warns of nothing."""
    launched = getattr(runs, run)
    code, out, err = launched.wait(JOB_SECONDS)
    assert code == 0, launched.tail()
    lines = (out + err).splitlines()
    # Under spark-submit the Spark context logs its version, OS and Java at INFO before it reads
    # spark.log.level (which spark-submit's JVM knows only from there on): those three stay.
    first = r"SparkContext: (Running Spark version|OS info|Java version) "
    spark_info = [
        line
        for line in lines
        if re.search(r"^\S+ \S+ INFO (?!nats_spark)", line) and not re.search(first, line)
    ]
    assert spark_info == [], spark_info[:5]
    assert not [line for line in lines if "replaced a statically registered" in line]
    assert any(re.search(r"nats_spark.job: starting query on", line) for line in lines), lines
    assert any(line.startswith("batch 0: ") for line in lines), lines


def test_python_module_with_config_file_and_example_group(runs: Runs, client) -> None:
    code, _, err = runs.config.wait(JOB_SECONDS)
    assert code == 0, runs.config.tail()
    rows = committed_rows(runs.dirs["config"] / "data")
    assert_exactly_once(row_payloads(rows), 300)
    owned: dict[str, set[int]] = {}
    for row in rows:
        owned.setdefault(row["member"], set()).add(row["partition"])
    assert owned == {"spark-a": {0, 1}, "spark-b": {2, 3}}  # conf/group-example.json's mapping
    assert settled(client, runs.streams["config"], "orders")
    # Options of the file reached the source: the job logs them (the file's ackWait, not 30s).
    assert "'ackWait': '60s'" in err and "'group': 'orders'" in err


def test_group_to_another_stream(runs: Runs, client) -> None:
    code, out, _ = runs.sink.wait(JOB_SECONDS)
    assert code == 0, runs.sink.tail()
    target, source = runs.streams["sink_out"], runs.streams["sink_in"]
    count = run_sync(client.api.stream_info(target))["state"]["messages"]
    stored = [run_sync(client.api.get_message(target, seq)) for seq in range(1, count + 1)]
    assert_exactly_once([int(m.data.decode()) for m in stored], 200)
    assert all(m.subject.startswith(f"{target}.{source}.k") for m in stored)
    assert settled(client, source, "g")


def test_failing_query_ends_with_one_line_and_code_1(runs: Runs) -> None:
    code, out, err = runs.failing.wait(JOB_SECONDS)
    assert code == 1
    # spark-submit merges the Python driver's stderr into its stdout.
    ours = [line for line in (out + err).splitlines() if line.startswith("nats_spark.job:")]
    assert len(ours) == 1, ours
    assert "query failed: consumer group 'missing'" in ours[0] and "create it first" in ours[0]
    assert 'nats_spark/job.py", line' not in out + err  # no traceback through the job itself


COMPLETE = ["--stream", "S", "--group", "g", "--output", "o", "--checkpoint", "c"]


def test_workers_without_the_package_fail_in_one_line_naming_their_python(
    tmp_path: Path, client, nats_url: str, unique: str
) -> None:
    """PYSPARK_PYTHON names a fresh virtualenv without nats-spark (as `python3` from PATH is
    outside the job's): the job says so in one line naming that interpreter and what to set,
    not with the workers' traceback (Spark brings its own pyspark to them).
    PYSPARK_DRIVER_PYTHON is left unset, as by a user: Spark looks formats up with it before
    PYSPARK_PYTHON (and runs those it found there), which would hide the workers' Python."""
    stream = f"BARE{unique}"
    static_group(client, stream, "g", ["m1"], partitions=1)
    publish(client, stream, 5)
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True
    )
    bare = tmp_path / "bare" / "bin" / "python"
    without_driver_python = {k: v for k, v in spark_env().items() if k != "PYSPARK_DRIVER_PYTHON"}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "nats_spark.job", "--servers", nats_url, "--stream", stream),
            *("--group", "g", "--output", "o", "--checkpoint", "c", "--trigger", "availableNow"),
        ],
        capture_output=True,
        text=True,
        env={**without_driver_python, "PYSPARK_PYTHON": str(bare)},
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 1, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("nats_spark.job:")]
    assert len(ours) == 1, done.stderr
    assert "query failed: Spark's Python workers cannot load nats-spark" in ours[0], ours
    assert f"they run {bare}; set PYSPARK_PYTHON" in ours[0] and sys.executable in ours[0], ours
    assert "Traceback" not in done.stderr and "\tat " not in done.stderr, done.stderr


def test_a_missing_sink_stream_fails_before_spark_starts(
    tmp_path: Path, client, nats_url: str, unique: str
) -> None:
    """Spark asks a streaming sink nothing before its first micro-batch, which waits for input
    (none here): the job checks the sink's servers and stream itself, before Spark starts."""
    stream = f"SI{unique}"
    static_group(client, stream, "g", ["m1"], partitions=1)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "nats_spark.job", "--servers", nats_url, "--stream", stream),
            *("--group", "g", "--format", "nats", "--sink-prefix", "copy"),
            *("--sink-stream", f"NO{unique}", "--checkpoint", "cp", "--timeout", "30"),
        ],
        capture_output=True,
        text=True,
        env=spark_env(),
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"nats_spark.job: error: stream 'NO{unique}' does not exist on {nats_url}; create it or "
        "fix the stream option"
    ], done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (COMPLETE[:6], "--checkpoint is required"),
        (["--group", "g", "--consumer", "c"], "not allowed with argument"),
        (["--timeout", "soon"], "invalid float value: 'soon'"),
        (["--output", "o", "--checkpoint", "c", "--stream", "S"], "set exactly one of"),
        ([*COMPLETE, "--trigger", "x"], "option trigger='x' is not a duration"),
        ([*COMPLETE, "--option", "ackWait"], "--option 'ackWait' is not NAME=VALUE"),
        ([*COMPLETE, "--option", "x=1"], "unknown option 'x'"),
        (["--config", "/nonexistent/job.properties"], "cannot read config file"),
        ([*COMPLETE, "--format", "nats"], "--sink-prefix is required"),
    ],
)
def test_bad_flags_exit_1_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    env = {**spark_env(), "NATS_URL": "nats://127.0.0.1:1"}  # never reached: flags fail first
    done = subprocess.run(
        [sys.executable, "-m", "nats_spark.job", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nats_spark.job: error: "), done.stderr
    assert message in lines[0]
    assert done.stdout == ""


def test_unknown_key_in_config_file(tmp_path: Path) -> None:
    config = tmp_path / "job.properties"
    config.write_text((CONF / "job.properties").read_text() + "\nchekpoint = /tmp/x\n")
    done = subprocess.run(
        [sys.executable, "-m", "nats_spark.job", "--config", str(config)],
        capture_output=True,
        text=True,
        env=spark_env(),
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"nats_spark.job: error: unknown key 'chekpoint' in {config}; use one of servers, stream, "
        "group, consumer, output, checkpoint, format, sink-prefix, sink-stream, trigger, timeout, "
        "master, app-name or option.<name>"
    )


def test_dev_server_config_starts_jetstream_on_loopback(tmp_path: Path) -> None:
    """conf/nats-server.conf as documented (`nats-server -c`), with only the port made free."""
    binary = find_server_binary()
    process = subprocess.Popen(
        [binary, "-c", str(CONF / "nats-server.conf"), "-p", "-1", "--ports_file_dir", "."],
        cwd=tmp_path,  # the store directory in the file is relative
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ports = wait_until(lambda: list(tmp_path.glob("*.ports")), 20, "the ports file")
        url = wait_until(lambda: json.loads(ports[0].read_text() or "{}").get("nats"), 20, "port")
        assert url[0].startswith("nats://127.0.0.1:")

        async def max_payload() -> int:
            nc = await nats.connect(url[0])
            try:
                await nc.jetstream().account_info()  # fails unless JetStream is on
                return nc.max_payload
            finally:
                await nc.close()

        assert run_sync(max_payload()) == 8 * 1024 * 1024
        assert (tmp_path / "data" / "jetstream").is_dir()
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.unit
def test_config_values_may_hold_hash_signs(tmp_path: Path) -> None:
    config = tmp_path / "job.properties"
    config.write_text("# a comment\n  # another\noption.password = pa#ss word\n")
    assert nats_spark.job.read_config(str(config)) == {"option.password": "pa#ss word"}
