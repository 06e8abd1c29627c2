"""Which of a batch read's Spark filters NATS can apply itself (filter pushdown, pyspark 4.1+).

Spark hands `pushFilters` the simple filters of a query, to be ANDed. Those on three columns
narrow what a read asks NATS for; everything else stays with Spark:

- `subject` =, IN and STARTSWITH become the read consumer's filter subjects, intersected with the
  `subjects` option. A filter counts as pushed only when the filter subjects match exactly the
  subjects it accepts: literal subjects, and a prefix ending in a dot (`orders.` is `orders.>`).
  Other prefixes (`orders.a` -> `orders.>`) and IN lists longer than `MAX_IN_SUBJECTS` (one
  pattern covering all values) narrow the read and stay with Spark as well. Values with a
  `*`/`>` token, whitespace or empty tokens are left to Spark alone.
- `stream_seq` comparisons and = bound the sequence range exactly; IN narrows it to its smallest
  and largest value and stays with Spark.
- `timestamp` comparisons and = bound the range by the first message stored at a time (as
  `startingPosition=time:` does) and stay with Spark.

Filters are told apart by class name: pyspark 4.0 has no `Filter` classes (and never calls
`pushFilters`), so nothing here imports them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from nats_spark.jetstream.subject_names import valid_publish_subject

# A consumer with several filter subjects costs nats-server work per delivered message that
# grows with the matching subjects in each block: bench/pushdown.py measured 12.5 us per message
# with 64 (1.9 unfiltered), which made a read of 64% of a stream 3x slower than reading it all.
# With 8, its worst case (every message matching) measured 0.9 us more per message, still faster
# than a full read. Longer IN lists push one covering pattern instead and stay with Spark.
MAX_IN_SUBJECTS = 8
_PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"
_MICROSECOND = timedelta(microseconds=1)
Bound = TypeVar("Bound", int, datetime)


@dataclass(frozen=True)
class PushedFilters:
    """What a read asks NATS for beyond its options. Picklable (it travels with the reader)."""

    subjects: tuple[str, ...] | None = None  # filter subjects in place of the option's
    min_seq: int = 1
    max_seq: int | None = None
    start_time: datetime | None = None  # the first message stored at or after this
    stop_time: datetime | None = None  # messages stored before this
    pushed: tuple[str, ...] = field(default=(), compare=False)  # Spark no longer applies these
    narrowing: tuple[str, ...] = field(default=(), compare=False)  # Spark still applies these

    @property
    def matches_nothing(self) -> bool:
        """True when the filters contradict each other or the `subjects` option."""
        times = self.start_time is not None and self.stop_time is not None
        return (
            self.subjects == ()
            or (self.max_seq is not None and self.max_seq < self.min_seq)
            or (times and self.stop_time <= self.start_time)  # type: ignore[operator]
        )

    def describe(self) -> str:
        """One line for the driver's log: what NATS applies, and what Spark still checks."""
        parts = []
        if self.subjects is not None:
            shown = ",".join(self.subjects[:8]) + (",..." if len(self.subjects) > 8 else "")
            parts.append(f"filter subjects [{shown}] ({len(self.subjects)})")
        if self.min_seq > 1 or self.max_seq is not None:
            parts.append(
                f"stream_seq {self.min_seq}..{'' if self.max_seq is None else self.max_seq}"
            )
        if self.start_time is not None:
            parts.append(f"stored from {rfc3339(self.start_time)}")
        if self.stop_time is not None:
            parts.append(f"stored before {rfc3339(self.stop_time)}")
        return (
            f"pushed to NATS: {'; '.join(parts) or 'nothing'}"
            f"{' (matches nothing)' if self.matches_nothing else ''}; "
            f"exact, no longer checked by Spark: {', '.join(self.pushed) or 'none'}; "
            f"narrowing only, Spark checks them too: {', '.join(self.narrowing) or 'none'}"
        )


