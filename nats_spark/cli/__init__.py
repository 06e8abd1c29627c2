"""`nats-pcg`: administer and try out partitioned consumer groups, like the Go `cg` CLI.

Every command is a small coroutine taking an open `NatsClient` and the parsed arguments and
returning the exit code, in a module per command family: `groups` (create, list, show, delete,
membership), `members` (one member: its state, step-down, reset, consume) and `status` (a group's
consumers and lag, once or watched); `parser` builds the command line. `main` parses, connects,
runs the command on the main thread's event loop and turns any failure into one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from nats_spark.cli.parser import (
    AUTH_FLAGS,
    PROG,
    build_parser,
    connection_flags,
    settings_from_args,
)
from nats_spark.client import NatsClient
from nats_spark.connection import ConnectionSettings
from nats_spark.errors import NatsSparkError

__all__ = ["PROG", "build_parser", "connection_flags", "main", "settings_from_args"]


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
        ways = [f"--{dest}" for dest in AUTH_FLAGS if vars(args).get(dest) is not None]
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
