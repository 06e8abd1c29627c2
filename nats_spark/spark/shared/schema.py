"""The source's output schema, as a Spark DDL string and as the Arrow schema `read()` yields."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

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

ARROW_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("data", pa.binary()),
        ("headers", pa.map_(pa.string(), pa.list_(pa.string()))),
        ("partition", pa.int32()),
        ("member", pa.string()),
        ("stream", pa.string()),
        ("stream_seq", pa.int64()),
        ("consumer_seq", pa.int64()),
        ("delivered", pa.int32()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


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