def spark_pushes_filters() -> bool:
    """Whether the caller runs inside Spark's filter pushdown worker (pyspark 4.1+, with
    `spark.sql.python.filterPushdown.enabled`). Spark's other planning worker refuses any reader
    that implements `pushFilters` while that setting is off (its default), so a reader that
    pushes is made only for the pushdown worker; elsewhere reads simply filter in Spark."""
    frame = sys._getframe(1)
    while frame is not None:
        spec = frame.f_globals.get("__spec__")  # the module's real name also when run as -m
        if getattr(spec, "name", frame.f_globals.get("__name__")) == _PUSHDOWN_WORKER:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def rfc3339(when: datetime) -> str:
    """A time as NATS takes it: UTC, `Z`."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def intersect(a: str, b: str) -> str | None:
    """The filter subject matching exactly what both `a` and `b` match (None: nothing)."""
    x, y = a.split("."), b.split(".")
    tokens: list[str] = []
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p == ">":
            return ".".join(tokens + y[i:])  # `>` takes one or more tokens: y's rest
        if q == ">":
            return ".".join(tokens + x[i:])
        if p != q and "*" not in (p, q):
            return None
        tokens.append(q if p == "*" else p)
    return ".".join(tokens) if len(x) == len(y) else None


def _union(patterns: Iterable[str | None]) -> tuple[str, ...]:
    """Patterns without duplicates or patterns another one covers, sorted."""
    found = {p for p in patterns if p is not None}
    kept = [p for p in found if not any(q != p and intersect(p, q) == p for q in found)]
    return tuple(sorted(kept))


def covering_pattern(subjects: Sequence[str]) -> str | None:
    """One filter subject matching every literal subject given (and more), or None when only
    `>` would: equal tokens stay, differing ones become `*`, differing lengths end in `>`."""
    split = [s.split(".") for s in subjects]
    shortest = min(len(tokens) for tokens in split)
    same_length = all(len(tokens) == shortest for tokens in split)
    width = shortest if same_length else shortest - 1
    columns = zip(*(tokens[:width] for tokens in split), strict=True)
    tokens = [column[0] if len(set(column)) == 1 else "*" for column in columns]
    if not same_length:
        tokens.append(">")
    return ".".join(tokens) if tokens != [">"] else None


def _subject_patterns(kind: str, value: Any) -> tuple[tuple[str, ...], bool] | None:
    """The filter subjects a `subject` filter accepts, and whether they match exactly its rows."""
    if kind in ("EqualTo", "EqualNullSafe") and isinstance(value, str):
        return ((value,), True) if valid_publish_subject(value) else None
    if kind == "In" and all(isinstance(v, str) and valid_publish_subject(v) for v in value):
        if len(value) <= MAX_IN_SUBJECTS:
            return tuple(value), True
        cover = covering_pattern(value)
        return ((cover,), False) if cover else None
    if kind == "StringStartsWith" and isinstance(value, str):
        head, dot, tail = value.rpartition(".")
        if dot and valid_publish_subject(head):
            return (f"{head}.>",), not tail  # `orders.` exactly; `orders.a` within `orders.>`
    return None


def _seq_bounds(kind: str, value: Any) -> tuple[int, int | None, bool] | None:
    """The sequence range `[low, high]` a `stream_seq` filter keeps, and whether exactly."""
    values = value if kind == "In" else (value,)
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    if kind in ("EqualTo", "EqualNullSafe"):
        return value, value, True
    if kind == "GreaterThan":
        return value + 1, None, True
    if kind == "GreaterThanOrEqual":
        return value, None, True
    if kind == "LessThan":
        return 1, value - 1, True
    if kind == "LessThanOrEqual":
        return 1, value, True
    if kind == "In":
        return min(values), max(values), False
    return None


def _time_bounds(kind: str, value: Any) -> tuple[datetime | None, datetime | None] | None:
    """The storage times a `timestamp` filter keeps: [start, stop). Spark keeps microseconds
    of the stored nanoseconds, so `timestamp <= T` is every message stored before T + 1 us."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        return None
    try:
        value = value.astimezone(UTC)
        after = value + _MICROSECOND
    except OverflowError:  # at the ends of Python's time range: Spark filters alone
        return None
    return {
        "EqualTo": (value, after),
        "EqualNullSafe": (value, after),
        "GreaterThan": (after, None),
        "GreaterThanOrEqual": (value, None),
        "LessThan": (None, value),
        "LessThanOrEqual": (None, after),
    }.get(kind)


def _earlier(a: Bound | None, b: Bound | None) -> Bound | None:
    return b if a is None else a if b is None else min(a, b)


def _later(a: Bound | None, b: Bound | None) -> Bound | None:
    return b if a is None else a if b is None else max(a, b)


def _label(spark_filter: Any) -> str:
    """A filter in a few words (an IN list as its size)."""
    kind, value = type(spark_filter).__name__, spark_filter.value
    shown = f"({len(value)} values)" if kind == "In" else repr(value)
    return f"{spark_filter.attribute[0]} {kind} {shown}"


def push_filters(
    filters: Sequence[Any], option_subjects: tuple[str, ...], direct: bool
) -> tuple[PushedFilters, list[Any]]:
    """What NATS can apply of `filters` (ANDed), and the filters Spark must still apply (the
    same objects, as Spark requires). `direct`: batch direct gets, which take one subject."""
    kept: list[Any] = []
    subjects: tuple[str, ...] = option_subjects or (">",)
    subject_filters: list[tuple[Any, bool]] = []
    min_seq, max_seq = 1, None
    start: datetime | None = None
    stop: datetime | None = None
    pushed: list[str] = []
    narrowing: list[str] = []
    for spark_filter in filters:
        kind = type(spark_filter).__name__
        column = getattr(spark_filter, "attribute", None)
        value = getattr(spark_filter, "value", None)
        exact = False
        if column == ("subject",) and (found := _subject_patterns(kind, value)):
            patterns, exact = found
            subjects = _union(intersect(s, p) for s in subjects for p in patterns)
            subject_filters.append((spark_filter, exact))
            continue
        if column == ("stream_seq",) and (bounds := _seq_bounds(kind, value)):
            low, high, exact = bounds
            min_seq = max(min_seq, low)
            max_seq = _earlier(max_seq, high)
        elif column == ("timestamp",) and (times := _time_bounds(kind, value)):
            start = _later(start, times[0])
            stop = _earlier(stop, times[1])
        else:
            kept.append(spark_filter)
            continue
        (pushed if exact else narrowing).append(_label(spark_filter))
        if not exact:
            kept.append(spark_filter)
    chosen: tuple[str, ...] | None = None
    if subject_filters and direct and len(subjects) > 1:
        # A direct get takes one filter subject: the subject filters stay with Spark alone.
        kept.extend(spark_filter for spark_filter, _ in subject_filters)
    elif subject_filters:
        chosen = subjects
        for spark_filter, exact in subject_filters:
            (pushed if exact else narrowing).append(_label(spark_filter))
            if not exact:
                kept.append(spark_filter)
    result = PushedFilters(chosen, min_seq, max_seq, start, stop, tuple(pushed), tuple(narrowing))
    return result, [f for f in filters if any(f is k for k in kept)]
