"""Pure logic, no server: option parsing and the consumers of each read layout."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nats_spark.cli import build_parser, settings_from_args
from nats_spark.errors import ConfigurationError
from nats_spark.pcg.config import ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig
from nats_spark.pcg.consumers import member_consumer, partition_consumer
from nats_spark.pcg.partitioning import partition_filter_subjects, partition_owner
from nats_spark.pcg.store import GroupEntry, GroupKind
from nats_spark.spark.group_source.options import KNOWN_OPTIONS, parse_options
from nats_spark.spark.shared.pacing import TriggerPacing
from nats_spark.spark.sink.options import parse_sink_options
from nats_spark.spark.stream_source.options import parse_read_options

pytestmark = pytest.mark.unit

BASE = {"servers": "nats://127.0.0.1:1", "stream": "S", "group": "g"}
STREAM = {"servers": "nats://127.0.0.1:1", "stream": "S"}  # format nats


@pytest.mark.parametrize("value", ["auto", "partition", "member", "PARTITION"])
def test_consumer_layout_values(value: str) -> None:
    layout = parse_options({**BASE, "consumerLayout": value}).consumer_layout
    assert layout == (None if value == "auto" else value.lower())  # None: auto


def test_consumer_layout_default_and_bad_values() -> None:
    assert parse_options(BASE).consumer_layout is None  # auto
    with pytest.raises(ConfigurationError, match="consumerLayout='members' is not valid"):
        parse_options({**BASE, "consumerLayout": "members"})
    plain = {**BASE, "consumer": "c"}
    del plain["group"]
    with pytest.raises(ConfigurationError, match="consumerLayout does not apply"):
        parse_options({**plain, "consumerLayout": "partition"})


def _static(config: StaticConfig) -> GroupEntry:
    return GroupEntry(GroupKind.STATIC, "S", "g", config, 1)


def test_partition_filters_are_the_owners_filters_of_that_partition() -> None:
    balanced = StaticConfig(max_members=8, members=["m1", "m2", "m3"])
    for p in range(8):
        owner = partition_owner(balanced, p)
        assert owner is not None
        assert partition_filter_subjects(balanced, p) == [f"{p}.>"]
        assert f"{p}.>" in member_consumer(_static(balanced), owner).filter_subjects
    filtered = StaticConfig(max_members=2, filters=["a.*", "b.*"], members=["m1"])
    assert partition_filter_subjects(filtered, 1) == ["1.a.*", "1.b.*"]
    mapped = StaticConfig(
        max_members=3,
        filters=["a.*"],
        member_mappings=[MemberMapping("x", [2, 0]), MemberMapping("y", [1])],
    )
    assert partition_owner(mapped, 1) == "y"
    assert partition_filter_subjects(mapped, 0) == ["0.>"]  # as Go writes mapped members'
    assert partition_owner(StaticConfig(max_members=2, members=[]), 0) is None


def test_partition_consumer_config() -> None:
    entry = _static(StaticConfig(max_members=4, members=["m1", "m2"]))
    consumer = partition_consumer(entry, 3, {"ack_wait": 2_000_000_000, "max_ack_pending": 7})
    assert (consumer.stream, consumer.name) == ("S", "g-partition-3")
    assert consumer.config == {
        "ack_wait": 2_000_000_000,
        "max_ack_pending": 7,
        "priority_groups": ["PCG"],
        "priority_policy": "pinned_client",
        "priority_timeout": 2_000_000_000,
        "durable_name": "g-partition-3",
        "ack_policy": "explicit",
        "filter_subject": "3.>",
    }
    two_filters = _static(StaticConfig(max_members=2, filters=["a.*", "b.*"], members=["m"]))
    assert partition_consumer(two_filters, 0).config["filter_subjects"] == ["0.a.*", "0.b.*"]


def test_elastic_partition_consumers_live_on_the_work_queue_stream() -> None:
    config = ElasticConfig(max_members=2, partitioning_filters=[PartitioningFilter("S.*", [1])])
    config = config.with_members_added(["a"])
    entry = GroupEntry(GroupKind.ELASTIC, "S", "g", config, 1)
    consumer = partition_consumer(entry, 1)
    assert (consumer.stream, consumer.name) == ("S-g", "partition-1")
    assert consumer.config["filter_subject"] == "1.S.*"
    assert "inactive_threshold" not in consumer.config  # durable, unlike a member's
    single = GroupEntry(
        GroupKind.ELASTIC, "S", "g", ElasticConfig(1, None).with_members_added(["a"]), 1
    )
    config_of_one = partition_consumer(single, 0).config
    assert "filter_subject" not in config_of_one and "filter_subjects" not in config_of_one


def test_secrets_from_files_and_the_environment(tmp_path, monkeypatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cr3t-Kq7\n")
    parsed = parse_options({**BASE, "user": "u", "passwordFile": str(secret)}).connection
    assert (parsed.user, parsed.password) == ("u", "s3cr3t-Kq7")
    parsed = parse_options({**BASE, "tokenFile": str(secret)}).connection
    assert parsed.token == "s3cr3t-Kq7"
    with pytest.raises(ConfigurationError, match="both password and passwordFile given") as caught:
        parse_options({**BASE, "user": "u", "password": "x-Zz9", "passwordFile": str(secret)})
    assert "x-Zz9" not in str(caught.value) and "s3cr3t" not in str(caught.value)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigurationError, match=r"tokenFile .*empty is empty"):
        parse_options({**BASE, "tokenFile": str(empty)})

    monkeypatch.setenv("NATS_USER", "envuser")
    monkeypatch.setenv("NATS_PASSWORD", "env-Pw5")
    parsed = parse_options(BASE).connection
    assert (parsed.user, parsed.password) == ("envuser", "env-Pw5")
    assert "env-Pw5" not in repr(parsed)
    # Options win over the environment, which then applies not at all.
    parsed = parse_options({**BASE, "tokenFile": str(secret)}).connection
    assert (parsed.user, parsed.password, parsed.token) == (None, None, "s3cr3t-Kq7")
    monkeypatch.delenv("NATS_USER")
    monkeypatch.delenv("NATS_PASSWORD")
    monkeypatch.setenv("NATS_TOKEN", "tok-Yy2")
    assert parse_options(BASE).connection.token == "tok-Yy2"


@pytest.mark.parametrize(
    "text, deliver",
    [
        ("earliest", {"deliver_policy": "all"}),
        ("LATEST", {"deliver_policy": "new"}),
        ("sequence:61", {"deliver_policy": "by_start_sequence", "opt_start_seq": 61}),
        (
            "time:2026-11-23T08:00:00+01:00",
            {"deliver_policy": "by_start_time", "opt_start_time": "2026-11-23T07:00:00Z"},
        ),
        (
            "time:2026-11-23T08:00:00",  # no zone: UTC
            {"deliver_policy": "by_start_time", "opt_start_time": "2026-11-23T08:00:00Z"},
        ),
    ],
)
def test_starting_position(text: str, deliver: dict) -> None:
    parsed = parse_options({**BASE, "startingPosition": text}).starting_position
    assert parsed is not None and parsed.deliver == deliver
    assert parse_options(BASE).starting_position is None


def test_trigger_pacing_options() -> None:
    parsed = parse_options({**BASE, "minMessagesPerTrigger": "500", "maxTriggerDelay": "30s"})
    assert (parsed.min_messages_per_trigger, parsed.max_trigger_delay) == (500, 30.0)
    assert parse_options(BASE).max_trigger_delay == 900.0  # Kafka's 15 minutes
    read = parse_read_options({**STREAM, "minMessagesPerTrigger": "5"}, streaming=True)
    assert read.min_messages_per_trigger == 5


def test_load_leaves_the_batch_or_streaming_only_options_to_the_reader() -> None:
    """At load() (streaming=None) Spark does not say which read it is: the options of one kind
    only pass there and are refused when Spark asks for that kind's reader."""
    both = {**STREAM, "endingPosition": "sequence:5", "maxMessagesPerTrigger": "10"}
    assert parse_read_options(both, streaming=None).ending_position is not None
    with pytest.raises(ConfigurationError, match="maxMessagesPerTrigger does not apply to batch"):
        parse_read_options(both, streaming=False)
    with pytest.raises(ConfigurationError, match="endingPosition does not apply to streaming"):
        parse_read_options(both, streaming=True)


