"""`nats-pcg`: administer and try out partitioned consumer groups, like the Go `cg` CLI.

Every command is a small coroutine taking an open `NatsClient` and the parsed arguments and
returning the exit code; `main` parses, connects, runs it on the process event loop and turns
any failure into one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from nats_spark.client import NatsClient
from nats_spark.connection import DEFAULT_URL, ConnectionSettings, parse_servers, with_credentials
from nats_spark.errors import ConfigurationError, NatsSparkError
from nats_spark.pcg import admin
from nats_spark.pcg.config import ElasticConfig, MemberMapping, PartitioningFilter
from nats_spark.pcg.consumers import partition_consumer_name, read_stream
from nats_spark.pcg.kinds import ConsumerLayout, GroupKind
from nats_spark.pcg.partitioning import elastic_stream_name, member_partitions, partition_owner
from nats_spark.pcg.store import GroupEntry, load_group
from nats_spark.progress import progress_bar

PROG = "nats-pcg"
Command = Callable[[NatsClient, argparse.Namespace], Awaitable[int]]

ELASTIC_CREATE_HELP = """\
Partitioning: give one --partition-wildcards per --filter, in the same order, or none at all.
--partition-wildcards takes the 1-based indexes of the filter's '*' tokens whose values pick
the partition (e.g. --filter 'orders.*.*' --partition-wildcards 1,2); an empty value ('')
hashes the whole subject for that filter. Without --partition-wildcards every filter hashes
whole subjects, and without --filter the group takes every subject of the stream ('>'),
hashed whole. Hashing whole subjects needs nats-server 2.12 or newer.
"""


# --- Argument types ---------------------------------------------------------------------------


def _mapping(text: str) -> MemberMapping:
    """`member:p1,p2,...` as a member mapping."""
    member, sep, partitions = text.partition(":")
    try:
        numbers = [int(p) for p in partitions.split(",")]
    except ValueError:
        numbers = []
    if not (sep and member and numbers):
        raise argparse.ArgumentTypeError(
            f"invalid member mapping {text!r}: use <member>:<partition>,<partition>... "
            "such as m1:0,1,2"
        )
    return MemberMapping(member, numbers)


def _wildcards(text: str) -> list[int]:
    """`1,2` as wildcard indexes; an empty string for none."""
    try:
        return [int(i) for i in text.split(",")] if text.strip() else []
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid wildcard indexes {text!r}: use comma-separated numbers such as 1,2"
        ) from None


def _partitioning_filters(
    filters: list[str] | None, wildcards: list[list[int]] | None
) -> list[PartitioningFilter] | None:
    if not filters:
        if wildcards:
            raise ConfigurationError(
                "--partition-wildcards given without --filter; add the --filter it belongs to"
            )
        return None
    if wildcards is None:
        wildcards = [[] for _ in filters]
    if len(wildcards) != len(filters):
        raise ConfigurationError(
            f"{len(filters)} --filter but {len(wildcards)} --partition-wildcards given; give one "
            "--partition-wildcards per --filter in the same order, or none at all"
        )
    # No indexes are stored as null, Go's nil: hash the whole subject.
    return [PartitioningFilter(f, w or None) for f, w in zip(filters, wildcards, strict=True)]


# --- Output -----------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces."""
    lines = [list(header), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _fields(pairs: Iterable[tuple[str, Any]]) -> str:
    """`label: value` lines with the values aligned."""
    pairs = list(pairs)
    width = max(len(label) for label, _ in pairs) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in pairs)


def _numbers(values: Iterable[int]) -> str:
    return ",".join(map(str, values)) or "-"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _limit(value: int) -> str:
    return str(value) if value > 0 else "unlimited"


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


# --- Commands ---------------------------------------------------------------------------------


def _kind(args: argparse.Namespace) -> GroupKind:
    return GroupKind(args.kind)


async def _ls(client: NatsClient, args: argparse.Namespace) -> int:
    kind = _kind(args)
    lister = admin.list_static if kind is GroupKind.STATIC else admin.list_elastic
    groups = await lister(client, args.stream)
    if args.json:
        _print_json({"kind": kind.value, "stream": args.stream, "groups": groups})
    elif groups:
        print("\n".join(groups))
    else:
        print(f"no {kind.value} consumer groups on stream {args.stream}")
    return 0


