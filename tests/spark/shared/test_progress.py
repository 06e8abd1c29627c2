"""Lag and input rate from a query's progress, and their picture (no server, no Spark: progress
as Spark 4.3 and 4.0 write it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from nats_spark.spark.progress import (
    LagSample,
    batch_points,
    plot_run,
    png,
    reported_lag,
    server_sample,
)

pytestmark = pytest.mark.unit

OFFSET = json.dumps({"v": 2, "lineage": "x", "gen": 3, "members": {}})


def progress(second: int, rows: int, lag: dict[str, int] | None) -> dict:
    """A batch's progress: with the source's report (Spark 4.2+) when `lag` is given, else with
    what 4.0/4.1 show (the offset as latestOffset)."""
    report = OFFSET if lag is None else json.dumps({"target": "S/g", "lag": {"total": lag}})
    return {
        "batchId": second,
        "timestamp": f"2026-11-28T10:00:{second:02d}.000Z",
        "numInputRows": rows,
        "inputRowsPerSecond": rows / 2,
        "processedRowsPerSecond": rows * 2.0,
        "sources": [{"startOffset": OFFSET, "endOffset": OFFSET, "latestOffset": report}],
    }


def test_lag_comes_from_the_report_of_spark_4_2_on() -> None:
    lag = {"pending": 5, "ackPending": 7, "behindLatest": 5}
    assert reported_lag(progress(1, 10, lag)) == lag
    assert reported_lag(progress(1, 10, None)) is None  # 4.0/4.1: the offset, no report
    assert reported_lag({"timestamp": "2026-11-28T10:00:00Z", "sources": []}) is None


def test_batch_points_in_time_order() -> None:
    points = batch_points([progress(4, 30, None), progress(2, 10, {"pending": 1, "ackPending": 2})])
    assert [point.rows for point in points] == [10, 30]
    assert points[0].input_rate == 5.0 and points[0].processed_rate == 20.0
    assert points[0].lag == LagSample(points[0].at, 1, 2) and points[1].lag is None
    assert points[0].at == datetime(2026, 11, 28, 10, 0, 2, tzinfo=UTC)


def test_server_sample_reads_the_group_lag() -> None:
    at = datetime.now(UTC)
    group_lag = {"total": {"pending": 3, "ackPending": 4}, "byMember": {}}
    assert server_sample(at, group_lag) == LagSample(at, 3, 4)


@pytest.mark.parametrize("reported", [True, False])
def test_the_picture_is_a_png_of_both_panels(reported: bool) -> None:
    lags = [{"pending": 100 - 10 * s, "ackPending": 10} for s in range(6)]
    points = batch_points(progress(s, 10 * s, lags[s] if reported else None) for s in range(6))
    samples = (
        [] if reported else [server_sample(p.at, {"total": lags[i]}) for i, p in enumerate(points)]
    )
    figure = plot_run(points, samples, title="t")
    rates, lag = figure.axes
    assert [len(line.get_xdata()) for line in rates.lines] == [6, 6]
    assert [list(line.get_ydata()) for line in lag.lines] == [
        [100 - 10 * s for s in range(6)],
        [10] * 6,
    ]
    assert ("reported by the batches" if reported else "on the server") in lag.get_ylabel()
    assert png(figure).startswith(b"\x89PNG")


@pytest.mark.compat
def test_only_spark_4_2_on_asks_a_python_source_for_its_report() -> None:
    """docs/architecture.md's reason there is no lag in progress on Spark 4.0/4.1: their
    Python stream runner answers initialOffset, latestOffset, partitions and commit only."""
    from pyspark.sql.streaming import python_streaming_source_runner as runner
    from spark_helpers import REPORTS_LAG

    calls = {name for name in vars(runner) if name.endswith("_FUNC_ID")}
    assert ("REPORT_LATEST_OFFSET_FUNC_ID" in calls) == REPORTS_LAG, calls
    if not REPORTS_LAG:
        assert calls == {
            "INITIAL_OFFSET_FUNC_ID",
            "LATEST_OFFSET_FUNC_ID",
            "PARTITIONS_FUNC_ID",
            "COMMIT_FUNC_ID",
        }, calls