def test_pacing_holds_back_until_enough_or_the_delay() -> None:
    now = [100.0]
    pacing = TriggerPacing(10, 60.0, clock=lambda: now[0])
    assert not pacing.holds_back(0)  # nothing to read is no batch anyway, not a hold
    assert pacing.holds_back(9)
    assert not pacing.holds_back(10)
    now[0] += 59.9
    assert pacing.holds_back(9)
    now[0] += 0.1  # the delay counts from the query's start ...
    assert not pacing.holds_back(1)
    pacing.batch_planned()
    now[0] += 30
    assert pacing.holds_back(1)  # ... then from the previous batch
    assert not TriggerPacing(None, 60.0).holds_back(1)


@pytest.mark.parametrize(
    "routing, prefix",
    [
        ({}, "$JS.API"),
        ({"domain": "hub"}, "$JS.hub.API"),
        ({"apiPrefix": "JS.acme.API"}, "JS.acme.API"),
        ({"apiPrefix": "JS.acme.API."}, "JS.acme.API"),  # as the nats CLI takes it
    ],
)
@pytest.mark.parametrize("parse", ["nats-pcg", "nats read", "nats sink"])
def test_domain_and_api_prefix_set_the_api_prefix_of_every_format(
    routing: dict[str, str], prefix: str, parse: str
) -> None:
    if parse == "nats-pcg":
        settings = parse_options({**BASE, **routing}).connection
    elif parse == "nats read":
        settings = parse_read_options({**STREAM, **routing}, streaming=False).connection
    else:
        settings = parse_sink_options({"servers": "h:1", "subject": "s", **routing}).connection
    assert settings.jetstream_prefix == prefix
    assert "inbox_prefix" not in settings.connect_kwargs()


