"""Group configs: Go's wire shape, exact round trips, membership changes and validation."""

import pytest

from nats_spark.pcg import (
    ElasticConfig,
    GroupConfigError,
    MemberMapping,
    PartitioningFilter,
    StaticConfig,
)

pytestmark = pytest.mark.unit

# Values as Go's json.Marshal writes them (compact, struct order, omitempty, HTML-safe escapes).
GO_ELASTIC = [
    # the facts file's example
    '{"max_members":4,"partitioning_filters":[{"filter":"foo.*","partitioning_wildcards":[1]}],'
    '"max_buffered_msg":-1,"max_buffered_bytes":-1,"members":["m1","m2"]}',
    # no filters: null, and no buffer limits, no members
    '{"max_members":2,"partitioning_filters":null}',
    # null wildcards, explicit mappings
    '{"max_members":3,"partitioning_filters":'
    '[{"filter":"foo.\\u003e","partitioning_wildcards":null}],'
    '"member_mappings":[{"member":"a","partitions":[0,2]},{"member":"b","partitions":[1]}]}',
    # empty (not null) wildcards and filters, only one buffer limit, members out of order
    '{"max_members":3,"partitioning_filters":[{"filter":"foo.*","partitioning_wildcards":[]}],'
    '"max_buffered_bytes":1048576,"members":["m2","m1"]}',
    '{"max_members":1,"partitioning_filters":[],"max_buffered_msg":100}',
    # escaped HTML characters and UTF-8 kept as is
    '{"max_members":2,"partitioning_filters":[{"filter":"a\\u003cb.\\u0026.*.\\u003e",'
    '"partitioning_wildcards":[1]}],"members":["zoë","\\u2028x"]}',
    # a mapping whose partitions are null
    '{"max_members":2,"partitioning_filters":null,"member_mappings":'
    '[{"member":"a","partitions":null},{"member":"b","partitions":[0,1]}]}',
]
GO_STATIC = [
    '{"max_members":10,"filters":["foo.*"],"members":["m1","m2"]}',
    '{"max_members":2}',
    '{"max_members":2,"member_mappings":[{"member":"m1","partitions":[1,0]}]}',
    '{"max_members":3,"filters":["a.*","b.\\u003e"],"members":["x"]}',
]
WITH_UNKNOWN_FIELDS = (
    '{"max_members":2,"partitioning_filters":null,"members":["m1"],'
    '"future":{"b":1.50,"a":[true,null,1e3,-0]},"z":"\\u003e"}'
)


@pytest.mark.parametrize("stored", GO_ELASTIC + [WITH_UNKNOWN_FIELDS])
def test_elastic_values_round_trip_byte_for_byte(stored):
    config = ElasticConfig.from_json(stored.encode())
    assert config.to_json() == stored.encode()
    assert ElasticConfig.from_json(stored).to_json() == stored.encode()


@pytest.mark.parametrize("stored", GO_STATIC)
def test_static_values_round_trip_byte_for_byte(stored):
    assert StaticConfig.from_json(stored.encode()).to_json() == stored.encode()


def test_values_from_other_writers_are_read_and_rewritten_the_go_way():
    spaced = '{ "members": ["m1"], "max_members": 2, "partitioning_filters": [{"filter": "a.>"}] }'
    config = ElasticConfig.from_json(spaced)
    assert config == ElasticConfig(2, [PartitioningFilter("a.>")], members=["m1"])
    assert config.to_json() == (
        b'{"max_members":2,"partitioning_filters":[{"filter":"a.\\u003e"}],"members":["m1"]}'
    )


def test_null_and_empty_lists_read_apart():
    absent = ElasticConfig.from_json(b'{"max_members":1,"partitioning_filters":null}')
    empty = ElasticConfig.from_json(b'{"max_members":1,"partitioning_filters":[]}')
    assert absent.partitioning_filters is None
    assert empty.partitioning_filters == []
    null_wildcards = ElasticConfig.from_json(GO_ELASTIC[2]).partitioning_filters[0]
    empty_wildcards = ElasticConfig.from_json(GO_ELASTIC[3]).partitioning_filters[0]
    assert null_wildcards.partitioning_wildcards is None
    assert empty_wildcards.partitioning_wildcards == []


def test_values_built_in_code_are_written_as_go_writes_them():
    facts_example = ElasticConfig(
        max_members=4,
        partitioning_filters=[PartitioningFilter("foo.*", [1])],
        max_buffered_msgs=-1,
        max_buffered_bytes=-1,
        members=["m1", "m2"],
    )
    assert facts_example.to_json() == GO_ELASTIC[0].encode()
    assert ElasticConfig(max_members=2).to_json() == GO_ELASTIC[1].encode()
    assert StaticConfig(10, ["foo.*"], ["m1", "m2"]).to_json() == GO_STATIC[0].encode()
    assert StaticConfig(2).to_json() == GO_STATIC[1].encode()
    mapped = StaticConfig(2, member_mappings=[MemberMapping("m1", [1, 0])])
    assert mapped.to_json() == GO_STATIC[2].encode()
    escaped = ElasticConfig(
        max_members=2,
        partitioning_filters=[PartitioningFilter("a<b.&.*.>", [1])],
        members=["zoë", "\u2028x"],
    )
    assert escaped.to_json() == GO_ELASTIC[5].encode()


