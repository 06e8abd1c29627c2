"""Raw `$JS.API` requests, for what nats-py does not do (priority fields, unpin) or does lossily.

nats-py's `add_consumer` drops `priority_*` fields, so every consumer call goes through here.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from nats_spark.connection import DEFAULT_PREFIX, no_jetstream
from nats_spark.errors import (
    JetStreamApiError,
    NatsSparkError,
    NotFound,
    publish_denied,
)
from nats_spark.jetstream.replies import NANOS, ConsumerInfo, StreamInfo
from nats_spark.jetstream.retry import Unavailable, retrying
from nats_spark.refusals import Refusals


def to_nanos(seconds: float) -> int:
    return int(round(seconds * NANOS))


@dataclass(frozen=True)
class StoredMessage:
    """A message read from a stream by sequence."""

    subject: str
    seq: int
    data: bytes
    headers: bytes | None
    time: str


class JetStreamApi:
    """JetStream API requests answering with decoded JSON, errors raised as `JetStreamApiError`.

    Requests that fail only because JetStream cannot answer right now (no leader) are retried
    for up to `retry_timeout` seconds. `denied` is the connection's refused publishes: a request
    the user may not send fails as soon as the server refuses it, and says so.
    `unreachable(subject)` says why nobody answers (no JetStream, a wrong domain or prefix).
    """

    def __init__(
        self,
        nc: NATS,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = 5.0,
        retry_timeout: float = 60.0,
        denied: Refusals | None = None,
        unreachable: Callable[[str], str] | None = None,
    ) -> None:
        self.nc = nc
        self.prefix = prefix
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.denied = denied if denied is not None else Refusals()
        self.unreachable = unreachable or no_jetstream

    async def request(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        full = f"{self.prefix}.{subject}"
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        try:
            return await retrying(
                lambda: self._request_once(full, payload),
                f"JetStream request {full}",
                self.retry_timeout,
                connection=self.nc,
            )
        except Unavailable as error:
            if self.prefix == DEFAULT_PREFIX:
                raise
            # Interest without an answer: a domain or import that exists but does not serve.
            raise Unavailable(f"{error}; or: {self.unreachable(full)}") from None

    async def _request_once(self, full: str, payload: bytes) -> dict[str, Any]:
        try:
            reply = await self._answer(full, payload)
        except NoRespondersError:
            raise NatsSparkError(self.unreachable(full)) from None
        answer = json.loads(reply.data)
        error = answer.get("error")
        if error:
            cls = NotFound if error.get("code") == 404 else JetStreamApiError
            raise cls(
                full, error.get("code", 0), error.get("err_code", 0), error.get("description", "")
            )
        return answer

    async def _answer(self, full: str, payload: bytes) -> Msg:
        """The reply to the request; `PermissionDenied` as soon as the server refuses its
        publish, instead of at its timeout."""
        refused = self.denied.watch(full)
        answer = asyncio.ensure_future(self.nc.request(full, payload, timeout=self.timeout))
        try:
            await asyncio.wait((answer, refused), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            answer.cancel()
            raise
        finally:
            self.denied.unwatch(full, refused)
        if not answer.done():
            answer.cancel()
            raise publish_denied(full)
        return answer.result()

    async def account_info(self) -> dict[str, Any]:
        return await self.request("INFO")

    async def stream_info(self, stream: str) -> StreamInfo:
        return StreamInfo(await self.request(f"STREAM.INFO.{stream}"))

    async def stream_subjects(self, stream: str, subjects_filter: str) -> dict[str, int]:
        """The subjects of `stream` that match `subjects_filter`, each with its message count,
        from the stream's subject index (all pages): complete, unlike a KV key listing, which
        a consumer snapshot can end early (nats.py #842)."""
        subjects: dict[str, int] = {}
        while True:
            body = {"subjects_filter": subjects_filter, "offset": len(subjects)}
            info = await self.request(f"STREAM.INFO.{stream}", body)
            page = (info.get("state") or {}).get("subjects") or {}
            subjects.update(page)
            if not page or len(subjects) >= info.get("total", 0):
                return subjects

    async def kv_keys(self, bucket: str, pattern: str) -> list[str]:
        """The keys of KV `bucket` that match `pattern` (a subject pattern over its keys), from
        its stream's subject index; a deleted key's marker still has its subject."""
        prefix = f"$KV.{bucket}."
        subjects = await self.stream_subjects(f"KV_{bucket}", prefix + pattern)
        return [subject[len(prefix) :] for subject in subjects]

    async def create_stream(self, config: dict[str, Any]) -> dict[str, Any]:
        return await self.request(f"STREAM.CREATE.{config['name']}", config)

    async def update_stream(self, config: dict[str, Any]) -> dict[str, Any]:
        return await self.request(f"STREAM.UPDATE.{config['name']}", config)

    async def delete_stream(self, stream: str) -> None:
        await self.request(f"STREAM.DELETE.{stream}")

    async def _all_pages(
        self, subject: str, field: str, body: dict[str, Any] | None = None
    ) -> list[Any]:
        """The items under `field` of every page of a paged request (names or infos). A page
        also counts the items a cluster could not report (`missing`), so that the next one
        starts after them."""
        items: list[Any] = []
        offset = 0
        while True:
            page = await self.request(subject, {**(body or {}), "offset": offset})
            found = page.get(field) or []
            items += found
            offset += len(found) + len(page.get("missing") or [])
            if not found or offset >= page.get("total", 0):
                return items

    async def stream_names(self, subject: str | None = None) -> list[str]:
        return await self._all_pages(
            "STREAM.NAMES", "streams", {"subject": subject} if subject else None
        )

    async def stream_configs(self) -> list[dict[str, Any]]:
        """The config of every stream of the account (`STREAM.LIST`, all pages)."""
        return [info["config"] for info in await self._all_pages("STREAM.LIST", "streams")]

    async def create_consumer(
        self, stream: str, name: str, config: dict[str, Any], action: str = "create"
    ) -> ConsumerInfo:
        """Create (`action="create"`), update (`"update"`) or create-or-update (`""`) a consumer."""
        wire = {**config, "name": name}
        if config.get("durable_name"):
            wire["durable_name"] = name
        body = {"stream_name": stream, "config": wire, "action": action}
        return ConsumerInfo(await self.request(f"CONSUMER.CREATE.{stream}.{name}", body))

    async def consumer_info(self, stream: str, consumer: str) -> ConsumerInfo:
        return ConsumerInfo(await self.request(f"CONSUMER.INFO.{stream}.{consumer}"))

    async def consumer_infos(self, stream: str) -> dict[str, ConsumerInfo]:
        """The infos of `stream`'s consumers by name, from its `CONSUMER.LIST` pages (the server
        answers up to 256 a page). One the server could not report (offline, or on a cluster
        node that did not answer in time) is left out, as is one created between pages."""
        listed = await self._all_pages(f"CONSUMER.LIST.{stream}", "consumers")
        return {info["name"]: ConsumerInfo(info) for info in listed}

    async def delete_consumer(self, stream: str, consumer: str) -> None:
        await self.request(f"CONSUMER.DELETE.{stream}.{consumer}")

    async def consumer_names(self, stream: str) -> list[str]:
        return await self._all_pages(f"CONSUMER.NAMES.{stream}", "consumers")

    async def unpin(self, stream: str, consumer: str, group: str) -> None:
        """Drop the current pin of `group`, so the server pins the next waiting pull."""
        await self.request(f"CONSUMER.UNPIN.{stream}.{consumer}", {"group": group})

    async def last_message(self, stream: str, subject: str) -> StoredMessage | None:
        """The newest message of `stream` on `subject` (None: there is none), with the time the
        stream stored it: a KV key's last write by the server's clock."""
        try:
            answer = await self.request(f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject})
        except NotFound:
            return None
        return _stored(answer["message"])

    async def get_message(
        self,
        stream: str,
        seq: int,
        next_by_subject: str | None = None,
        start_time: str | None = None,
    ) -> StoredMessage:
        """The message at `seq`; `NotFound` when it was deleted (retention, purge). With
        `next_by_subject`: the first message at or after `seq` whose subject matches it. With
        `start_time` (RFC 3339) instead of `seq` (0): from the first message stored at or after
        that time."""
        body: dict[str, Any] = {"start_time": start_time} if start_time else {"seq": seq}
        if next_by_subject is not None:
            body["next_by_subj"] = next_by_subject
        answer = await self.request(f"STREAM.MSG.GET.{stream}", body)
        return _stored(answer["message"])


def _stored(msg: dict[str, Any]) -> StoredMessage:
    """A `STREAM.MSG.GET` answer's message."""
    return StoredMessage(
        subject=msg["subject"],
        seq=msg["seq"],
        data=base64.b64decode(msg.get("data") or ""),
        headers=base64.b64decode(msg["hdrs"]) if msg.get("hdrs") else None,
        time=msg["time"],
    )
