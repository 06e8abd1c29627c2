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


class PagedList(JetStreamApi):
    """A `CONSUMER.LIST`, `CONSUMER.NAMES` or `STREAM.NAMES` reply `per_page` items at a time,
    as the server cuts them: `offline` items count in a page without being in it (`missing`)."""

    def __init__(self, names: list[str], per_page: int, offline: frozenset[str] = frozenset()):
        super().__init__(None)  # type: ignore[arg-type]
        self.names, self.per_page, self.offline = names, per_page, offline
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def request(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert body is not None
        self.asked.append((subject, body))
        cut = self.names[body["offset"] : body["offset"] + self.per_page]
        field = "streams" if subject.startswith("STREAM.") else "consumers"
        items = [n for n in cut if n not in self.offline]
        found: list[Any] = items if "NAMES" in subject else [{"name": n} for n in items]
        missing = [n for n in cut if n in self.offline]
        return {field: found, "missing": missing, "total": len(self.names)}


def test_a_consumer_listing_reads_every_page_past_what_a_cluster_missed() -> None:
    names = [f"c{i}" for i in range(7)]
    api = PagedList(names, per_page=3, offline=frozenset({"c1", "c4"}))
    infos = run_sync(api.consumer_infos("S"))
    assert sorted(infos) == ["c0", "c2", "c3", "c5", "c6"]
    assert infos["c3"]["name"] == "c3"
    assert [body["offset"] for _, body in api.asked] == [0, 3, 6]  # not again from c1 or c4


def test_names_read_every_page_with_their_filter() -> None:
    names = [f"s{i}" for i in range(5)]
    api = PagedList(names, per_page=2)
    assert run_sync(api.stream_names("ORDERS.*")) == names
    assert [body for _, body in api.asked] == [
        {"subject": "ORDERS.*", "offset": offset} for offset in (0, 2, 4)
    ]
    assert run_sync(PagedList(names, per_page=2).consumer_names("S")) == names