def test_read_values_equal_built_ones():
    assert ElasticConfig.from_json(GO_ELASTIC[0]) == ElasticConfig(
        4, [PartitioningFilter("foo.*", [1])], -1, -1, ["m1", "m2"]
    )


def test_adding_members_changes_only_the_member_list():
    config = ElasticConfig.from_json(GO_ELASTIC[0])
    grown = config.with_members_added(["m3", "m1", "m0", "m3"])
    assert grown.members == ["m1", "m2", "m3", "m0"]
    assert grown.to_json() == GO_ELASTIC[0].replace('["m1","m2"]', '["m1","m2","m3","m0"]').encode()
    assert config.members == ["m1", "m2"], "the original is left alone"


def test_adding_members_keeps_unknown_fields_after_the_known_ones():
    grown = ElasticConfig.from_json(WITH_UNKNOWN_FIELDS).with_members_added(["m2"])
    assert grown.to_json() == WITH_UNKNOWN_FIELDS.replace('["m1"]', '["m1","m2"]').encode()


def test_adding_the_first_members_inserts_the_field_in_struct_order():
    grown = ElasticConfig.from_json(GO_ELASTIC[3].replace(',"members":["m2","m1"]', ""))
    grown = grown.with_members_added(["m2", "m1"])
    assert grown.to_json() == GO_ELASTIC[3].encode()


def test_dropping_members_changes_only_the_member_list():
    config = ElasticConfig.from_json(GO_ELASTIC[0])
    assert (
        config.with_members_dropped(["m1", "nobody"]).to_json()
        == GO_ELASTIC[0].replace('["m1","m2"]', '["m2"]').encode()
    )
    emptied = config.with_members_dropped(["m1", "m2"])
    assert emptied.to_json() == GO_ELASTIC[0].replace(',"members":["m1","m2"]', "").encode()


def test_a_single_name_string_is_refused():
    with pytest.raises(TypeError, match="as a list"):
        ElasticConfig.from_json(GO_ELASTIC[0]).with_members_added("m3")


def test_setting_mappings_replaces_the_member_list():
    config = ElasticConfig.from_json(WITH_UNKNOWN_FIELDS)
    mapped = config.with_mappings([MemberMapping("a", [0, 1])])
    assert (
        mapped.to_json()
        == WITH_UNKNOWN_FIELDS.replace(
            '"members":["m1"]', '"member_mappings":[{"member":"a","partitions":[0,1]}]'
        ).encode()
    )
    assert (
        mapped.without_mappings().to_json()
        == WITH_UNKNOWN_FIELDS.replace(',"members":["m1"]', "").encode()
    )


def test_changing_one_mapping_keeps_the_others_as_stored():
    config = ElasticConfig.from_json(GO_ELASTIC[6])
    changed = config.with_mappings([config.member_mappings[0], MemberMapping("c", [0, 1])])
    assert changed.to_json() == GO_ELASTIC[6].replace('"b"', '"c"').encode()


def test_members_cannot_change_while_mappings_are_used():
    config = ElasticConfig.from_json(GO_ELASTIC[2])
    with pytest.raises(GroupConfigError, match="member_mappings"):
        config.with_members_added(["m9"])
    with pytest.raises(GroupConfigError, match="member_mappings"):
        config.with_members_dropped(["a"])


def test_empty_mappings_are_refused():
    with pytest.raises(GroupConfigError, match="at least one mapping"):
        ElasticConfig.from_json(GO_ELASTIC[0]).with_mappings([])


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ("{", "is not valid JSON: Expecting property name"),
        ('{"max_members":NaN}', "is not valid JSON: NaN is not a JSON value"),
        ("[]", "is JSON of the wrong shape: expected an object, got an array"),
        ('{"max_members":"3"}', "'max_members' must be a non-negative integer, got a string"),
        ('{"max_members":1.0}', "got number 1.0"),
        ('{"max_members":1e2}', "got number 1e2"),
        ('{"max_members":-1}', "got -1"),
        ('{"max_members":2,"members":["a",7]}', "'members[1]' must be a string, got number 7"),
        ('{"max_members":2,"members":"a"}', "'members' must be an array"),
        (
            '{"max_members":2,"partitioning_filters":[{"filter":"a.*","partitioning_wildcards":{}}]}',
            "'partitioning_filters[0].partitioning_wildcards' must be an array, got an object",
        ),
        ('{"max_members":2,"max_buffered_msg":9223372036854775808}', "'max_buffered_msg'"),
    ],
)
def test_malformed_values_are_refused_with_the_key(stored, message):
    with pytest.raises(GroupConfigError, match="^group config for ORDERS.g1 is ") as e:
        ElasticConfig.from_json(stored, key="ORDERS.g1")
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    assert str(e.value).endswith(
        "; rewrite the KV entry with a valid config, or delete and recreate the group"
    )


