"""The status parser against the header blocks nats-server sends (consumer.go, stream.go,
jetstream.go): every line a reader here meets, each to its kind."""

from __future__ import annotations

import pytest

from nats_spark.jetstream.status import Status, StatusKind, parse_status, status_of

pytestmark = pytest.mark.unit

PENDING = b"Nats-Pending-Messages: 3\r\nNats-Pending-Bytes: 1024\r\n"

SERVER_LINES = [
    (b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 5\r\nNats-Last-Stream: 9\r\n\r\n",
     100, "Idle Heartbeat", StatusKind.HEARTBEAT),
    (b"NATS/1.0 100 FlowControl Request\r\n\r\n", 100, "FlowControl Request",
     StatusKind.FLOW_CONTROL),
    (b"NATS/1.0 204 EOB\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: 7\r\n\r\n", 204, "EOB",
     StatusKind.END_OF_BATCH),
    (b"NATS/1.0 204\r\n\r\n", 204, "", StatusKind.END_OF_BATCH),
    (b"NATS/1.0 400 Bad Request - Priority Group missing\r\n\r\n", 400,
     "Bad Request - Priority Group missing", StatusKind.PRIORITY_REJECTED),
    (b"NATS/1.0 400 Bad Request - Invalid Priority Group\r\n\r\n", 400,
     "Bad Request - Invalid Priority Group", StatusKind.PRIORITY_REJECTED),
    (b"NATS/1.0 400 Bad Request - Not a Overflow Priority consumer\r\n\r\n", 400,
     "Bad Request - Not a Overflow Priority consumer", StatusKind.PRIORITY_REJECTED),
    (b"NATS/1.0 400 Bad Request - Not a Pinned Client Priority consumer\r\n\r\n", 400,
     "Bad Request - Not a Pinned Client Priority consumer", StatusKind.PRIORITY_REJECTED),
    (b"NATS/1.0 400 Bad Request - Priority must be between 0 and 9\r\n\r\n", 400,
     "Bad Request - Priority must be between 0 and 9", StatusKind.PRIORITY_REJECTED),
    (b"NATS/1.0 400 Bad Request - idle heartbeat value too large\r\n\r\n", 400,
     "Bad Request - idle heartbeat value too large", StatusKind.BAD_REQUEST),
    (b"NATS/1.0 404 No Messages\r\n\r\n", 404, "No Messages", StatusKind.NO_MESSAGES),
    (b"NATS/1.0 404 No Results\r\n\r\n", 404, "No Results", StatusKind.NO_MESSAGES),
    (b"NATS/1.0 404 Message Not Found\r\n\r\n", 404, "Message Not Found",
     StatusKind.NO_MESSAGES),
    (b"NATS/1.0 408 Request Timeout\r\n" + PENDING + b"\r\n", 408, "Request Timeout",
     StatusKind.TIMEOUT),
    (b"NATS/1.0 408 Interest Expired\r\n" + PENDING + b"\r\n", 408, "Interest Expired",
     StatusKind.TIMEOUT),
    (b"NATS/1.0 408 Requests Pending\r\n\r\n", 408, "Requests Pending", StatusKind.TIMEOUT),
    (b"NATS/1.0 408 Empty Request\r\n\r\n", 408, "Empty Request", StatusKind.BAD_REQUEST),
    (b"NATS/1.0 408 Malformed Request\r\n\r\n", 408, "Malformed Request",
     StatusKind.BAD_REQUEST),
    (b"NATS/1.0 408 Bad Request\r\n\r\n", 408, "Bad Request", StatusKind.BAD_REQUEST),
    (b"NATS/1.0 409 Batch Completed\r\n" + PENDING + b"\r\n", 409, "Batch Completed",
     StatusKind.BATCH_COMPLETED),
    (b"NATS/1.0 409 Message Size Exceeds MaxBytes\r\n" + PENDING + b"\r\n", 409,
     "Message Size Exceeds MaxBytes", StatusKind.MAX_BYTES),
    (b"NATS/1.0 409 Exceeded MaxRequestBatch of 10\r\n\r\n", 409,
     "Exceeded MaxRequestBatch of 10", StatusKind.BATCH_LIMIT),
    (b"NATS/1.0 409 Exceeded MaxRequestExpires of 1s\r\n\r\n", 409,
     "Exceeded MaxRequestExpires of 1s", StatusKind.EXPIRES_LIMIT),
    (b"NATS/1.0 409 Exceeded MaxRequestMaxBytes of 1024\r\n\r\n", 409,
     "Exceeded MaxRequestMaxBytes of 1024", StatusKind.BYTES_LIMIT),
    (b"NATS/1.0 409 Consumer Deleted\r\n\r\n", 409, "Consumer Deleted",
     StatusKind.CONSUMER_DELETED),
    (b"NATS/1.0 409 Consumer is push based\r\n\r\n", 409, "Consumer is push based",
     StatusKind.PUSH_CONSUMER),
    (b"NATS/1.0 409 Leadership Change\r\n\r\n", 409, "Leadership Change",
     StatusKind.LEADERSHIP_CHANGE),
    (b"NATS/1.0 409 Server Shutdown\r\n" + PENDING + b"\r\n", 409, "Server Shutdown",
     StatusKind.SERVER_SHUTDOWN),
    (b"NATS/1.0 409 Exceeded MaxWaiting\r\n\r\n", 409, "Exceeded MaxWaiting",
     StatusKind.MAX_WAITING),
    (b"NATS/1.0 409 Something New\r\n\r\n", 409, "Something New", StatusKind.INTERRUPTED),
    (b"NATS/1.0 412 Required Api Level\r\n\r\n", 412, "Required Api Level", StatusKind.OTHER),
    (b"NATS/1.0 423 Nats-Pin-Id mismatch\r\n\r\n", 423, "Nats-Pin-Id mismatch",
     StatusKind.PIN_MISMATCH),
    (b"NATS/1.0 423 Nats-Wrong-Pin-Id\r\n" + PENDING + b"\r\n", 423, "Nats-Wrong-Pin-Id",
     StatusKind.PIN_MISMATCH),
    (b"NATS/1.0 429 Too Many Requests\r\n\r\n", 429, "Too Many Requests", StatusKind.OTHER),
    (b"NATS/1.0 500 stream store failed\r\n\r\n", 500, "stream store failed", StatusKind.OTHER),
    (b"NATS/1.0 503\r\n\r\n", 503, "", StatusKind.NO_RESPONDERS),
    (b"NATS/1.0 503\r\nNats-Subject: S.a\r\n\r\n", 503, "", StatusKind.NO_RESPONDERS),
]  # fmt: skip


