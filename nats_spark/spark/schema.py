"""The source's output schema, as a Spark DDL string and as the Arrow schema `read()` yields."""

from __future__ import annotations

import pyarrow as pa

SCHEMA_DDL = (
    "subject STRING, data BINARY, headers MAP<STRING, ARRAY<STRING>>, partition INT, "
    "member STRING, stream STRING, stream_seq BIGINT, consumer_seq BIGINT, delivered INT, "
    "timestamp TIMESTAMP"
)

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
