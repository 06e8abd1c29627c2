"""Pure logic of filter pushdown for format `nats` batch reads: which Spark filters become filter
subjects, sequence bounds and time bounds, and which ones Spark keeps."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest

from nats_spark.jetstream.subject_names import subject_matches
from nats_spark.spark.stream_source.pushdown import (
    MAX_IN_SUBJECTS,
    PushedFilters,
    covering_pattern,
    intersect,
    push_filters,
    spark_pushes_filters,
)

pytestmark = pytest.mark.unit

try:
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
        Not,
        StringEndsWith,
        StringStartsWith,
    )
except ImportError:  # pyspark 4.0: no filter classes, and Spark never pushes filters
    pytest.skip("filter pushdown needs pyspark 4.1+", allow_module_level=True)

T = dt.datetime(2026, 11, 23, 8, 0, tzinfo=dt.UTC)
US = dt.timedelta(microseconds=1)


def push(*filters: Any, subjects: tuple[str, ...] = (), direct: bool = False) -> Any:
    pushed, kept = push_filters(list(filters), subjects, direct)
    return pushed, kept


def subjects_over(tokens: str, most: int) -> list[str]:
    return [".".join(p) for n in range(1, most + 1) for p in itertools.product(tokens, repeat=n)]


def test_intersect_matches_exactly_what_both_patterns_match() -> None:
    universe = subjects_over("abc", 3) + ["a.b.c.a"]
    literal_or_star = subjects_over("ab*", 3)
    patterns = literal_or_star + [p + ".>" for p in literal_or_star] + [">"]
    for a, b in itertools.product(patterns, repeat=2):
        both = intersect(a, b)
        for subject in universe:
            expected = subject_matches(a, subject) and subject_matches(b, subject)
            assert (both is not None and subject_matches(both, subject)) == expected, (a, b)
    assert intersect("a.*", "*.b") == "a.b"
    assert intersect("a.>", "*.b.>") == "a.b.>"
    assert intersect("a.>", "a") is None


def test_covering_pattern_covers_every_value() -> None:
    assert covering_pattern(["orders.eu.1", "orders.eu.2"]) == "orders.eu.*"
    assert covering_pattern(["orders.eu.1", "orders.us.1"]) == "orders.*.1"
    assert covering_pattern(["a.x.1", "a.y.2.3"]) == "a.*.>"
    assert covering_pattern(["a", "b.c"]) is None
    values = ["a.b", "a.c.d", "a.b.e.f"]
    assert all(subject_matches(covering_pattern(values) or "", v) for v in values)


def test_subject_equality_in_and_dot_prefix_are_pushed_exactly() -> None:
    equal = EqualTo(("subject",), "orders.eu.1")
    pushed, kept = push(equal)
    assert pushed.subjects == ("orders.eu.1",) and kept == []
    pushed, kept = push(In(("subject",), ("b.x", "a.x", "b.x")))
    assert pushed.subjects == ("a.x", "b.x") and kept == []
    pushed, kept = push(StringStartsWith(("subject",), "orders."))
    assert pushed.subjects == ("orders.>",) and kept == []
    assert "subject EqualTo 'orders.eu.1'" in push(equal)[0].describe()


@pytest.mark.parametrize("value", ["t.a*b", "t.>x", "t.x>", "t.**"])
def test_tokens_that_only_look_like_wildcards_are_literal(value: str) -> None:
    pushed, kept = push(EqualTo(("subject",), value))
    assert pushed.subjects == (value,) and kept == []


@pytest.mark.parametrize(
    "spark_filter",
    [
        *(EqualTo(("subject",), value) for value in ("t.*", "t.>", "*", "t..x", "t.a b", "", "t.")),
        *(StringStartsWith(("subject",), start) for start in ("orders", "", ".x", "t.*.", "a b.")),
    ],
    ids=repr,
)
def test_subject_values_nats_reads_differently_stay_with_spark(spark_filter: Any) -> None:
    pushed, kept = push(spark_filter)
    assert pushed.subjects is None and kept == [spark_filter]


def test_a_null_in_an_in_list_stays_with_spark() -> None:
    with_null = In(("subject",), ("a.x", None))
    assert push(with_null) == (PushedFilters(), [with_null])


def test_a_prefix_inside_a_token_narrows_and_stays_with_spark() -> None:
    spark_filter = StringStartsWith(("subject",), "orders.a")
    pushed, kept = push(spark_filter)
    assert pushed.subjects == ("orders.>",) and kept == [spark_filter]


def test_long_in_lists_push_one_covering_pattern_and_stay_with_spark() -> None:
    values = tuple(f"orders.eu.{i}" for i in range(MAX_IN_SUBJECTS + 1))
    long_in = In(("subject",), values)
    pushed, kept = push(long_in)
    assert pushed.subjects == ("orders.eu.*",) and kept == [long_in]
    assert f"subject In ({MAX_IN_SUBJECTS + 1} values)" in pushed.describe()
    at_cap = In(("subject",), values[:MAX_IN_SUBJECTS])
    assert push(at_cap)[0].subjects == tuple(sorted(values[:MAX_IN_SUBJECTS]))
    scattered = In(("subject",), ("a", *(f"k{i}.x" for i in range(MAX_IN_SUBJECTS))))
    assert push(scattered) == (PushedFilters(), [scattered])


def test_subject_filters_are_anded_with_each_other_and_the_subjects_option() -> None:
    pushed, _ = push(In(("subject",), ("a.x", "a.y", "b.x")), StringStartsWith(("subject",), "a."))
    assert pushed.subjects == ("a.x", "a.y")
    pushed, _ = push(EqualTo(("subject",), "a.x"), EqualTo(("subject",), "b.x"))
    assert pushed.subjects == () and pushed.matches_nothing
    pushed, _ = push(In(("subject",), ("a.x", "b.x")), subjects=("a.*", "c.>"))
    assert pushed.subjects == ("a.x",)
    pushed, _ = push(StringStartsWith(("subject",), "a.b."), subjects=("a.>", "c"))
    assert pushed.subjects == ("a.b.>",)
    pushed, _ = push(StringStartsWith(("subject",), "a."), subjects=("a.b.*", "a.c"))
    assert pushed.subjects == ("a.b.*", "a.c")


def test_direct_gets_take_one_subject() -> None:
    several = In(("subject",), ("a.x", "a.y"))
    assert push(several, direct=True) == (PushedFilters(), [several])
    assert push(EqualTo(("subject",), "a.x"), direct=True)[0].subjects == ("a.x",)


def test_sequence_bounds_are_exact_except_in() -> None:
    pushed, kept = push(GreaterThan(("stream_seq",), 5), LessThanOrEqual(("stream_seq",), 10))
    assert (pushed.min_seq, pushed.max_seq, kept) == (6, 10, [])
    pushed, kept = push(GreaterThanOrEqual(("stream_seq",), 5), LessThan(("stream_seq",), 10))
    assert (pushed.min_seq, pushed.max_seq, kept) == (5, 9, [])
    pushed, kept = push(EqualTo(("stream_seq",), 7), GreaterThan(("stream_seq",), 3))
    assert (pushed.min_seq, pushed.max_seq, kept) == (7, 7, [])
    listed = In(("stream_seq",), (9, 3, 5))
    pushed, kept = push(listed)
    assert (pushed.min_seq, pushed.max_seq, kept) == (3, 9, [listed])
    assert push(LessThan(("stream_seq",), 1))[0].matches_nothing
    assert push(GreaterThan(("stream_seq",), 9), LessThan(("stream_seq",), 9))[0].matches_nothing
    assert push(GreaterThan(("stream_seq",), -4))[0] == PushedFilters()


def test_time_bounds_narrow_and_stay_with_spark() -> None:
    at_or_after = GreaterThanOrEqual(("timestamp",), T)
    pushed, kept = push(at_or_after)
    assert (pushed.start_time, pushed.stop_time, kept) == (T, None, [at_or_after])
    assert push(GreaterThan(("timestamp",), T))[0].start_time == T + US
    assert push(LessThan(("timestamp",), T))[0].stop_time == T
    assert push(LessThanOrEqual(("timestamp",), T))[0].stop_time == T + US
    equal = push(EqualTo(("timestamp",), T))[0]
    assert (equal.start_time, equal.stop_time) == (T, T + US)
    later = push(at_or_after, GreaterThan(("timestamp",), T + US))[0]
    assert later.start_time == T + 2 * US
    zoned = T.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert push(GreaterThanOrEqual(("timestamp",), zoned))[0].start_time == T
    assert push(LessThan(("timestamp",), T), GreaterThanOrEqual(("timestamp",), T))[
        0
    ].matches_nothing
    naive = GreaterThanOrEqual(("timestamp",), T.replace(tzinfo=None))
    assert push(naive) == (PushedFilters(), [naive])
    last = LessThanOrEqual(("timestamp",), dt.datetime.max.replace(tzinfo=dt.UTC))
    assert push(last) == (PushedFilters(), [last])


def test_other_filters_stay_with_spark_in_their_order_and_identity() -> None:
    others = [
        Not(EqualTo(("subject",), "a.x")),
        IsNotNull(("subject",)),
        StringEndsWith(("subject",), ".x"),
        EqualTo(("stream",), "S"),
        GreaterThan(("stream_seq",), True),
        GreaterThan(("stream_seq",), 2.5),
    ]
    prefix = StringStartsWith(("subject",), "a.b")
    filters = [others[0], EqualTo(("stream_seq",), 4), prefix, *others[1:]]
    pushed, kept = push(*filters)
    assert kept == [filters[0], prefix, *others[1:]]
    assert all(a is b for a, b in zip(kept, [filters[0], prefix, *others[1:]], strict=True))
    assert (pushed.min_seq, pushed.max_seq, pushed.subjects) == (4, 4, ("a.>",))


def test_only_spark_s_pushdown_worker_gets_a_pushing_reader() -> None:
    assert not spark_pushes_filters()
    scope = {
        "__name__": "pyspark.sql.worker.data_source_pushdown_filters",
        "f": spark_pushes_filters,
    }
    exec("found = f()", scope)
    assert scope["found"] is True
    scope = {"__name__": "pyspark.sql.worker.plan_data_source_read", "f": spark_pushes_filters}
    exec("found = f()", scope)
    assert scope["found"] is False