def test_inbox_prefix_goes_to_the_connection() -> None:
    settings = parse_options({**BASE, "INBOXPREFIX": "_INBOX_etl"}).connection
    assert settings.connect_kwargs()["inbox_prefix"] == "_INBOX_etl"


def test_cli_routing_flags() -> None:
    flags = ["--js-domain", "hub", "--inbox-prefix", "_INBOX_etl", "static", "ls", "S"]
    settings = settings_from_args(build_parser().parse_args(flags))
    assert (settings.jetstream_prefix, settings.inbox_prefix) == ("$JS.hub.API", "_INBOX_etl")
    args = build_parser().parse_args(["--js-api-prefix", "JS.A.API", "static", "ls", "S"])
    assert settings_from_args(args).jetstream_prefix == "JS.A.API"
    both = ["--js-domain", "hub", "--js-api-prefix", "JS.A.API", "static", "ls", "S"]
    with pytest.raises(ConfigurationError, match="are exclusive"):
        settings_from_args(build_parser().parse_args(both))


# Bad input, one table for every format's parser: each error is one line naming the problem and
# the fix, raised before anything connects.

Overrides = dict[str, str | None]
SINK = {"servers": "nats://127.0.0.1:1", "subject": "s"}
MISSING = "/no/such/file.pem"
DROP = None  # an override that removes the option

# Format name -> (its base options, its parser).
PARSERS: dict[str, tuple[dict[str, str], Callable[[dict[str, str]], object]]] = {
    "nats-pcg": (BASE, parse_options),
    "nats": (STREAM, lambda options: parse_read_options(options, streaming=False)),
    "nats streaming": (STREAM, lambda options: parse_read_options(options, streaming=True)),
    "sink": (SINK, parse_sink_options),
}

