"""Lag and input rate over a query's run, from its progress, and a picture of them.

From Spark 4.2 on, each batch's progress carries the source's report (`reportLatestOffset`), whose
`lag.total` holds `pending`, `ackPending` and `behindLatest`. Spark 4.0 and 4.1 never ask a Python
source for a report or metrics, and tell batches apart by their offsets' text, so lag cannot ride
in their progress without making batches of its own: there the server's view of the group
(`admin.group_lag`, as `nats-pcg status --json` prints it), sampled while the query runs, stands
in (`ServerLag`). The picture needs matplotlib (the `plot` extra; Databricks and Jupyter have it).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class LagSample:
    """The lag at one moment: messages not delivered yet (`pending`) and delivered, not acked
    (`ack_pending`)."""

    at: datetime
    pending: int
    ack_pending: int


@dataclass(frozen=True)
class BatchPoint:
    """What one batch's progress says: when, rows per second in and processed, and the lag the
    source reported (None on Spark 4.0/4.1)."""

    at: datetime
    input_rate: float
    processed_rate: float
    rows: int
    lag: LagSample | None


def _when(progress: Mapping[str, Any]) -> datetime:
    return datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00"))


def reported_lag(progress: Mapping[str, Any]) -> dict[str, int] | None:
    """`lag.total` of the first source whose report has one (Spark 4.2+), else None."""
    for source in progress.get("sources") or ():
        text = source["latestOffset"]
        try:
            report = json.loads(text) if text else None
        except ValueError:
            continue
        if isinstance(report, dict) and isinstance(report.get("lag"), dict):
            total: dict[str, int] = report["lag"]["total"]
            return total
    return None


def batch_points(progresses: Iterable[Mapping[str, Any]]) -> list[BatchPoint]:
    """A point per batch progress (`query.recentProgress`), in time order."""
    points = []
    for progress in progresses:
        at = _when(progress)
        lag = reported_lag(progress)
        points.append(
            BatchPoint(
                at=at,
                input_rate=float(progress.get("inputRowsPerSecond") or 0.0),
                processed_rate=float(progress.get("processedRowsPerSecond") or 0.0),
                rows=int(progress.get("numInputRows") or 0),
                lag=None
                if lag is None
                else LagSample(at, int(lag.get("pending", 0)), int(lag.get("ackPending", 0))),
            )
        )
    return sorted(points, key=lambda point: point.at)


def server_sample(at: datetime, group_lag: Mapping[str, Any]) -> LagSample:
    """A sample of the group's lag as `admin.group_lag` (or `nats-pcg status --json`) gives it."""
    total = group_lag["total"]
    return LagSample(at, int(total["pending"]), int(total["ackPending"]))


def plot_run(
    points: Sequence[BatchPoint],
    server_lag: Sequence[LagSample] = (),
    title: str = "nats-pcg query",
) -> Figure:
    """Two panels over the run's seconds: rows per second (in, processed) per batch, and the lag
    (pending, ack pending): the server samples given, else what the batches reported."""
    from matplotlib.figure import Figure

    reported = not server_lag
    lag = [point.lag for point in points if point.lag is not None] if reported else server_lag
    times = [point.at for point in points] + [sample.at for sample in lag]
    start = min(times) if times else datetime.now()

    def seconds(at: datetime) -> float:
        return (at - start).total_seconds()

    figure = Figure(figsize=(8, 5.5), layout="constrained")
    rates, lags = figure.subplots(2, 1, sharex=True)
    at = [seconds(point.at) for point in points]
    rates.plot(at, [p.input_rate for p in points], marker="o", label="input rows/s")
    rates.plot(at, [p.processed_rate for p in points], marker="s", label="processed rows/s")
    rates.set_ylabel("rows per second")
    rates.set_title(title)
    rates.legend(loc="upper right")
    rates.grid(alpha=0.3)
    lag_at = [seconds(sample.at) for sample in lag]
    dots = {"marker": "o", "markersize": 3}
    lags.plot(lag_at, [s.pending for s in lag], **dots, label="pending (not delivered)")
    lags.plot(lag_at, [s.ack_pending for s in lag], **dots, label="ack pending (not acked)")
    where = "reported by the batches" if reported else "on the server"
    lags.set_ylabel(f"lag, messages\n({where})")
    lags.set_xlabel("seconds since the start")
    lags.legend(loc="upper right")
    lags.grid(alpha=0.3)
    for panel in (rates, lags):
        panel.set_ylim(bottom=0)
    return figure


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes (for IPython's `Image`, or a file)."""
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=100)
    return out.getvalue()