@pytest.mark.parametrize(("headers", "code", "description", "kind"), SERVER_LINES)
def test_every_server_status_line(
    headers: bytes, code: int, description: str, kind: StatusKind
) -> None:
    assert parse_status(headers) == Status(code, description, kind)
    assert status_of(b"", headers) == Status(code, description, kind)


@pytest.mark.parametrize(
    ("headers", "ends"),
    [
        (b"NATS/1.0 100 Idle Heartbeat\r\n\r\n", False),
        (b"NATS/1.0 100 FlowControl Request\r\n\r\n", False),
        (b"NATS/1.0 408 Request Timeout\r\n\r\n", True),
        (b"NATS/1.0 409 Batch Completed\r\n\r\n", True),
    ],
)
def test_only_heartbeats_and_flow_control_keep_a_request_open(headers: bytes, ends: bool) -> None:
    status = parse_status(headers)
    assert status is not None and status.ends_request is ends


def test_line_is_code_and_description() -> None:
    assert Status(409, "Leadership Change", StatusKind.LEADERSHIP_CHANGE).line == (
        "409 Leadership Change"
    )
    assert Status(503, "", StatusKind.NO_RESPONDERS).line == "503"


@pytest.mark.parametrize(
    ("data", "headers"),
    [
        (b"", None),  # an empty message
        (b"", b""),
        (b"", b"NATS/1.0\r\nStatus: 404\r\n\r\n"),  # plain headers that name a status
        (b"", b"NATS/1.0\r\nNats-Pin-Id: abc\r\n\r\n"),
        (b"x", b"NATS/1.0 404 No Messages\r\n\r\n"),  # a payload: a message, whatever it says
    ],
)
def test_messages_are_not_statuses(data: bytes, headers: bytes | None) -> None:
    assert status_of(data, headers) is None
