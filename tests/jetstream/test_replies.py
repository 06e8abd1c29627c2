"""Typed views of JetStream API replies and the API's error codes, pure."""

from __future__ import annotations

import pytest

from nats_spark.errors import TRANSIENT_ERROR_CODES, ErrorCode, JetStreamApiError, PullError
from nats_spark.jetstream.replies import NANOS, ConsumerInfo, StreamInfo

pytestmark = pytest.mark.unit

CONSUMER = {
    "name": "g-m1",
    "config": {"ack_wait": 2 * NANOS, "max_ack_pending": 1, "priority_groups": ["pcg"]},
    "delivered": {"consumer_seq": 9, "stream_seq": 42, "last_active": "2026-11-24T01:00:00Z"},
    "ack_floor": {"consumer_seq": 7, "stream_seq": 40},
    "num_ack_pending": 2,
    "num_pending": 100,
    "num_waiting": 1,
    "priority_groups": [{"group": "other"}, {"group": "pcg", "pinned_client_id": "P1"}],
}


def test_consumer_info_view() -> None:
    info = ConsumerInfo(CONSUMER)
    assert (info.num_pending, info.num_ack_pending, info.num_waiting) == (100, 2, 1)
    assert (info.delivered_seq, info.ack_floor_seq) == (42, 40)
    assert info.last_active == "2026-11-24T01:00:00Z"
    assert (info.ack_wait, info.max_ack_pending) == (2.0, 1)
    assert info.pinned_id("pcg") == "P1" and info.pinned_id("other") is None
    assert info["name"] == "g-m1"  # still the reply as sent


@pytest.mark.parametrize(
    ("ack_floor", "delivered", "floor"),
    [
        # a consumer created to start at 31, as 2.11 and 2.12 report it (2.15: floor 30)
        ({"consumer_seq": 0, "stream_seq": 0}, {"consumer_seq": 0, "stream_seq": 30}, 30),
        ({"consumer_seq": 0, "stream_seq": 30}, {"consumer_seq": 0, "stream_seq": 30}, 30),
        # every delivery acked: nothing at or below the last delivered comes again
        ({"consumer_seq": 5, "stream_seq": 12}, {"consumer_seq": 5, "stream_seq": 12}, 12),
        # something pending: the floor as reported
        ({"consumer_seq": 3, "stream_seq": 0}, {"consumer_seq": 5, "stream_seq": 30}, 0),
    ],
    ids=["new-on-2.11", "new-on-2.15", "all-acked", "pending"],
)
def test_ack_floor_with_nothing_pending_is_the_last_delivered(
    ack_floor: dict, delivered: dict, floor: int
) -> None:
    info = ConsumerInfo({"ack_floor": ack_floor, "delivered": delivered})
    assert info.ack_floor_seq == floor


@pytest.mark.parametrize(
    ("ack_floor", "floor"),
    [
        # created to start at 31 on 2.11 or 2.12, 31 and 32 delivered, none acked
        ({"consumer_seq": 0, "stream_seq": 0}, 30),
        # 31 acked: the floor as reported
        ({"consumer_seq": 1, "stream_seq": 31}, 31),
    ],
    ids=["none-acked", "one-acked"],
)
def test_a_consumer_created_to_start_at_a_sequence_never_floors_below_it(
    ack_floor: dict, floor: int
) -> None:
    info = ConsumerInfo(
        {
            "config": {"deliver_policy": "by_start_sequence", "opt_start_seq": 31},
            "ack_floor": ack_floor,
            "delivered": {"consumer_seq": 2, "stream_seq": 32},
        }
    )
    assert info.ack_floor_seq == floor


def test_consumer_info_defaults_are_the_servers() -> None:
    info = ConsumerInfo({"config": {}})
    assert (info.num_pending, info.delivered_seq, info.last_active) == (0, 0, None)
    assert (info.ack_wait, info.max_ack_pending, info.pinned_id("pcg")) == (30.0, -1, None)


def test_stream_info_view() -> None:
    info = StreamInfo(
        {
            "config": {"num_replicas": 3, "allow_direct": True, "duplicate_window": 120 * NANOS},
            "state": {"first_seq": 5, "last_seq": 9},
        }
    )
    assert (info.first_seq, info.last_seq, info.replicas) == (5, 9, 3)
    assert info.allow_direct and info.duplicate_window == 120.0
    empty = StreamInfo({"config": {}, "state": {}})
    assert (empty.replicas, empty.allow_direct, empty.last_seq) == (1, False, 0)


def test_error_codes() -> None:
    missing = JetStreamApiError("$JS.API.STREAM.INFO.S", 404, 10059, "stream not found")
    assert missing.stream_missing and missing.err_code == ErrorCode.STREAM_NOT_FOUND
    assert ErrorCode.NOT_LEADER in TRANSIENT_ERROR_CODES
    assert ErrorCode.STREAM_NOT_FOUND not in TRANSIENT_ERROR_CODES


def test_consumer_gone() -> None:
    assert PullError(409, "Consumer Deleted").consumer_gone
    assert PullError(503, "No Responders").consumer_gone
    assert not PullError(409, "Exceeded MaxRequestBatch of 10").consumer_gone
