"""The commands on one member: its state, step-down, reset, and consuming as it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from dataclasses import asdict

from nats_spark.cli.groups import kind_of
from nats_spark.cli.output import fields, numbers, print_json, yes
from nats_spark.client import NatsClient
from nats_spark.errors import ConfigurationError
from nats_spark.pcg import admin
from nats_spark.pcg.consumers import read_stream
from nats_spark.pcg.kinds import GroupKind
from nats_spark.pcg.store import load_group
from nats_spark.progress import progress_bar


async def member_info(client: NatsClient, args: argparse.Namespace) -> int:
    info = await admin.member_info(client, kind_of(args), args.stream, args.group, args.member)
    if args.json:
        print_json({**asdict(info), "state": info.state})
        return 0
    print(
        fields(
            [
                ("member", info.member),
                ("in membership", yes(info.in_membership)),
                ("active", yes(info.active)),
                ("state", info.state),
                ("pinned", yes(info.pinned)),
                ("partitions", numbers(info.partitions)),
                ("consumer", f"{info.stream} > {info.consumer}"),
                ("pending", "-" if info.num_pending is None else info.num_pending),
                ("ack pending", "-" if info.num_ack_pending is None else info.num_ack_pending),
            ]
        )
    )
    if info.state == "holding":
        print(f"warning: {holding(info, kind_of(args), args.stream, args.group)}")
    elif info.in_membership and not info.active:
        print(f"warning: member {info.member} is in the membership but has no running instance")
    return 0


def holding(info: admin.MemberInfo, kind: GroupKind, stream: str, group: str) -> str:
    """What a member consumer that no instance pulls but that holds messages means, and its fix."""
    return (
        f"no instance pulls consumer {info.stream} > {info.consumer}, yet it holds "
        f"{info.num_ack_pending} message(s) ack-pending (a reader between batches, or one that "
        "stopped without acking them); a nats-spark query reading the group per partition "
        f"refuses while it does; if nothing reads as {info.member}: nats-pcg {kind.value} "
        f"member-reset {stream} {group} {info.member}"
    )


async def step_down(client: NatsClient, args: argparse.Namespace) -> int:
    await admin.step_down(client, kind_of(args), args.stream, args.group, args.member)
    print(f"member {args.member} of {args.group} stepped down; the next waiting instance is pinned")
    return 0


async def member_reset(client: NatsClient, args: argparse.Namespace) -> int:
    kind = kind_of(args)
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


async def active(client: NatsClient, args: argparse.Namespace) -> int:
    members = await admin.list_active_members(client, kind_of(args), args.stream, args.group)
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


async def consume(client: NatsClient, args: argparse.Namespace) -> int:
    # Imported here: the member runtime is only needed by this command.
    from nats_spark.pcg.member import consume
    from nats_spark.pcg.member_pulls import GroupMessage

    kind = kind_of(args)
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
