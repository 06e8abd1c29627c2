"""The command line: the connection flags every parser shares, and a parser per command."""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nats_spark.cli import groups, members, status
from nats_spark.cli.groups import ELASTIC_CREATE_HELP
from nats_spark.client import NatsClient
from nats_spark.connection import DEFAULT_URL, ConnectionSettings, parse_servers, with_credentials
from nats_spark.pcg.kinds import GroupKind

PROG = "nats-pcg"
Command = Callable[[NatsClient, argparse.Namespace], Awaitable[int]]


AUTH_FLAGS = ("user", "token", "creds", "nkey")


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


def _member_command(
    subparsers: Any, name: str, run: Command, help: str, short: str | None = None
) -> argparse.ArgumentParser:
    """A command on one member, `member-info` style: its aliases are the name without the dash
    (Go's) and `short`."""
    aliases = [name.replace("-", ""), *([short] if short else [])]
    parser = _command(subparsers, name, run, help, aliases=aliases)
    _group_args(parser, member=True)
    return parser


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def _add_shared_commands(subparsers: Any) -> None:
    """Commands static and elastic groups have in common."""
    ls = _command(
        subparsers, "ls", groups.ls, "list the consumer groups of a stream", aliases=["list"]
    )
    ls.add_argument("stream", help="stream name")
    _json_flag(ls)
    info = _command(subparsers, "info", groups.info, "show a consumer group's config and members")
    _group_args(info)
    _json_flag(info)
    delete = _command(
        subparsers, "delete", groups.delete, "delete a consumer group", aliases=["rm"]
    )
    _group_args(delete)
    member_info = _member_command(
        subparsers, "member-info", members.member_info, "show one member's state", "minfo"
    )
    _json_flag(member_info)
    _member_command(
        subparsers, "step-down", members.step_down, "unpin a member's running instance", "sd"
    )
    reset = _member_command(
        subparsers,
        "member-reset",
        members.member_reset,
        "delete a member's consumer (e.g. one a stopped instance left holding messages); its "
        "next instance creates it anew",
    )
    reset.add_argument(
        "--force", action="store_true", help="also while an instance holds its pin or pulls"
    )
    _group_args(
        _command(
            subparsers,
            "active",
            members.active,
            "list the active members (an instance pulls or holds the pin, or messages are "
            "ack-pending)",
        )
    )
    consume = _command(
        subparsers,
        "consume",
        members.consume,
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


def _create_command(subparsers: Any, name: str, run: Command, help: str) -> argparse.ArgumentParser:
    """A command creating a group: its stream, name and partition count."""
    parser = _command(subparsers, name, run, help)
    _group_args(parser)
    parser.add_argument("max_members", **_PARTITIONS)
    return parser


def _add_static_commands(subparsers: Any) -> None:
    create = subparsers.add_parser(
        "create", help="create a static consumer group", parents=[connection_flags()]
    )
    kinds = create.add_subparsers(dest="mode", required=True, metavar="{balanced,mapped}")
    balanced = _create_command(
        kinds, "balanced", groups.create_static, "spread the partitions evenly over the members"
    )
    balanced.add_argument("members", nargs="+", metavar="member", help="member names")
    mapped = _create_command(
        kinds, "mapped", groups.create_static, "give each member explicit partitions"
    )
    mapped.add_argument(
        "mappings",
        nargs="+",
        type=groups.member_mapping,
        metavar="member:p1,p2",
        help="member mappings",
    )
    for parser in (balanced, mapped):
        parser.add_argument(
            "--filter", action="append", help="subject filter (after the partition token); repeat"
        )
    _add_shared_commands(subparsers)


def _add_elastic_commands(subparsers: Any) -> None:
    create = _create_command(
        subparsers, "create", groups.create_elastic, "create an elastic consumer group"
    )
    create.epilog = ELASTIC_CREATE_HELP
    create.formatter_class = argparse.RawDescriptionHelpFormatter
    create.add_argument("--filter", action="append", help="partitioning subject filter; repeat")
    create.add_argument(
        "--partition-wildcards",
        action="append",
        type=groups.wildcard_indexes,
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
    for name, run in (("add", groups.add), ("drop", groups.drop)):
        change = _command(subparsers, name, run, f"{name} members (compare-and-set)")
        _group_args(change)
        change.add_argument("members", nargs="+", metavar="member", help="member names")
    mapping = _command(
        subparsers,
        "create-mapping",
        groups.create_mapping,
        "map members to explicit partitions",
        aliases=["createmapping", "cm"],
    )
    _group_args(mapping)
    mapping.add_argument("mappings", nargs="+", type=groups.member_mapping, metavar="member:p1,p2")
    _group_args(
        _command(
            subparsers,
            "delete-mapping",
            groups.delete_mapping,
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
    status_parser = _command(
        kinds,
        "status",
        status.status,
        "a group in the layout it is read in: a row per partition (partition layout) or per "
        "member (member layout) with its consumer, state, pending and last activity; the lag",
    )
    _group_args(status_parser)
    _json_flag(status_parser)
    status_parser.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) with the lag's change per second, until Ctrl-C "
        "(with --json: a document a line)",
    )
    status_parser.add_argument(
        "--count", type=int, metavar="N", help="with --watch: stop after N draws"
    )
    for kind, add_commands in (
        (GroupKind.STATIC, _add_static_commands),
        (GroupKind.ELASTIC, _add_elastic_commands),
    ):
        commands = kinds.add_parser(
            kind.value, help=f"{kind.value} consumer groups", parents=[connection_flags()]
        )
        add_commands(commands.add_subparsers(dest="command", required=True, metavar="<command>"))
    return parser
