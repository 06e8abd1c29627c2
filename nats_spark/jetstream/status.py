"""JetStream status messages: the one parser of the status line a server sends in place of a
message (`NATS/1.0 404 No Messages`), which maps every (code, description) to a `StatusKind`.

The texts are nats-server's (consumer.go for pulls, stream.go for direct gets, jetstream.go at
shutdown); what each kind means to a reader is decided by the reader (`jetstream/pull.py`, the
direct get of `range_read.py`, the publisher).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class StatusKind(Enum):
    """What a status says, whatever its exact wording."""

    HEARTBEAT = "idle heartbeat"  # 100 Idle Heartbeat: the request is alive, nothing to deliver
    FLOW_CONTROL = "flow control"  # 100 FlowControl Request (push consumers)
    END_OF_BATCH = "end of batch"  # 204 EOB: a batch direct get answered all it will
    NO_MESSAGES = "no messages"  # 404 No Messages (no-wait pull), No Results / Message Not Found
    TIMEOUT = "request timeout"  # 408 Request Timeout / Interest Expired / Requests Pending
    BATCH_COMPLETED = "batch completed"  # 409: the batch was served in full, max bytes to spare
    MAX_BYTES = "max bytes"  # 409 Message Size Exceeds MaxBytes: the next message does not fit
    LEADERSHIP_CHANGE = "leadership change"  # 409: the consumer moved to another server
    SERVER_SHUTDOWN = "server shutdown"  # 409: the server serving the request stopped
    MAX_WAITING = "max waiting"  # 409 Exceeded MaxWaiting: too many requests wait already
    INTERRUPTED = "interrupted"  # any other 409: the server ended the request, pull again
    CONSUMER_DELETED = "consumer deleted"  # 409
    PUSH_CONSUMER = "push consumer"  # 409 Consumer is push based
    BATCH_LIMIT = "batch limit"  # 409 Exceeded MaxRequestBatch of <n>
    EXPIRES_LIMIT = "expires limit"  # 409 Exceeded MaxRequestExpires of <duration>
    BYTES_LIMIT = "bytes limit"  # 409 Exceeded MaxRequestMaxBytes of <n>
    PIN_MISMATCH = "pin id mismatch"  # 423 Nats-Pin-Id mismatch / Nats-Wrong-Pin-Id
    PRIORITY_REJECTED = "priority rejected"  # 400 Bad Request - ... Priority ...
    BAD_REQUEST = "bad request"  # 400; a direct get's 408 Empty / Malformed / Bad Request
    NO_RESPONDERS = "no responders"  # 503: nothing listens on the subject (no consumer/stream)
    OTHER = "other"  # anything else: 412 Required Api Level, 429, 500, ...


# (code, text the description contains once lowercased and without spaces, kind): the first row
# that matches wins; an empty text matches any description of that code.
_KINDS: tuple[tuple[int, str, StatusKind], ...] = (
    (100, "flowcontrol", StatusKind.FLOW_CONTROL),
    (100, "", StatusKind.HEARTBEAT),
    (204, "", StatusKind.END_OF_BATCH),
    # Every priority-group rejection names it: "Priority Group missing", "Invalid Priority Group",
    # "Not a Overflow Priority consumer", "Priority must be between 0 and 9", ...
    (400, "priority", StatusKind.PRIORITY_REJECTED),
    (400, "", StatusKind.BAD_REQUEST),
    (404, "", StatusKind.NO_MESSAGES),
    (408, "emptyrequest", StatusKind.BAD_REQUEST),
    (408, "malformedrequest", StatusKind.BAD_REQUEST),
    (408, "badrequest", StatusKind.BAD_REQUEST),
    (408, "", StatusKind.TIMEOUT),
    (409, "batchcompleted", StatusKind.BATCH_COMPLETED),
    (409, "consumerdeleted", StatusKind.CONSUMER_DELETED),
    (409, "consumerispushbased", StatusKind.PUSH_CONSUMER),
    (409, "exceededmaxrequestbatch", StatusKind.BATCH_LIMIT),
    (409, "exceededmaxrequestexpires", StatusKind.EXPIRES_LIMIT),
    (409, "exceededmaxrequestmaxbytes", StatusKind.BYTES_LIMIT),
    (409, "maxbytes", StatusKind.MAX_BYTES),  # after the request limit that names max bytes too
    (409, "leadershipchange", StatusKind.LEADERSHIP_CHANGE),
    (409, "servershutdown", StatusKind.SERVER_SHUTDOWN),
    (409, "exceededmaxwaiting", StatusKind.MAX_WAITING),
    (409, "", StatusKind.INTERRUPTED),
    (423, "", StatusKind.PIN_MISMATCH),
    (503, "", StatusKind.NO_RESPONDERS),
)


def classify(code: int, description: str) -> StatusKind:
    """The kind of status `code` with `description`."""
    text = description.lower().replace(" ", "")
    for known, contains, kind in _KINDS:
        if known == code and contains in text:
            return kind
    return StatusKind.OTHER


@dataclass(frozen=True)
class Status:
    """A status line as the server sent it, with its kind."""

    code: int
    description: str
    kind: StatusKind

    @property
    def line(self) -> str:
        return f"{self.code} {self.description}".rstrip()

    @property
    def ends_request(self) -> bool:
        """Whether the request it answers is over (heartbeats and flow control keep it open)."""
        return self.kind is not StatusKind.HEARTBEAT and self.kind is not StatusKind.FLOW_CONTROL


def parse_status(headers: bytes) -> Status | None:
    """The status a raw header block opens with (`NATS/1.0 404 No Messages\\r\\n...`), or None
    for plain headers (`NATS/1.0\\r\\n...`)."""
    end = headers.find(b"\r\n")
    line = headers if end < 0 else headers[:end]
    _, _, status = line.partition(b" ")
    code, _, description = status.partition(b" ")
    if not code.isdigit():
        return None
    text = description.strip().decode(errors="replace")
    return Status(int(code), text, classify(int(code), text))


def status_of(data: bytes, headers: bytes | None) -> Status | None:
    """The status a message without a reply subject is, or None: as in nats.go's `checkMsg`, one
    with a payload or without headers is a message."""
    if data or not headers:
        return None
    return parse_status(headers)