def test_wrong_shape_is_not_called_invalid_json():
    with pytest.raises(GroupConfigError) as e:
        StaticConfig.from_json('{"max_members":"four","members":["m1"]}')
    assert "not valid JSON" not in str(e.value)
    assert str(e.value).startswith("group config is JSON of the wrong shape: field 'max_members'")


def test_bytes_that_are_not_utf8_are_refused():
    with pytest.raises(GroupConfigError, match="not valid JSON"):
        StaticConfig.from_json(b'{"max_members":2,"members":["\xff"]}')


def test_group_config_error_is_a_value_error():
    assert issubclass(GroupConfigError, ValueError)


@pytest.mark.parametrize("stored", GO_ELASTIC + [WITH_UNKNOWN_FIELDS])
def test_go_values_are_valid(stored):
    ElasticConfig.from_json(stored).validate()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (StaticConfig(0, members=["m1"]), "max_members is 0"),
        (
            StaticConfig(2, members=["m1"], member_mappings=[MemberMapping("m1", [0, 1])]),
            "both members and member_mappings are set",
        ),
        (
            StaticConfig(1, member_mappings=[MemberMapping("a", [0]), MemberMapping("b", [])]),
            "2 member_mappings for max_members 1",
        ),
        (
            StaticConfig(2, member_mappings=[MemberMapping("m1", [0]), MemberMapping("m1", [1])]),
            "member 'm1' listed twice in member_mappings; list each member once",
        ),
        (
            StaticConfig(2, member_mappings=[MemberMapping("m1", [0, 2])]),
            "member 'm1' is mapped to partition 2; use partitions 0 to 1",
        ),
        (
            StaticConfig(2, member_mappings=[MemberMapping("m1", [-1, 0, 1])]),
            "mapped to partition -1",
        ),
        (
            StaticConfig(2, member_mappings=[MemberMapping("a", [0, 1]), MemberMapping("b", [1])]),
            "partition 1 is mapped to both 'a' and 'b'",
        ),
        (
            StaticConfig(2, member_mappings=[MemberMapping("m1", [1, 1])]),
            "partition 1 is mapped to both 'm1' and 'm1'",
        ),
        (
            StaticConfig(4, member_mappings=[MemberMapping("a", [1]), MemberMapping("b", [2])]),
            "2 of 4 partitions are not mapped to a member (first: 0, 3)",
        ),
        (
            ElasticConfig(3, [PartitioningFilter("", None)], members=["m1"]),
            "a partitioning filter is empty",
        ),
        (
            ElasticConfig(3, [PartitioningFilter("foo.bar", None)]),
            "'foo.bar' has no '*' token and does not end in '>'",
        ),
        (
            ElasticConfig(3, [PartitioningFilter("foo.>x", None)]),
            "has no '*' token",
        ),
        (
            ElasticConfig(3, [PartitioningFilter("foo.*.*", [2, 2])]),
            "wildcard index 2 is listed twice",
        ),
        (
            ElasticConfig(3, [PartitioningFilter("foo.*.*", [3])]),
            "wildcard index 3 does not fit filter 'foo.*.*'; use indexes 1 to 2",
        ),
        (
            ElasticConfig(3, [PartitioningFilter("foo.*", [0])]),
            "wildcard index 0 does not fit",
        ),
        (
            ElasticConfig(3, [PartitioningFilter("foo.>", [1])]),
            "leave partitioning_wildcards empty",
        ),
    ],
)
def test_broken_rules_are_reported(config, message):
    with pytest.raises(GroupConfigError, match="^group config is invalid: ") as e:
        config.validate()
    assert message in str(e.value)
    assert str(e.value).count("group config") == 1


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "is empty"),
        ("m 1", "contains whitespace"),
        ("m\t1", "contains whitespace"),
        ("m.1", "contains"),
        ("m*", "contains"),
        ("m>", "contains"),
        ("a/b", "contains"),
        ("a\\b", "contains"),
        ("x" * 256, "longer than 255 bytes"),
        ("é" * 128, "longer than 255 bytes"),
    ],
)
@pytest.mark.parametrize("kind", ["elastic", "static"])
def test_member_names_must_be_consumer_names(name, problem, kind):
    if kind == "elastic":
        config: ElasticConfig | StaticConfig = ElasticConfig(2, members=["ok", name])
    else:
        config = StaticConfig(1, member_mappings=[MemberMapping(name, [0])])
    with pytest.raises(GroupConfigError, match="consumer names") as e:
        config.validate()
    assert problem in str(e.value)


def test_valid_configs_pass():
    ElasticConfig(8, [PartitioningFilter("a.*.*.>", [2, 1]), PartitioningFilter("b.>")]).validate()
    ElasticConfig(3, members=["m1", "m1", "m2", "m3", "m4", "x" * 255]).validate()
    StaticConfig(2, member_mappings=[MemberMapping("a", [1]), MemberMapping("b", [0])]).validate()


def test_membership_changes_are_validated():
    config = ElasticConfig.from_json(GO_ELASTIC[0])
    with pytest.raises(GroupConfigError, match="'bad name'"):
        config.with_members_added(["bad name"])
    with pytest.raises(GroupConfigError, match="not mapped"):
        config.with_mappings([MemberMapping("a", [0])])
