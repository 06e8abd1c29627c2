"""A ready streaming job: read a group (or consumer) with nats-pcg into files, or into another
stream (`--format nats`), checkpointed.

    spark-submit nats_spark/job.py --servers nats://host:4222 --stream ORDERS --group g \\
        --output /data/orders --checkpoint /data/orders-cp
    spark-submit nats_spark/job.py --servers nats://host:4222 --stream ORDERS --group g \\
        --format nats --sink-prefix copy --sink-stream COPY --checkpoint /data/copy-cp
    python -m nats_spark.job --config conf/job.properties

Flags override the config file, whose lines are `key = value` with the flag names as keys and
`option.<name>` for source options.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from nats_spark.errors import ConfigurationError, NatsSparkError
from nats_spark.spark.failure_lines import failure_line
from nats_spark.spark.group_source.options import parse_options
from nats_spark.spark.shared.options import CONNECTION_OPTIONS, SECRET_OPTIONS, parse_duration

log = logging.getLogger("nats_spark.job")

_FLAGS = (
    "servers",
    "stream",
    "group",
    "consumer",
    "output",
    "checkpoint",
    "format",
    "sink-prefix",
    "sink-stream",
    "trigger",
    "timeout",
    "master",
    "app-name",
)


def read_config(path: str) -> dict[str, str]:
    """`key = value` lines; lines starting with `#` are comments (a value may hold `#`)."""
    values: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigurationError(f"cannot read config file {path}: {error.strerror}") from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigurationError(f"{path}:{number}: expected 'key = value', got {line!r}")
        values[key.strip()] = value.strip()
    return values


class _Parser(argparse.ArgumentParser):
    """Bad flags become a ConfigurationError: one line on stderr and exit code 1, not usage + 2."""

    def error(self, message: str) -> NoReturn:
        raise ConfigurationError(f"{message}; see --help")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="nats_spark.job",
        description="Stream a NATS partitioned consumer group (or priority-group consumer) into "
        "files with Spark, exactly once per committed batch.",
    )
    p.add_argument("--config", help="file of 'key = value' lines (flag names, option.<name>)")
    p.add_argument("--servers", help="NATS URLs, comma separated (default $NATS_URL)")
    p.add_argument("--stream")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--group", help="partitioned consumer group")
    target.add_argument("--consumer", help="plain priority-group pull consumer")
    p.add_argument("--output", help="output directory")
    p.add_argument("--checkpoint", help="checkpoint directory")
    p.add_argument(
        "--format", help="file format of the output (default parquet), or nats: another stream"
    )
    p.add_argument(
        "--sink-prefix", help="with --format nats: publish each message to <prefix>.<subject>"
    )
    p.add_argument("--sink-stream", help="with --format nats: the stream that must store them")
    p.add_argument("--trigger", help="processing-time interval such as 5s, or availableNow/once")
    p.add_argument("--timeout", type=float, help="stop after this many seconds (default: run on)")
    p.add_argument("--master", help="Spark master when not set by spark-submit (default local[2])")
    p.add_argument("--app-name", help="Spark application name")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="source option, repeatable (e.g. ackWait=30s)",
    )
    return p


def settings(argv: Sequence[str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """(job settings, source options) from the config file and the flags."""
    args = parser().parse_args(argv)
    job: dict[str, str] = {}
    options: dict[str, str] = {}
    if args.config:
        for key, value in read_config(args.config).items():
            if key.startswith("option."):
                options[key[len("option.") :]] = value
            elif key in _FLAGS:
                job[key] = value
            else:
                raise ConfigurationError(
                    f"unknown key {key!r} in {args.config}; use one of {', '.join(_FLAGS)} "
                    "or option.<name>"
                )
    for key in _FLAGS:
        value = getattr(args, key.replace("-", "_"))
        if value is not None:
            job[key] = str(value)
    for item in args.option:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigurationError(f"--option {item!r} is not NAME=VALUE")
        options[name.strip()] = value.strip()
    job.setdefault("servers", os.environ.get("NATS_URL", ""))
    for key in ("servers", "stream", "group", "consumer"):
        if job.get(key):
            options[key] = job[key]
    required = ("checkpoint", "sink-prefix") if job.get("format") == "nats" else ("output",)
    for key in ("checkpoint", *required):
        if not job.get(key):
            raise ConfigurationError(f"--{key} is required (or '{key} = ...' in the config file)")
    parse_options(options)  # fail on bad options before Spark starts
    trigger = job.get("trigger", "1s")
    if trigger not in ("availableNow", "once"):
        parse_duration("trigger", trigger)
    return job, options


def sink_options(job: dict[str, str], options: dict[str, str]) -> dict[str, str]:
    """The `nats` sink's options (`--format nats`): the source's servers and credentials, and
    `--sink-stream`."""
    sink = {key: value for key, value in options.items() if key in CONNECTION_OPTIONS}
    if job.get("sink-stream"):
        sink["stream"] = job["sink-stream"]
    return sink


def start_query(spark: Any, job: dict[str, str], options: dict[str, str]) -> Any:
    from pyspark.sql.functions import col, concat, lit

    from nats_spark.spark.group_source.source import NatsPcgDataSource
    from nats_spark.spark.nats_format import NatsDataSource
    from nats_spark.spark.registration import ensure_registered

    # Spark registers `pyspark_*` modules by itself only where pkgutil can see them (not through
    # a plain editable install's import hook).
    ensure_registered(spark, NatsPcgDataSource)
    reader = spark.readStream.format(NatsPcgDataSource.name())
    for key, value in options.items():
        reader = reader.option(key, value)
    rows = reader.load()
    if job.get("format") == "nats":
        ensure_registered(spark, NatsDataSource)
        subject = concat(lit(job["sink-prefix"] + "."), col("subject")).alias("subject")
        writer = rows.select(subject, "data", "headers").writeStream.format(NatsDataSource.name())
        for key, value in sink_options(job, options).items():
            writer = writer.option(key, value)
    else:
        writer = rows.writeStream.format(job.get("format", "parquet")).option("path", job["output"])
    writer = writer.option("checkpointLocation", job["checkpoint"]).queryName(
        job.get("app-name", "nats-spark-job").replace("-", "_")
    )
    trigger = job.get("trigger", "1s")
    if trigger == "availableNow":
        writer = writer.trigger(availableNow=True)
    elif trigger == "once":
        writer = writer.trigger(once=True)
    else:
        millis = round(parse_duration("trigger", trigger) * 1000)
        writer = writer.trigger(processingTime=f"{millis} milliseconds")
    return writer.start()


def log_level_given() -> bool:
    """Whether spark-submit's `--conf` or spark-defaults.conf set `spark.log.level` (the conf of
    the launcher's JVM, which this starts or, under spark-submit, joins)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return SparkConf().contains("spark.log.level")


