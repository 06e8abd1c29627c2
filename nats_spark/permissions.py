"""The least NATS permissions a `nats-pcg` query needs to read a static group, as a nats-server
`authorization` block: `python -m nats_spark.permissions STREAM [LEDGER_BUCKET]` prints it for
your names. Errors of a refused subject point here, as an installed package carries no docs
(docs/security.md shows the same block, and a test keeps the two equal)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

DEFAULT_LEDGER = "nats-spark-ledger"  # the ledgerBucket option's default
_STATIC, _ELASTIC = "KV_static-consumer-groups", "KV_elastic-consumer-groups"
_COMMENT_COLUMN = 56  # where the block's comments start, as far as the subjects leave room


def publish_allowed(stream: str, ledger: str = DEFAULT_LEDGER) -> list[tuple[str, str]]:
    """The subjects a query's user publishes to, each with why where it is not plain."""
    kv = f"KV_{ledger}"
    return [
        (f"$JS.API.STREAM.INFO.{stream}", ""),
        (f"$JS.API.STREAM.MSG.GET.{stream}", "replays a batch Spark re-runs"),
        (f"$JS.API.CONSUMER.CREATE.{stream}.>", ""),
        (f"$JS.API.CONSUMER.INFO.{stream}.>", ""),
        (f"$JS.API.CONSUMER.LIST.{stream}", "planning at 8 partitions or more"),
        (f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>", ""),
        (f"$JS.API.CONSUMER.UNPIN.{stream}.>", "releases its own pins at stop, a dead query's"),
        (f"$JS.ACK.{stream}.>", ""),
        (f"$JS.API.STREAM.INFO.{_STATIC}", ""),
        (f"$JS.API.STREAM.INFO.{_ELASTIC}", "groupType=auto looks in both"),
        (f"$JS.API.STREAM.MSG.GET.{_STATIC}", ""),
        (f"$JS.API.DIRECT.GET.{_STATIC}.>", "buckets made by Go or the nats CLI"),
        (f"$JS.API.STREAM.INFO.{kv}", ""),
        (f"$JS.API.STREAM.CREATE.{kv}", "first query only"),
        (f"$JS.API.STREAM.MSG.GET.{kv}", "reads the ledger's entries"),
        (f"$JS.API.CONSUMER.CREATE.{kv}", "lists the ledger's keys"),
        (f"$JS.API.CONSUMER.INFO.{kv}.>", ""),
        (f"$JS.API.STREAM.PURGE.{kv}", "removes settled entries"),
        (f"$KV.{ledger}.>", ""),
    ]


def authorization_block(stream: str, ledger: str = DEFAULT_LEDGER) -> str:
    """A nats-server config block with a user `spark` allowed exactly these subjects."""
    allowed = publish_allowed(stream, ledger)
    lines = []
    for n, (subject, why) in enumerate(allowed):
        line = f'    "{subject}"' + ("," if n < len(allowed) - 1 else "")
        lines.append(f"{(line + ' ').ljust(_COMMENT_COLUMN)}# {why}" if why else line)
    return "\n".join(
        [
            'authorization { users = [ { user: spark, password: "...", permissions: {',
            "  publish: { allow: [",
            *lines,
            "  ] },",
            '  subscribe: { allow: ["_INBOX.>"] }',
            "} } ] }",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m nats_spark.permissions",
        description="Print the least NATS permissions a nats-pcg query on a static group needs.",
    )
    parser.add_argument("stream", help="the stream the query reads")
    parser.add_argument("ledger", nargs="?", default=DEFAULT_LEDGER, help="the ledgerBucket")
    args = parser.parse_args(argv)
    print(authorization_block(args.stream, args.ledger))


if __name__ == "__main__":
    main()