def _config_fields(entry: GroupEntry) -> list[tuple[str, Any]]:
    config = entry.config
    pairs: list[tuple[str, Any]] = [("partitions", config.max_members)]
    if isinstance(config, ElasticConfig):
        filters = config.partitioning_filters or [PartitioningFilter(">")]
        pairs += [
            (
                "filter",
                f"{pf.filter} (partition by wildcards {_numbers(pf.partitioning_wildcards)})"
                if pf.partitioning_wildcards
                else f"{pf.filter} (partition by whole subject)",
            )
            for pf in filters
        ]
        pairs += [
            ("work-queue stream", elastic_stream_name(entry.stream, entry.group)),
            ("max buffered msgs", _limit(config.max_buffered_msgs)),
            ("max buffered bytes", _limit(config.max_buffered_bytes)),
        ]
    else:
        pairs.append(("filters", ", ".join(config.filters) or "> (all)"))
    mode = "mapped" if config.member_mappings else "balanced" if config.members else "no members"
    return [*pairs, ("membership", mode), ("KV revision", entry.revision)]


async def _info(client: NatsClient, args: argparse.Namespace) -> int:
    kind = _kind(args)
    loader = admin.static_info if kind is GroupKind.STATIC else admin.elastic_info
    entry = await loader(client, args.stream, args.group)
    active = set(await admin.list_active_members(client, kind, args.stream, args.group))
    config = entry.config
    owned = {
        member: member_partitions(
            config.members, config.max_members, config.member_mappings, member
        )
        for member in admin.membership(config)
    }
    members = [
        {"member": member, "partitions": partitions, "active": member in active}
        for member, partitions in owned.items()
    ]
    if args.json:
        document: dict[str, Any] = {
            "kind": kind.value,
            "stream": entry.stream,
            "group": entry.group,
            "revision": entry.revision,
            "config": json.loads(config.to_json()),
            "members": members,
        }
        if kind is GroupKind.ELASTIC:
            document["work_queue_stream"] = elastic_stream_name(entry.stream, entry.group)
        _print_json(document)
        return 0
    print(f"{kind.value.capitalize()} consumer group {entry.group} on stream {entry.stream}")
    print()
    print(_fields(_config_fields(entry)))
    if members:
        print()
        rows = [
            (member, _numbers(partitions), _yes(member in active))
            for member, partitions in owned.items()
        ]
        print(_table(("MEMBER", "PARTITIONS", "ACTIVE"), rows))
    return 0


