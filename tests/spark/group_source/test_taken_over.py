"""An attempt that loses its entry learns who holds it now: another attempt of the query keeps
what the entry recorded (`kept_by_its_taker`), a give-back or a removal does not."""

from __future__ import annotations

import dataclasses

import pytest
from memory_bucket import MemoryBucket

from nats_spark.loop import run_sync
from nats_spark.spark.group_source import ledger_protocol as protocol
from nats_spark.spark.group_source.ledger import EntryHead, Ledger, TakenOver, write_head

pytestmark = pytest.mark.unit


def lost_to(holder: str | None) -> TakenOver:
    """The `TakenOver` an attempt's head write gets once the entry is `holder`'s (None: the entry
    was removed)."""

    async def lose() -> TakenOver:
        ledger = Ledger(MemoryBucket(), "lin")
        mine = EntryHead(attempt="aaaaaaaaaaaa")
        revision = await ledger.create_head(1, "s", mine.to_bytes())
        assert revision is not None
        if holder is None:
            await ledger.delete_entry(1, "s")
        else:
            taker = dataclasses.replace(mine, attempt=holder)
            await write_head(ledger, 1, "s", taker, revision)
        try:
            await write_head(ledger, 1, "s", mine, revision)
        except TakenOver as taken:
            return taken
        raise AssertionError("the write of a lost entry went through")

    return run_sync(lose())


def test_an_entry_taken_over_by_another_attempt_is_kept_by_it() -> None:
    taken = lost_to("bbbbbbbbbbbb")
    assert taken.holder == "bbbbbbbbbbbb" and protocol.kept_by_its_taker(taken)


def test_an_entry_given_back_or_removed_is_kept_by_nobody() -> None:
    assert not protocol.kept_by_its_taker(lost_to(protocol.GIVEN_BACK))
    removed = lost_to(None)
    assert removed.holder is None and not protocol.kept_by_its_taker(removed)