# (overrides of the group source's BASE, text the one-line error must contain)
GROUP_CASES: list[tuple[Overrides, str]] = [
    ({"colour": "blue"}, "unknown option 'colour'; known options: servers, "),
    ({"startingPositon": "x"}, "unknown option 'startingPositon'; did you mean startingPosition?"),
    ({"servers": DROP}, "option servers is required"),
    ({"servers": "  "}, "option servers is required"),
    ({"servers": " , "}, "no NATS server given"),
    ({"servers": "http://h:1"}, "unknown scheme"),
    ({"stream": DROP}, "option stream is required"),
    ({"stream": "a.b"}, "option stream='a.b' is not a valid NATS name"),
    ({"stream": "a b"}, "is not a valid NATS name"),
    ({"stream": "ORD>"}, "is not a valid NATS name"),
    ({"group": DROP}, "set exactly one of the options group"),
    ({"consumer": "c"}, "set exactly one of the options group"),
    ({"group": "g*"}, "option group='g*' is not a valid NATS name"),
    ({"group": DROP, "consumer": "c/d"}, "option consumer='c/d' is not a valid NATS name"),
    ({"groupType": "dynamic"}, "option groupType='dynamic' is not valid; use auto, static"),
    ({"members": ","}, "option members is empty"),
    ({"consumerLayout": "per-member"}, "consumerLayout='per-member' is not valid"),
    ({"startingPosition": "sequence:0"}, "startingPosition='sequence:0' is not valid"),
    ({"group": DROP, "consumer": "c", "startingPosition": "latest"}, "does not apply"),
    ({"user": "u", "passwordFile": "/nonexistent/pw"}, "passwordFile /nonexistent/pw cannot be"),
    ({"tokenFile": "/nonexistent/tk"}, "tokenFile /nonexistent/tk cannot be read"),
    ({"members": "m1,m 2"}, "option members='m 2' is not a valid NATS name"),
    ({"priorityGroup": "PCG"}, "option priorityGroup does not apply to group reads; drop it"),
    ({"minPending": "5"}, "option minPending does not apply to group reads; drop it"),
    ({"minAckPending": "5"}, "option minAckPending does not apply to group reads; drop it"),
    ({"priority": "1"}, "option priority does not apply to group reads; drop it"),
    ({"numPartitions": "2"}, "option numPartitions does not apply to group reads; drop it"),
    ({"group": DROP, "consumer": "c", "groupType": "static"}, "groupType does not apply"),
    ({"group": DROP, "consumer": "c", "members": "m1"}, "members does not apply"),
    ({"group": DROP, "consumer": "c", "ackWait": "5s"}, "ackWait does not apply"),
    ({"group": DROP, "consumer": "c", "maxAckPending": "9"}, "maxAckPending does not apply"),
    ({"group": DROP, "consumer": "c", "minPending": "many"}, "minPending='many' is not a whole"),
    ({"group": DROP, "consumer": "c", "minAckPending": "0"}, "minAckPending=0 is out of range"),
    ({"group": DROP, "consumer": "c", "priority": "10"}, "priority=10 is out of range; use a"),
    ({"group": DROP, "consumer": "c", "priority": "-1"}, "priority=-1 is out of range"),
    ({"group": DROP, "consumer": "c", "numPartitions": "0"}, "numPartitions=0 is out of range"),
    ({"group": DROP, "consumer": "c", "numPartitions": "1025"}, "numPartitions=1025 is out"),
    ({"group": DROP, "consumer": "c", "numPartitions": "2.5"}, "is not a whole number"),
    ({"ackWait": "soon"}, "option ackWait='soon' is not a duration; use e.g. 500ms"),
    ({"ackWait": "0s"}, "option ackWait must be positive"),
    ({"ackWait": "-3s"}, "option ackWait='-3s' is not a duration"),
    ({"ackWait": "5 days"}, "is not a duration"),
    ({"ackWait": "30 parsecs"}, "(or as Spark writes intervals: 30 seconds, 1 minute)"),
    ({"ackWait": "1 2"}, "is not a duration"),
    ({"maxAckPending": "0"}, "option maxAckPending=0 is out of range; use a number at least 1"),
    ({"maxAckPending": "1e3"}, "option maxAckPending='1e3' is not a whole number"),
    ({"maxMessagesPerTrigger": "0"}, "option maxMessagesPerTrigger=0 is out of range"),
    ({"maxMessagesPerTrigger": "lots"}, "is not a whole number"),
    ({"maxMessagesPerPartition": "-5"}, "option maxMessagesPerPartition=-5 is out of range"),
    ({"maxTasksPerBatch": "0"}, "option maxTasksPerBatch=0 is out of range"),
    ({"minMessagesPerTrigger": "none"}, "option minMessagesPerTrigger='none' is not a whole"),
    (
        {"minMessagesPerTrigger": "50", "maxMessagesPerTrigger": "10"},
        "minMessagesPerTrigger=50 is above maxMessagesPerTrigger=10",
    ),
    ({"maxTriggerDelay": "5m"}, "maxTriggerDelay applies only with minMessagesPerTrigger"),
    ({"minMessagesPerTrigger": "5", "maxTriggerDelay": "soon"}, "is not a duration"),
    ({"fetchBatchSize": "0"}, "option fetchBatchSize=0 is out of range; use a number from 1"),
    ({"fetchBatchSize": "100001"}, "option fetchBatchSize=100001 is out of range"),
    ({"fetchTimeout": "0ms"}, "option fetchTimeout must be positive"),
    ({"fetchTimeout": "1 week"}, "option fetchTimeout='1 week' is not a duration"),
    ({"includeHeaders": "maybe"}, "option includeHeaders='maybe' is not a boolean; use true"),
    ({"failOnDataLoss": "2"}, "option failOnDataLoss='2' is not a boolean"),
    # Spark's Kafka options name the ones of ours that do their job.
    ({"kafka.bootstrap.servers": "h:9092"}, "unknown option 'kafka.bootstrap.servers' (a Kafka"),
    ({"kafka.bootstrap.servers": "h:9092"}, "option); use servers"),
    ({"subscribe": "orders"}, "unknown option 'subscribe' (a Kafka option); use stream, group or"),
    ({"startingOffsets": "earliest"}, "(a Kafka option); use startingPosition"),
    ({"maxOffsetsPerTrigger": "9"}, "(a Kafka option); use maxMessagesPerTrigger"),
    ({"minOffsetsPerTrigger": "9"}, "(a Kafka option); use minMessagesPerTrigger"),
    ({"kafka.group.id": "g"}, "(a Kafka option); use group or consumer"),
    ({"kafka.sasl.mechanism": "PLAIN"}, "(a Kafka option); use creds, user, token or tlsCaCert"),
    ({"ledgerBucket": "my.ledger"}, "option ledgerBucket='my.ledger' is not a valid NATS name"),
    ({"password": "p"}, "password given without user; set user as well"),
    ({"user": "u", "token": "t"}, "both token and user given; use one way to authenticate"),
    ({"creds": MISSING}, f"creds file {MISSING} does not exist; check the path"),
    ({"nkeySeed": MISSING}, f"nkeySeed file {MISSING} does not exist"),
    ({"tlsCaCert": MISSING}, f"tlsCaCert file {MISSING} does not exist"),
    ({"tlsCert": __file__}, "tlsCert and tlsKey go together"),
    ({"tlsKey": __file__}, "tlsCert and tlsKey go together"),
    ({"tlsCert": MISSING, "tlsKey": MISSING}, f"tlsCert file {MISSING} does not exist"),
    ({"connectTimeout": "0s"}, "option connectTimeout must be positive"),
    ({"connectTimeout": "quick"}, "option connectTimeout='quick' is not a duration"),
    ({"retryTimeout": "0"}, "option retryTimeout must be positive"),
    ({"retryTimeout": "forever"}, "option retryTimeout='forever' is not a duration"),
    ({"domain": "hub", "apiPrefix": "JS.A.API"}, "options domain (--js-domain) and apiPrefix"),
    ({"domain": "a hub"}, "option domain (--js-domain) 'a hub' is not a JetStream domain"),
    ({"apiPrefix": "JS.*"}, "option apiPrefix (--js-api-prefix) 'JS.*' is not a subject"),
    ({"inboxPrefix": "_INBOX_etl."}, "option inboxPrefix (--inbox-prefix) '_INBOX_etl.' is not"),
]