async def _create_static(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.create_static(
        client,
        args.stream,
        args.group,
        args.max_members,
        members=getattr(args, "members", None),  # balanced
        member_mappings=getattr(args, "mappings", None),  # mapped
        filters=args.filter,
    )
    print(f"created static consumer group {entry.group} on stream {entry.stream}")
    return 0


async def _create_elastic(client: NatsClient, args: argparse.Namespace) -> int:
    filters = _partitioning_filters(args.filter, args.partition_wildcards)
    entry = await admin.create_elastic(
        client,
        args.stream,
        args.group,
        args.max_members,
        filters,
        max_buffered_msgs=args.max_buffered_msgs,
        max_buffered_bytes=args.max_buffered_bytes,
    )
    print(
        f"created elastic consumer group {entry.group} on stream {entry.stream} "
        f"(work-queue stream {elastic_stream_name(entry.stream, entry.group)})"
    )
    return 0


async def _delete(client: NatsClient, args: argparse.Namespace) -> int:
    if _kind(args) is GroupKind.STATIC:
        consumers = await admin.delete_static(client, args.stream, args.group)
        detail = f"; deleted consumers: {', '.join(consumers)}" if consumers else ""
    else:
        await admin.delete_elastic(client, args.stream, args.group)
        detail = f"; deleted stream {elastic_stream_name(args.stream, args.group)}"
    print(f"deleted {args.kind} consumer group {args.group} on stream {args.stream}{detail}")
    return 0


async def _add(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.add_members(client, args.stream, args.group, args.members)
    print(f"members of {entry.group}: {', '.join(entry.config.members)}")
    return 0


async def _drop(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.drop_members(client, args.stream, args.group, args.members)
    print(f"members of {entry.group}: {', '.join(entry.config.members) or '(none)'}")
    return 0


async def _create_mapping(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.set_mappings(client, args.stream, args.group, args.mappings)
    rows = [(m.member, _numbers(m.partitions)) for m in entry.config.member_mappings]
    print(f"member mappings of {entry.group} set")
    print(_table(("MEMBER", "PARTITIONS"), rows))
    return 0


async def _delete_mapping(client: NatsClient, args: argparse.Namespace) -> int:
    entry = await admin.delete_mappings(client, args.stream, args.group)
    print(f"member mappings of {entry.group} deleted; add members to assign the partitions")
    return 0


async def _member_info(client: NatsClient, args: argparse.Namespace) -> int:
    info = await admin.member_info(client, _kind(args), args.stream, args.group, args.member)
    if args.json:
        _print_json({**asdict(info), "state": info.state})
        return 0
    print(
        _fields(
            [
                ("member", info.member),
                ("in membership", _yes(info.in_membership)),
                ("active", _yes(info.active)),
                ("state", info.state),
                ("pinned", _yes(info.pinned)),
                ("partitions", _numbers(info.partitions)),
                ("consumer", f"{info.stream} > {info.consumer}"),
                ("pending", "-" if info.num_pending is None else info.num_pending),
                ("ack pending", "-" if info.num_ack_pending is None else info.num_ack_pending),
            ]
        )
    )
    if info.state == "holding":
        print(f"warning: {_holding(info, _kind(args), args.stream, args.group)}")
    elif info.in_membership and not info.active:
        print(f"warning: member {info.member} is in the membership but has no running instance")
    return 0


def _holding(info: admin.MemberInfo, kind: GroupKind, stream: str, group: str) -> str:
    """What a member consumer that no instance pulls but that holds messages means, and its fix."""
    return (
        f"no instance pulls consumer {info.stream} > {info.consumer}, yet it holds "
        f"{info.num_ack_pending} message(s) ack-pending (a reader between batches, or one that "
        "stopped without acking them); a nats-spark query reading the group per partition "
        f"refuses while it does; if nothing reads as {info.member}: nats-pcg {kind.value} "
        f"member-reset {stream} {group} {info.member}"
    )


def _count(value: int | None) -> Any:
    return "-" if value is None else value


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
    pending, ack_pending = _count(m.num_pending), _count(m.num_ack_pending)
    state = (m.state, pending, ack_pending, m.last_active or "-")
    return (m.member, _numbers(m.partitions), m.consumer, *state)


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
        beside = [(_numbers(m.partitions), m.member, *_member_row(m)[2:]) for m in status.beside]
        rows = _partition_rows(entry, status.partitions) + beside
    else:
        header = ("MEMBER", "PARTITIONS", "CONSUMER")
        rows = [_member_row(m) for m in status.members]
    counts: tuple[str, ...] = ("STATE", "PENDING", "ACK PENDING")
    if before is not None:
        rows = [(*row[:-1], _per_second(_rate(status, before, row[2])), row[-1]) for row in rows]
        counts += ("LAG/S",)
    print(_table((*header, *counts, "LAST ACTIVE"), rows))
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
            print(f"warning: {_holding(m, entry.kind, entry.stream, entry.group)}")


def _per_second(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:+.0f}"


async def _status(client: NatsClient, args: argparse.Namespace) -> int:
    if args.count is not None and (args.watch is None or args.count < 1):
        raise ConfigurationError(
            f"--count {args.count}: give the number of draws of --watch, 1 or more, with --watch"
        )
    if args.watch is None:
        status = await _look(client, args)
        if args.json:
            _print_json(_status_document(status))
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


async def _step_down(client: NatsClient, args: argparse.Namespace) -> int:
    await admin.step_down(client, _kind(args), args.stream, args.group, args.member)
    print(f"member {args.member} of {args.group} stepped down; the next waiting instance is pinned")
    return 0


async def _member_reset(client: NatsClient, args: argparse.Namespace) -> int:
    kind = _kind(args)
    info = await admin.reset_member(
        client, kind, args.stream, args.group, args.member, force=args.force
    )
    start = "the stream's first message" if kind is GroupKind.STATIC else "what it holds"
    print(
        f"deleted consumer {info.stream} > {info.consumer} of member {info.member} "
        f"({info.num_ack_pending} ack pending, {info.num_pending} pending); its next instance "
        f"creates it anew, reading its partitions from {start}"
    )
    return 0


async def _active(client: NatsClient, args: argparse.Namespace) -> int:
    members = await admin.list_active_members(client, _kind(args), args.stream, args.group)
    print("\n".join(members) if members else f"no active members in {args.group}")
    return 0


async def _refuse_beside_partition_layout(
    client: NatsClient, args: argparse.Namespace, kind: GroupKind
) -> None:
    """A member consumer of partitions a nats-spark query reads per partition would deliver
    again what the query committed, and block its next batch with what it leaves ack-pending."""
    entry = await load_group(client, args.stream, args.group, kind)
    consumers = await admin.partition_layout_consumers(client, entry, args.member)
    if consumers:
        raise ConfigurationError(
            f"the partitions of member {args.member!r} of group {args.group!r} are read per "
            f"partition by a nats-spark query (consumers {', '.join(consumers)} on stream "
            f"{read_stream(entry)}), and consuming them as a member would read again what it "
            "read; consume a member the query does not read, or move the query to the member "
            "layout first (consumerLayout=member), where instances of a member share it by its pin"
        )


async def _consume(client: NatsClient, args: argparse.Namespace) -> int:
    # Imported here: the member runtime is only needed by this command.
    from nats_spark.pcg.member import consume
    from nats_spark.pcg.member_pulls import GroupMessage

    kind = _kind(args)
    await _refuse_beside_partition_layout(client, args, kind)
    received = 0
    # Done at --count, or failed with what broke the handling of a message: either way what
    # comes after is handed back (NAK), and `member.stop` gives back what it took beyond.
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handler(msg: GroupMessage) -> None:
        nonlocal received
        if ended.done():
            await msg.msg.nak()
            return
        try:
            text = msg.data.decode("utf-8", "replace")
            print(f"[{msg.partition}] {msg.subject}: {text}", flush=True)
            await msg.ack()
        except Exception as error:
            with contextlib.suppress(Exception):  # the connection may be what broke
                await msg.msg.nak()
            ended.set_exception(error)
            return
        received += 1
        if args.count:
            progress_bar(received, args.count, "consumed")
            if received >= args.count:
                ended.set_result(None)

    member = await consume(client, args.stream, args.group, args.member, handler, kind=kind)
    try:
        await asyncio.wait(
            {ended, member.done}, timeout=args.timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:  # also on Ctrl-C (the command's task is cancelled)
        stopped_by_itself = member.done.done()
        await member.stop()
    if ended.done():
        if error := ended.exception():
            raise ConfigurationError(
                f"stopped after {received} message(s): handling one failed "
                f"({type(error).__name__}: {error}); it and those taken after it were given back"
            ) from error
        return 0
    if stopped_by_itself:
        member.done.result()  # raises the member's error, if it ended with one
        if args.count:
            raise ConfigurationError(
                f"member {args.member} stopped after {received} of {args.count} messages "
                "(was the group deleted?)"
            )
        return 0
    if args.count:
        raise ConfigurationError(
            f"timed out after {args.timeout:g}s with {received} of {args.count} messages; "
            "publish more or raise --timeout"
        )
    return 0


# --- Parser -----------------------------------------------------------------------------------


_AUTH_FLAGS = ("user", "token", "creds", "nkey")


def connection_flags() -> argparse.ArgumentParser:
    """The connection flags, a parent of every parser: they are accepted before the subcommand
    and after it. Nothing defaults here (SUPPRESS), so a subcommand's parser never overwrites a
    flag given before it; `settings_from_args` fills in what was not given."""
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    conn = parser.add_argument_group("connection")
    conn.add_argument(
        "--server",
        "-s",
        help=f"NATS server URL(s), comma separated (default: $NATS_URL, else {DEFAULT_URL})",
    )
    # One of these four (checked in `main`: argparse's exclusive groups lose their place in the
    # help when inherited, and check only one side of the subcommand).
    conn.add_argument("--user", help="user name (with --password)")
    conn.add_argument("--token", help="authentication token")
    conn.add_argument("--creds", metavar="FILE", help="credentials file (JWT and nkey seed)")
    conn.add_argument("--nkey", metavar="FILE", help="nkey seed file")
    conn.add_argument("--password", help="password for --user (visible in ps: prefer the next)")
    conn.add_argument("--password-file", metavar="FILE", help="file holding the password")
    conn.add_argument("--token-file", metavar="FILE", help="file holding the token")
    conn.add_argument("--tls-ca", metavar="FILE", help="CA certificate to verify the server")
    conn.add_argument("--tls-cert", metavar="FILE", help="client certificate (mutual TLS)")
    conn.add_argument("--tls-key", metavar="FILE", help="client key (mutual TLS)")
    # Not an argparse exclusive group: ConnectionSettings refuses both, in one line.
    conn.add_argument("--js-domain", metavar="DOMAIN", help="JetStream domain of the stream")
    conn.add_argument(
        "--js-api-prefix", metavar="PREFIX", help="JetStream API imported from another account"
    )
    conn.add_argument("--inbox-prefix", metavar="PREFIX", help="reply inbox prefix (_INBOX)")
    return parser


def settings_from_args(args: argparse.Namespace) -> ConnectionSettings:
    """The connection settings the command-line flags describe (absent flags are None)."""
    flags = vars(args)
    return with_credentials(
        {
            "user": flags.get("user"),
            "password": flags.get("password"),
            "token": flags.get("token"),
            "creds": flags.get("creds"),
            "nkey_seed": flags.get("nkey"),
        },
        {
            "password": ("--password-file", flags.get("password_file")),
            "token": ("--token-file", flags.get("token_file")),
        },
        servers=parse_servers(flags.get("server") or os.environ.get("NATS_URL") or DEFAULT_URL),
        tls_ca_cert=flags.get("tls_ca"),
        tls_cert=flags.get("tls_cert"),
        tls_key=flags.get("tls_key"),
        domain=flags.get("js_domain"),
        api_prefix=flags.get("js_api_prefix"),
        inbox_prefix=flags.get("inbox_prefix"),
        name=PROG,
    )


def _command(
    subparsers: Any, name: str, run: Command, help: str, *, aliases: Sequence[str] = ()
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        name, help=help, description=help, aliases=list(aliases), parents=[connection_flags()]
    )
    parser.set_defaults(run=run)
    return parser


def _group_args(parser: argparse.ArgumentParser, *, member: bool = False) -> None:
    parser.add_argument("stream", help="stream name")
    parser.add_argument("group", help="consumer group name")
    if member:
        parser.add_argument("member", help="member name")


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def _add_shared_commands(subparsers: Any) -> None:
    """Commands static and elastic groups have in common."""
    ls = _command(subparsers, "ls", _ls, "list the consumer groups of a stream", aliases=["list"])
    ls.add_argument("stream", help="stream name")
    _json_flag(ls)
    info = _command(subparsers, "info", _info, "show a consumer group's config and members")
    _group_args(info)
    _json_flag(info)
    delete = _command(subparsers, "delete", _delete, "delete a consumer group", aliases=["rm"])
    _group_args(delete)
    member_info = _command(
        subparsers,
        "member-info",
        _member_info,
        "show one member's state",
        aliases=["memberinfo", "minfo"],
    )
    _group_args(member_info, member=True)
    _json_flag(member_info)
    step_down = _command(
        subparsers,
        "step-down",
        _step_down,
        "unpin a member's running instance",
        aliases=["stepdown", "sd"],
    )
    _group_args(step_down, member=True)
    reset = _command(
        subparsers,
        "member-reset",
        _member_reset,
        "delete a member's consumer (e.g. one a stopped instance left holding messages); its "
        "next instance creates it anew",
        aliases=["memberreset"],
    )
    _group_args(reset, member=True)
    reset.add_argument(
        "--force", action="store_true", help="also while an instance holds its pin or pulls"
    )
    _group_args(
        _command(
            subparsers,
            "active",
            _active,
            "list the active members (an instance pulls or holds the pin, or messages are "
            "ack-pending)",
        )
    )
    consume = _command(
        subparsers,
        "consume",
        _consume,
        "join the group as a member; print and ack each message as '[partition] subject: data'",
        aliases=["join"],
    )
    _group_args(consume, member=True)
    consume.add_argument("--count", type=int, help="exit 0 after this many messages")
    consume.add_argument(
        "--timeout", type=float, help="give up after this many seconds (exit 1 if --count unmet)"
    )


# The group's partition count (`max_members` in the KV entry, as Go names it).
_PARTITIONS: dict[str, Any] = {"metavar": "partitions", "type": int, "help": "number of partitions"}


def _add_static_commands(subparsers: Any) -> None:
    create = subparsers.add_parser(
        "create", help="create a static consumer group", parents=[connection_flags()]
    )
    kinds = create.add_subparsers(dest="mode", required=True, metavar="{balanced,mapped}")
    balanced = _command(
        kinds, "balanced", _create_static, "spread the partitions evenly over the members"
    )
    _group_args(balanced)
    balanced.add_argument("max_members", **_PARTITIONS)
    balanced.add_argument("members", nargs="+", metavar="member", help="member names")
    mapped = _command(kinds, "mapped", _create_static, "give each member explicit partitions")
    _group_args(mapped)
    mapped.add_argument("max_members", **_PARTITIONS)
    mapped.add_argument(
        "mappings", nargs="+", type=_mapping, metavar="member:p1,p2", help="member mappings"
    )
    for parser in (balanced, mapped):
        parser.add_argument(
            "--filter", action="append", help="subject filter (after the partition token); repeat"
        )
    _add_shared_commands(subparsers)


def _add_elastic_commands(subparsers: Any) -> None:
    create = _command(subparsers, "create", _create_elastic, "create an elastic consumer group")
    create.epilog = ELASTIC_CREATE_HELP
    create.formatter_class = argparse.RawDescriptionHelpFormatter
    _group_args(create)
    create.add_argument("max_members", **_PARTITIONS)
    create.add_argument("--filter", action="append", help="partitioning subject filter; repeat")
    create.add_argument(
        "--partition-wildcards",
        action="append",
        type=_wildcards,
        metavar="I,J",
        help="wildcard indexes of the matching --filter (see below)",
    )
    for limit in ("msgs", "bytes"):
        create.add_argument(
            f"--max-buffered-{limit}",
            type=int,
            default=0,
            metavar="N",
            help=f"most {limit} the work-queue stream holds (default 0: unlimited)",
        )
    for name, run in (("add", _add), ("drop", _drop)):
        change = _command(subparsers, name, run, f"{name} members (compare-and-set)")
        _group_args(change)
        change.add_argument("members", nargs="+", metavar="member", help="member names")
    mapping = _command(
        subparsers,
        "create-mapping",
        _create_mapping,
        "map members to explicit partitions",
        aliases=["createmapping", "cm"],
    )
    _group_args(mapping)
    mapping.add_argument("mappings", nargs="+", type=_mapping, metavar="member:p1,p2")
    _group_args(
        _command(
            subparsers,
            "delete-mapping",
            _delete_mapping,
            "drop the member mappings",
            aliases=["deletemapping", "dm"],
        )
    )
    _add_shared_commands(subparsers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Administer NATS JetStream partitioned consumer groups (compatible with the "
        "Go pcgroups library and its cg CLI). The connection flags go before or after the "
        "command.",
        parents=[connection_flags()],
    )
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="{static,elastic,status}")
    status = _command(
        kinds,
        "status",
        _status,
        "a group in the layout it is read in: a row per partition (partition layout) or per "
        "member (member layout) with its consumer, state, pending and last activity; the lag",
    )
    _group_args(status)
    _json_flag(status)
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) with the lag's change per second, until Ctrl-C "
        "(with --json: a document a line)",
    )
    status.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N draws")
    for kind, add_commands in (
        (GroupKind.STATIC, _add_static_commands),
        (GroupKind.ELASTIC, _add_elastic_commands),
    ):
        commands = kinds.add_parser(
            kind.value, help=f"{kind.value} consumer groups", parents=[connection_flags()]
        )
        add_commands(commands.add_subparsers(dest="command", required=True, metavar="<command>"))
    return parser


# --- Entry point ------------------------------------------------------------------------------


async def _run(settings: ConnectionSettings, args: argparse.Namespace) -> int:
    client = await NatsClient.open(settings)
    try:
        return await args.run(client, args)
    finally:
        await client.close()


def _fail(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (2 for usage errors)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        ways = [f"--{dest}" for dest in _AUTH_FLAGS if vars(args).get(dest) is not None]
        if len(ways) > 1:
            parser.error(f"{' and '.join(ways)} given; use one of them")
    except SystemExit as done:  # usage error or --help: argparse already printed
        return done.code if isinstance(done.code, int) else 2
    try:
        # On the main thread's own loop: Ctrl-C cancels the command, whose cleanup (a consuming
        # member gives back what it took, steps down, closes) runs before the exit.
        return asyncio.run(_run(settings_from_args(args), args))
    except KeyboardInterrupt:
        return 130
    except (NatsSparkError, ValueError) as error:
        return _fail(str(error))
    except Exception as error:  # anything else still gets one line, never a traceback
        return _fail(f"unexpected {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(main())
