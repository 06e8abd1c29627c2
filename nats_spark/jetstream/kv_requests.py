"""A KV bucket's get, create, update and put as plain JetStream requests.

nats-py's `KeyValue` spends most of a call's CPU around the request: its `request` makes a
token from random bytes, builds a `Msg` of the reply and parses its headers, waits in
`wait_for`; its KV layer builds a `PubAck` or a `RawStreamMsg` dataclass field by field and
parses stored headers with the `email` package. These publish the same requests to the same
subjects (with nats-py's `publish`, whose checks and buffering they keep), take the replies raw
from one subscription of the connection (`RoutedRequests`), and read only the numbers they need
from them, with nats-py's semantics and errors:

- a write is published to `$KV.<bucket>.<key>` (behind a domain or an imported API:
  `<API prefix>.$KV.<bucket>.<key>`, `kv_write_prefix`), a compare-and-set one with
  `Nats-Expected-Last-Subject-Sequence`; the PubAck's `seq` is the key's revision. A wrong last
  sequence raises `KeyWrongLastSequenceError`, any other refusal the `APIError` nats-py raises,
  no responders `NoStreamResponseError`.
- `create` writes on revision 0; when that fails because the key's last message is a delete or
  purge marker, it writes again on the marker's revision, as nats-py does.
- a get is `STREAM.MSG.GET` of the subject's last message, from the stream's leader (nats-py
  asks for a direct get, which any replica may answer, only when the stream allows direct gets;
  the ledger's bucket does not). A missing key and a marker raise `KeyNotFoundError` (a marker's
  with its entry and operation, as nats-py's `get` does); no responders `ServiceUnavailableError`.
- no reply within the timeout raises nats-py's `TimeoutError`, as its `request` does; a
  request the user may not publish fails as soon as the server reports it (`PermissionDenied`,
  from the connection's `Refusals`), instead of waiting out its timeout and then its retries.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from base64 import b64decode

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import Header
from nats.js.errors import (
    APIError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue

from nats_spark.connection import DEFAULT_PREFIX
from nats_spark.errors import publish_denied
from nats_spark.jetstream.status import StatusKind, status_of
from nats_spark.nats_py import route_raw
from nats_spark.refusals import Refusals

# JSStreamWrongLastSequenceErrF and JSStreamWrongLastSequenceConstantErr
WRONG_LAST_SEQUENCE_CODES = (10071, 10164)
_MARKERS = (b"DEL", b"PURGE")  # `KV-Operation` of a delete and of a purge
_OPERATION = b"kv-operation"
_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")


def kv_write_prefix(api_prefix: str) -> str:
    """What precedes `$KV.<bucket>.<key>` in a write's subject: nothing on the default API; the
    API prefix and a dot behind a domain or an imported API, whose bucket a plain `$KV` publish
    does not reach (as nats.go's KV does it)."""
    return "" if api_prefix == DEFAULT_PREFIX else f"{api_prefix}."


class RoutedRequests:
    """Requests on one connection whose replies come to one subscription of it (`<inbox>.*`,
    made at the first request), handed raw to the request that waits for each."""

    def __init__(self, nc: NATS, denied: Refusals) -> None:
        self.nc = nc
        self._prefix = f"{nc.new_inbox()}."
        self._numbers = itertools.count()
        # By reply subject: the request's answer to come, and its subject.
        self._waiting: dict[bytes, tuple[asyncio.Future[bytes], str]] = {}
        self._subscription: Subscription | None = None
        self._subscribing = asyncio.Lock()
        denied.listen(self._refused)

    async def request(
        self, subject: str, payload: bytes, timeout: float, headers: dict[str, str] | None = None
    ) -> bytes:
        """The reply's payload; `NoRespondersError` when nothing listens on `subject`."""
        if self._subscription is None:
            await self._subscribe()
        reply = f"{self._prefix}{next(self._numbers)}"
        key = reply.encode()
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        self._waiting[key] = answered, subject
        # A timer instead of `wait_for`, whose waiter costs the loop a turn per reply.
        expiry = loop.call_later(timeout, _expire, answered)
        try:
            await self.nc.publish(subject, payload, reply=reply, headers=headers)
            return await answered
        finally:
            expiry.cancel()
            self._waiting.pop(key, None)

    async def _subscribe(self) -> None:
        async with self._subscribing:
            if self._subscription is None:
                subscription = await self.nc.subscribe(f"{self._prefix}*")
                route_raw(self.nc, subscription, self._answered)
                self._subscription = subscription

    def _refused(self, refusal: str) -> None:
        """Fail at once the requests whose publish the server refused (`refusal`, lowercased)."""
        for answered, subject in self._waiting.values():
            if not answered.done() and f'"{subject.lower()}"' in refusal:
                answered.set_exception(publish_denied(subject))

    def _answered(self, subject: bytes, _: bytes, data: bytes, headers: bytes | None) -> None:
        waiting = self._waiting.pop(subject, None)
        if waiting is None or waiting[0].done():
            return  # its request gave up
        answered = waiting[0]
        status = status_of(data, headers)
        if status is not None and status.kind is StatusKind.NO_RESPONDERS:
            answered.set_exception(NoRespondersError())
        else:
            answered.set_result(data)


def _expire(answered: asyncio.Future[bytes]) -> None:
    if not answered.done():
        answered.set_exception(NatsTimeout())


class KvRequests:
    """Get, create, update and put on one bucket, each one request (`create` two on a marker)."""

    def __init__(
        self, requests: RoutedRequests, bucket: str, api_prefix: str, timeout: float
    ) -> None:
        self.requests = requests
        self.bucket = bucket
        self.timeout = timeout
        self._write_prefix = f"{kv_write_prefix(api_prefix)}$KV.{bucket}."
        self._get_subject = f"{api_prefix}.STREAM.MSG.GET.KV_{bucket}"

    async def get(self, key: str) -> KeyValue.Entry:
        entry, operation = await self._last(key)
        if operation is not None:
            raise KeyNotFoundError(entry, operation.decode())
        return entry

    async def create(self, key: str, value: bytes) -> int:
        try:
            return await self.update(key, value, 0)
        except KeyWrongLastSequenceError:
            marker, operation = await self._last(key)
            if operation is None:
                raise
            return await self.update(key, value, marker.revision or 0)

    async def update(self, key: str, value: bytes, last: int) -> int:
        return await self._write(key, value, {Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(last)})

    async def put(self, key: str, value: bytes) -> int:
        return await self._write(key, value, None)

    async def _write(self, key: str, value: bytes, headers: dict[str, str] | None) -> int:
        _check(key)
        try:
            reply = await self.requests.request(
                self._write_prefix + key, value, self.timeout, headers
            )
        except NoRespondersError:
            raise NoStreamResponseError from None
        answer = json.loads(reply)
        error = answer.get("error")
        if error is None:
            return int(answer["seq"])
        if error.get("err_code") in WRONG_LAST_SEQUENCE_CODES:
            raise KeyWrongLastSequenceError(description=error.get("description"))
        raise APIError.from_error(error)

    async def _last(self, key: str) -> tuple[KeyValue.Entry, bytes | None]:
        """The key's last message as an entry, and its operation when it is a marker."""
        _check(key)
        body = b'{"last_by_subj":"$KV.%s.%s"}' % (self.bucket.encode(), key.encode())
        try:
            reply = await self.requests.request(self._get_subject, body, self.timeout)
        except NoRespondersError:
            raise ServiceUnavailableError from None  # how nats-py reports it for API requests
        answer = json.loads(reply)
        error = answer.get("error")
        if error is not None:
            if error.get("code") == 404:
                raise KeyNotFoundError
            raise APIError.from_error(error)
        message = answer["message"]
        data = message.get("data")
        entry = KeyValue.Entry(
            self.bucket, key, b64decode(data) if data else None, message["seq"], None, None, None
        )
        headers = message.get("hdrs")
        return entry, _marker(b64decode(headers)) if headers else None


def _check(key: str) -> None:
    """Refuse a key that is no KV key (nats-py's `InvalidKeyError`), before it becomes a subject."""
    if not _KEY.fullmatch(key) or key[0] == "." or key[-1] == ".":
        raise InvalidKeyError(key)


def _marker(headers: bytes) -> bytes | None:
    """The `KV-Operation` of a stored message's headers (`NATS/1.0\\r\\nName: value\\r\\n...`)
    when it marks a delete or a purge; None for a value."""
    for line in headers.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == _OPERATION:
            operation = value.strip()
            return operation if operation in _MARKERS else None
    return None
