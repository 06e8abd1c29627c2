"""Partition assignment, filter subjects, elastic transforms and the server's partition hash."""

from functools import reduce

import pytest

from nats_spark.pcg import (
    ElasticConfig,
    MemberMapping,
    PartitioningFilter,
    StaticConfig,
    elastic_stream_name,
    elastic_subject_transforms,
    generate_partition_filters,
    member_filter_subjects,
    member_partitions,
    partition_for,
    strip_partition,
)

pytestmark = pytest.mark.unit

MEMBERS = ["m3", "m1", "m2"]


@pytest.mark.parametrize(
    ("partitions", "expected"),
    [
        (6, {"m1": [0, 1], "m2": [2, 3], "m3": [4, 5]}),
        (7, {"m1": [0, 1, 6], "m2": [2, 3], "m3": [4, 5]}),
        (8, {"m1": [0, 1, 6], "m2": [2, 3, 7], "m3": [4, 5]}),
        (3, {"m1": [0], "m2": [1], "m3": [2]}),
        (1, {"m1": [0], "m2": [], "m3": []}),
    ],
)
def test_balanced_vectors_from_the_go_library(partitions, expected):
    for member, owned in expected.items():
        assert member_partitions(MEMBERS, partitions, None, member) == owned
        assert generate_partition_filters(MEMBERS, partitions, [], member, "foo.*.*.>") == [
            f"{p}.foo.*.*.>" for p in owned
        ]


def test_every_partition_has_exactly_one_owner():
    members = [f"m{i}" for i in range(7)]
    for partitions in range(1, 40):
        owned = [p for m in members for p in member_partitions(members, partitions, None, m)]
        assert sorted(owned) == list(range(partitions))


def test_members_beyond_max_members_get_nothing():
    members = ["e", "d", "c", "b", "a"]
    assert [member_partitions(members, 3, None, m) for m in "abcde"] == [[0], [1], [2], [], []]


def test_members_are_deduplicated_and_sorted_in_byte_order():
    members = ["b", "a", "B", "b", "é"]  # 'B' < 'a' < 'b' < 'é' as UTF-8 bytes
    assert [member_partitions(members, 4, None, m) for m in ["B", "a", "b", "é"]] == [
        [0],
        [1],
        [2],
        [3],
    ]


def test_a_member_outside_the_group_gets_nothing():
    assert member_partitions(MEMBERS, 6, None, "m4") == []
    assert generate_partition_filters(MEMBERS, 6, None, "m4", ">") == []
    assert generate_partition_filters([], 6, None, "m1", ">") == []


def test_mapped_members_get_their_partitions_with_any_filter_as_gt():
    mappings = [MemberMapping("a", [3, 0]), {"member": "b", "partitions": [1, 2]}]
    assert member_partitions(None, 4, mappings, "a") == [3, 0]
    assert member_partitions([], 4, mappings, "b") == [1, 2]
    assert generate_partition_filters(None, 4, mappings, "a", "foo.*") == ["3.>", "0.>"]
    assert generate_partition_filters(None, 4, mappings, "c", "foo.*") == []


def test_a_member_list_wins_over_mappings_as_in_go():
    mappings = [MemberMapping("a", [0, 1])]
    assert member_partitions(["a", "b"], 2, mappings, "a") == [0]


def test_elastic_filter_subjects_loop_filters_then_partitions():
    config = ElasticConfig(
        4,
        [PartitioningFilter("foo.*", [1]), PartitioningFilter("bar.>")],
        members=["m1", "m2"],
    )
    assert member_filter_subjects(config, "m2") == ["2.foo.*", "3.foo.*", "2.bar.>", "3.bar.>"]


def test_filter_subjects_without_filters_use_gt():
    assert member_filter_subjects(ElasticConfig(2, members=["m1"]), "m1") == ["0.>", "1.>"]
    assert member_filter_subjects(ElasticConfig(2, [], members=["m1"]), "m1") == ["0.>", "1.>"]
    assert member_filter_subjects(StaticConfig(2, members=["m1", "m2"]), "m2") == ["1.>"]


def test_static_filter_subjects():
    config = StaticConfig(4, ["a.*", "b.*"], ["m1", "m2"])
    assert member_filter_subjects(config, "m1") == ["0.a.*", "1.a.*", "0.b.*", "1.b.*"]
    mapped = StaticConfig(2, ["a.*", "b.*"], member_mappings=[MemberMapping("m1", [0, 1])])
    assert member_filter_subjects(mapped, "m1") == ["0.>", "1.>", "0.>", "1.>"]


def test_elastic_stream_name():
    assert elastic_stream_name("ORDERS", "g1") == "ORDERS-g1"


def test_subject_transforms():
    config = ElasticConfig(
        4,
        [
            PartitioningFilter("foo.*.*.>", [1, 2]),
            PartitioningFilter("bar.*.x.*", [2]),
            PartitioningFilter("baz.>", None),
            PartitioningFilter("qux.*", []),
        ],
    )
    assert elastic_subject_transforms(config) == [
        {"src": "foo.*.*.>", "dest": "{{Partition(4,1,2)}}.foo.{{Wildcard(1)}}.{{Wildcard(2)}}.>"},
        {"src": "bar.*.x.*", "dest": "{{Partition(4,2)}}.bar.{{Wildcard(1)}}.x.{{Wildcard(2)}}"},
        {"src": "baz.>", "dest": "{{Partition(4)}}.baz.>"},
        {"src": "qux.*", "dest": "{{Partition(4)}}.qux.{{Wildcard(1)}}"},
    ]


def test_subject_transform_without_filters_hashes_everything():
    expected = [{"src": ">", "dest": "{{Partition(3)}}.>"}]
    assert elastic_subject_transforms(ElasticConfig(3)) == expected
    assert elastic_subject_transforms(ElasticConfig(3, [])) == expected


def test_strip_partition():
    assert strip_partition("3.foo.bar") == (3, "foo.bar")
    assert strip_partition("12.x") == (12, "x")


@pytest.mark.parametrize("subject", ["foo.bar", "x3.foo", "3", ".foo", "-1.foo", "³.foo"])
def test_strip_partition_needs_a_numeric_first_token(subject):
    with pytest.raises(ValueError, match="has no partition token") as e:
        strip_partition(subject)
    assert "{{partition(N,...)}}" in str(e.value)


def fnv1a32(data: bytes) -> int:
    """Reference FNV-1a, written apart from the code under test."""
    return reduce(lambda h, b: (h ^ b) * 16777619 % 2**32, data, 2166136261)


def test_fnv1a_reference_matches_published_vectors():
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


def test_partition_for_is_the_hash_itself_modulo_two_to_the_32():
    assert partition_for([], 2**32) == 0x811C9DC5
    assert partition_for("a", 2**32) == 0xE40C292C
    assert partition_for(["foo", "bar"], 2**32) == 0xBF9CF968


@pytest.mark.parametrize("tokens", [["order-1"], ["eu", "42"], ["ü", "x"]])
@pytest.mark.parametrize("n", [1, 4, 7, 10])
def test_partition_for_is_fnv1a_modulo_n(tokens, n):
    assert partition_for(tokens, n) == fnv1a32("".join(tokens).encode()) % n


def test_partition_for_hashes_a_string_as_it_is():
    assert partition_for("foo.bar", 2**32) == fnv1a32(b"foo.bar")
    assert partition_for("foo.bar", 2**32) != partition_for(["foo", "bar"], 2**32)


def test_partition_for_needs_partitions():
    with pytest.raises(ValueError, match="partitions is 0"):
        partition_for(["a"], 0)
