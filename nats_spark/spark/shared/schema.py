"""The formats' output schema as Spark sees it (a DDL string), without pyarrow: every Python
process Spark starts to look a format up or plan a query imports this (the Arrow form is in
`columns.py`)."""

from __future__ import annotations

from typing import Any

from nats_spark.errors import ConfigurationError

SCHEMA_FIELDS = (  # name, Spark's simple type string
    ("subject", "string"),
    ("data", "binary"),
    ("headers", "map<string,array<string>>"),
    ("partition", "int"),
    ("member", "string"),
    ("stream", "string"),
    ("stream_seq", "bigint"),
    ("consumer_seq", "bigint"),
    ("delivered", "int"),
    ("timestamp", "timestamp"),
)
SCHEMA_DDL = ", ".join(f"{name} {kind.upper()}" for name, kind in SCHEMA_FIELDS)


def check_schema(schema: Any, source: str = "nats-pcg") -> None:
    """Refuse a user schema (`.schema(...)`) other than the source's own: rows are built in the
    source's shape, and a batch of another shape would fail only after messages were taken."""
    given = tuple((f.name, f.dataType.simpleString()) for f in schema.fields)
    if given != SCHEMA_FIELDS:
        raise ConfigurationError(
            f"{source} has a fixed schema ({SCHEMA_DDL}) and cannot read into "
            f"{', '.join(f'{n} {k.upper()}' for n, k in given) or 'an empty schema'}; drop "
            ".schema(...) and select or cast columns after load()"
        )
