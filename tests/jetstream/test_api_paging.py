"""Listings that span pages of a JetStream API reply are read to their end."""

from __future__ import annotations

from typing import Any

import pytest

from nats_spark.jetstream.api import JetStreamApi
from nats_spark.loop import run_sync

pytestmark = pytest.mark.unit


class PagedSubjects(JetStreamApi):
    """A stream whose subject index answers `STREAM.INFO` `per_page` subjects at a time."""

    def __init__(self, subjects: dict[str, int], per_page: int) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.subjects, self.per_page = subjects, per_page
        self.asked: list[dict[str, Any]] = []

    async def request(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert subject == "STREAM.INFO.KV_b" and body is not None
        self.asked.append(body)
        names = sorted(self.subjects)[body["offset"] : body["offset"] + self.per_page]
        state = {"subjects": {name: self.subjects[name] for name in names}} if names else {}
        return {"state": state, "total": len(self.subjects), "offset": body["offset"]}


def test_stream_subjects_reads_every_page() -> None:
    subjects = {f"$KV.b.L.{gen}.p0": 1 for gen in range(7)}
    api = PagedSubjects(subjects, per_page=3)
    assert run_sync(api.stream_subjects("KV_b", "$KV.b.L.*.*")) == subjects
    assert [body["offset"] for body in api.asked] == [0, 3, 6]
    assert {body["subjects_filter"] for body in api.asked} == {"$KV.b.L.*.*"}


def test_stream_subjects_of_nothing_matching() -> None:
    assert run_sync(PagedSubjects({}, per_page=3).stream_subjects("KV_b", "$KV.b.x.>")) == {}
