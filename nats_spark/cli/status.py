"""`status`: a group's consumers in the layout it is read in, and its lag, once or watched."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from nats_spark.cli.members import holding
from nats_spark.cli.output import dash, numbers, print_json, table
from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError
from nats_spark.pcg import admin
from nats_spark.pcg.consumers import partition_consumer_name
from nats_spark.pcg.kinds import ConsumerLayout
from nats_spark.pcg.partitioning import partition_owner
from nats_spark.pcg.store import GroupEntry


def _partition_rows(entry: GroupEntry, partitions: list[admin.PartitionInfo]) -> list[tuple]:
    """A row per partition of the group; those without a consumer (no query has read them yet,
    or one reading only some members) say so."""
    found = {p.partition: p for p in partitions}
    rows: list[tuple] = []
    for number in range(entry.config.max_members):
        p = found.get(number)
        if p is None:
            owner = partition_owner(entry.config, number)
            name = partition_consumer_name(entry, number)
            rows.append((number, owner or "-", name, "no consumer", "-", "-", "-"))
        else:
            state = (p.state, p.num_pending, p.num_ack_pending, p.last_active or "-")
            rows.append((number, p.member or "-", p.consumer, *state))
    return rows


def _member_row(m: admin.MemberInfo) -> tuple:
    pending, ack_pending = dash(m.num_pending), dash(m.num_ack_pending)
    state = (m.state, pending, ack_pending, m.last_active or "-")
    return (m.member, numbers(m.partitions), m.consumer, *state)


@dataclass(frozen=True)
class _GroupStatus:
    """One look at a group's consumers, and when (monotonic seconds)."""

    entry: GroupEntry
    members: list[admin.MemberInfo]
    partitions: list[admin.PartitionInfo]
    at: float

    @property
    def layout(self) -> ConsumerLayout:
        # Partition consumers exist once a query has read the group in the partition layout
        # (the default).
        return ConsumerLayout.PARTITION if self.partitions else ConsumerLayout.MEMBER

    @property
    def lag(self) -> dict[str, dict]:
        return admin.group_lag(self.members, self.partitions)

    @property
    def beside(self) -> list[admin.MemberInfo]:
        """Member consumers that read or hold messages beside the partition layout's: a move
        left idle ones behind (not shown), while these block a partition-layout query."""
        if self.layout is ConsumerLayout.MEMBER:
            return []
        return [m for m in self.members if m.state not in ("idle", "no consumer")]

    def lags(self) -> dict[str, int]:
        """Pending plus ack pending by consumer name, of every consumer that exists."""
        lags = {p.consumer: p.num_pending + p.num_ack_pending for p in self.partitions}
        for m in self.members:
            if m.num_pending is not None:
                lags[m.consumer] = m.num_pending + (m.num_ack_pending or 0)
        return lags


async def _look(client: NatsClient, args: argparse.Namespace) -> _GroupStatus:
    entry, members, partitions = await admin.group_status(client, args.stream, args.group)
    return _GroupStatus(entry, members, partitions, time.monotonic())


def _status_document(status: _GroupStatus) -> dict[str, Any]:
    return {
        "kind": status.entry.kind.value,
        "layout": status.layout.value,
        "members": [{**asdict(m), "state": m.state} for m in status.members],
        "partitions": [{**asdict(p), "state": p.state} for p in status.partitions],
        "lag": status.lag,
    }


def _rate(now: _GroupStatus, before: _GroupStatus, consumer: str | None = None) -> float | None:
    """How fast the lag (pending plus ack pending) of `consumer`, or in total, changed since
    `before`, per second; None when it cannot be told."""
    seconds = now.at - before.at
    if seconds <= 0:
        return None
    if consumer is None:
        lag_now, lag_before = now.lag["total"], before.lag["total"]
        change = sum(lag_now.values()) - sum(lag_before.values())
        return change / seconds
    current, earlier = now.lags().get(consumer), before.lags().get(consumer)
    if current is None or earlier is None:
        return None
    return (current - earlier) / seconds


def _print_status(status: _GroupStatus, before: _GroupStatus | None, title: str = "") -> None:
    """The status table and total; with `before` (watching) a lag-per-second column and total."""
    entry = status.entry
    read = status.partitions or any(m.num_pending is not None for m in status.members)
    shape = f"{status.layout.value} layout" if read else "no consumers yet (nothing has read it)"
    print(f"{entry.kind.value} group {entry.group} on {entry.stream}, {shape}{title}")
    if status.layout is ConsumerLayout.PARTITION:
        header: tuple[str, ...] = ("PARTITION", "MEMBER", "CONSUMER")
        # The member consumers beside it after the partitions, their partitions in the first
        # column.
        beside = [(numbers(m.partitions), m.member, *_member_row(m)[2:]) for m in status.beside]
        rows = _partition_rows(entry, status.partitions) + beside
    else:
        header = ("MEMBER", "PARTITIONS", "CONSUMER")
        rows = [_member_row(m) for m in status.members]
    counts: tuple[str, ...] = ("STATE", "PENDING", "ACK PENDING")
    if before is not None:
        rows = [(*row[:-1], _per_second(_rate(status, before, row[2])), row[-1]) for row in rows]
        counts += ("LAG/S",)
    print(table((*header, *counts, "LAST ACTIVE"), rows))
    total = status.lag["total"]
    line = f"total: {total['pending']} pending, {total['ackPending']} ack pending"
    rate = None if before is None else _rate(status, before)
    if rate is not None:
        line += f", lag {_per_second(rate)}/s"
        lag = total["pending"] + total["ackPending"]
        if rate < 0 and lag:
            line += f" (caught up in about {lag / -rate:.0f}s at this rate)"
    print(line)
    for m in status.beside:
        if m.state == "holding":
            print(f"warning: {holding(m, entry.kind, entry.stream, entry.group)}")


def _per_second(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:+.0f}"


async def status(client: NatsClient, args: argparse.Namespace) -> int:
    if args.count is not None and (args.watch is None or args.count < 1):
        raise ConfigurationError(
            f"--count {args.count}: give the number of draws of --watch, 1 or more, with --watch"
        )
    if args.watch is None:
        status = await _look(client, args)
        if args.json:
            print_json(_status_document(status))
        else:
            _print_status(status, None)
        return 0
    return await _watch(client, args)


async def _watch(client: NatsClient, args: argparse.Namespace) -> int:
    """Redraw the status every `--watch` seconds, `--count` times or until Ctrl-C."""
    if args.watch <= 0:
        raise ConfigurationError(
            f"--watch {args.watch:g}: give the seconds between redraws, more than 0"
        )
    clear = sys.stdout.isatty()
    before: _GroupStatus | None = None
    frames = 0
    while True:
        status = await _look(client, args)
        frames += 1
        if args.json:  # one document a line
            rate = None if before is None else _rate(status, before)
            print(json.dumps({**_status_document(status), "lagPerSecond": rate}), flush=True)
        else:
            if clear:
                print("\x1b[H\x1b[J", end="")
            elif before is not None:
                print()
            stamp = datetime.now().strftime("%H:%M:%S")
            title = f"; {stamp}, every {args.watch:g}s (Ctrl-C stops)"
            _print_status(status, before or status, title)
            sys.stdout.flush()
        if args.count and frames >= args.count:
            return 0
        before = status
        await asyncio.sleep(args.watch)