def launcher_sets_master() -> bool:
    """Whether spark-submit or PYSPARK_SUBMIT_ARGS already chose the master (then keep it)."""
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    # spark-submit starts this interpreter itself and hands it the gateway port of its JVM,
    # whose conf holds the --master it was given.
    return "PYSPARK_GATEWAY_PORT" in os.environ or any(
        flag in submit_args for flag in ("--master", "spark.master")
    )


def report_batches(query: Any, last_batch: int) -> int:
    """Print a line for each batch after `last_batch` that made progress; returns the last one.
    Every recent one, not just the last: a second (e.g. acks-only) batch may follow within the
    polling interval."""
    for progress in query.recentProgress:
        if progress["batchId"] > last_batch:
            last_batch = progress["batchId"]
            print(f"batch {last_batch}: {progress['numInputRows']} rows", flush=True)
    return last_batch


def main(argv: Sequence[str] | None = None) -> int:
    # INFO for the job's own lines only: py4j's INFO chatter would bury them.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    try:
        job, options = settings(argv)
        if job.get("format") == "nats":
            from nats_spark.spark.sink.writers import check_sink

            check_sink(sink_options(job, options))  # Spark would check it at the first batch
    except NatsSparkError as bad:
        print(f"nats_spark.job: error: {bad}", file=sys.stderr)
        return 1
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(job.get("app-name", "nats-spark-job"))
    if job.get("master") or not launcher_sets_master():
        builder = builder.master(job.get("master", "local[2]"))
    if not log_level_given():  # under spark-submit Spark's INFO would bury the job's own lines
        builder = builder.config("spark.log.level", "WARN")
    spark = builder.getOrCreate()
    shown = {k: ("***" if k.lower() in SECRET_OPTIONS else v) for k, v in options.items()}
    shown["servers"] = parse_options(options).connection.described()  # URLs may hold passwords
    log.info("starting query on %s with options %s", options.get("stream"), shown)
    try:
        query = start_query(spark, job, options)
    except Exception as refused:  # load() checks the servers, stream and group: it fails there
        print(f"nats_spark.job: query failed: {failure_line(refused, spark)}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + float(job["timeout"]) if job.get("timeout") else None
    last_batch = -1
    error: Exception | None = None
    try:
        while query.isActive and (deadline is None or time.monotonic() < deadline):
            query.awaitTermination(1)  # raises StreamingQueryException when the query fails
            last_batch = report_batches(query, last_batch)
    except StreamingQueryException as raised:
        error = raised
    finally:
        if query.isActive:
            query.stop()
        report_batches(query, last_batch)
    error = error or query.exception()  # it may have failed between two waits
    if error is not None:
        print(f"nats_spark.job: query failed: {failure_line(error, spark)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