# (overrides, text): the same error from every format that takes the option
PACING_CASES: list[tuple[Overrides, str]] = [
    ({"maxTriggerDelay": "1m"}, "maxTriggerDelay applies only with minMessagesPerTrigger"),
    (
        {"minMessagesPerTrigger": "10", "maxMessagesPerTrigger": "5"},
        "minMessagesPerTrigger=10 is above maxMessagesPerTrigger=5",
    ),
    ({"minMessagesPerTrigger": "0"}, "minMessagesPerTrigger=0 is out of range"),
    ({"minMessagesPerTrigger": "5", "maxTriggerDelay": "soon"}, "is not a duration"),
]
ROUTING_CASES: list[tuple[Overrides, str]] = [
    ({"domain": "hub", "apiPrefix": "JS.A.API"}, "options domain (--js-domain) and apiPrefix"),
    ({"domain": "my hub"}, "option domain (--js-domain) 'my hub' is not a JetStream domain"),
    ({"domain": "hub.eu"}, "'hub.eu' is not a JetStream domain"),
    ({"domain": "h*"}, "'h*' is not a JetStream domain"),
    ({"apiPrefix": "JS.*.API"}, "option apiPrefix (--js-api-prefix) 'JS.*.API' is not"),
    ({"apiPrefix": "JS A"}, "'JS A' is not a subject prefix"),
    ({"apiPrefix": "JS..API"}, "'JS..API' is not a subject prefix"),
    ({"apiPrefix": "JS.>"}, "'JS.>' is not a subject prefix"),
    ({"inboxPrefix": "_INBOX_etl."}, "option inboxPrefix (--inbox-prefix) '_INBOX_etl.'"),
    ({"inboxPrefix": "_INBOX etl"}, "is not an inbox prefix"),
    ({"inboxPrefix": "_INBOX.>"}, "is not an inbox prefix"),
]
# (format, overrides, text) for the whole-stream reads
READ_CASES: list[tuple[str, Overrides, str]] = [
    ("nats", {"group": "g"}, "unknown option 'group'; known options: servers"),
    ("nats", {"stream": ""}, "option stream is required"),
    ("nats", {"startingPosition": "sequence:0"}, "startingPosition='sequence:0' is not valid"),
    ("nats", {"endingPosition": "time:yesterday"}, "endingPosition='time:yesterday' is not"),
    ("nats", {"endingPosition": "earliest"}, "endingPosition=earliest is not valid"),
    (
        "nats",
        {"startingPosition": "sequence:10", "endingPosition": "sequence:9"},
        "endingPosition='sequence:9' is before startingPosition='sequence:10'",
    ),
    (
        "nats",
        {"startingPosition": "time:2026-01-02", "endingPosition": "time:2026-01-01T10:00"},
        "is before startingPosition",
    ),
    ("nats streaming", {"endingPosition": "latest"}, "endingPosition does not apply to streaming"),
    ("nats", {"maxMessagesPerTrigger": "5"}, "maxMessagesPerTrigger does not apply to batch"),
    ("nats", {"minMessagesPerTrigger": "5"}, "minMessagesPerTrigger does not apply to batch"),
    ("nats", {"subjects": "a b"}, "subjects has 'a b', which is not a filter subject"),
    ("nats", {"subjects": "a.>.b"}, "not a filter subject"),
    ("nats", {"readPath": "fast"}, "readPath='fast' is not valid; use auto, consumer, direct"),
    ("nats", {"numPartitions": "0"}, "numPartitions=0 is out of range"),
    ("nats", {"includeHeaders": "maybe"}, "includeHeaders='maybe' is not a boolean"),
    ("nats", {"subscribe": "orders"}, "'subscribe' (a Kafka option); use stream or subjects"),
    ("nats", {"endingOffsets": "latest"}, "(a Kafka option); use endingPosition"),
    ("sink", {"topic": "orders"}, "'topic' (a Kafka option); use subject or stream"),
]
BAD_INPUT: list[tuple[str, Overrides, str]] = [
    *(("nats-pcg", overrides, text) for overrides, text in GROUP_CASES),
    *(
        ("nats-pcg", {"startingPosition": text}, f"startingPosition='{text}' is not valid; use")
        for text in ("first", "sequence:x", "time:yesterday", "latest:1")
    ),
    *((f, o, text) for o, text in PACING_CASES for f in ("nats-pcg", "nats streaming")),
    *((f, o, text) for o, text in ROUTING_CASES for f in ("nats-pcg", "nats streaming", "sink")),
    *READ_CASES,
]


@pytest.mark.parametrize(("format_name", "overrides", "expected"), BAD_INPUT)
def test_bad_input_is_one_line_naming_the_problem(
    format_name: str, overrides: Overrides, expected: str
) -> None:
    base, parse = PARSERS[format_name]
    merged = {key: value for key, value in {**base, **overrides}.items() if value is not None}
    with pytest.raises(ConfigurationError) as caught:
        parse(merged)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message and len(message) < 600


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30 seconds", 30.0),
        ("1 minute", 60.0),
        ("500 milliseconds", 0.5),
        ("2s", 2.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("1 minute 30 seconds", 90.0),
        ("1m30s", 90.0),
        ("interval 2 minutes", 120.0),
        ("10 secs", 10.0),
        ("7", 7.0),
    ],
)
def test_durations_are_also_spark_interval_strings(text: str, seconds: float) -> None:
    """As Spark writes trigger intervals and watermarks, wherever an option is a duration."""
    assert parse_options({**BASE, "ackWait": text}).ack_wait == seconds
    assert parse_options({**BASE, "fetchTimeout": text}).fetch_timeout == seconds
    assert (
        parse_read_options({**STREAM, "connectTimeout": text}, False).connection.connect_timeout
        == seconds
    )
    assert parse_sink_options({**SINK, "publishTimeout": text}).publish_timeout == seconds


def test_every_group_source_option_has_a_bad_case() -> None:
    covered = {key for overrides, _ in GROUP_CASES for key in overrides}
    assert set(KNOWN_OPTIONS) - covered == set()


def test_option_names_are_case_insensitive_and_secrets_stay_out_of_errors() -> None:
    parsed = parse_options({"SERVERS": "h:1", "Stream": "S", "GROUP": "g", "fetchbatchsize": "7"})
    assert parsed.fetch_batch_size == 7 and parsed.connection.servers == ("nats://h:1",)
    with pytest.raises(ConfigurationError) as caught:
        parse_options({**BASE, "Password": "s3cr3t-Vx91"})
    assert "s3cr3t-Vx91" not in str(caught.value)
