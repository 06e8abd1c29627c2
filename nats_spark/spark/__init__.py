"""The Spark formats, a package per product: `group_source/` (format `nats-pcg`), `stream_source/`
(format `nats` reads), `sink/` (format `nats` writes) and `shared/` (what they all use). The entry
points Spark looks up are `group_source/source.py` and `nats_format.py`; `registration.py`
registers both by hand.

PySpark is not a dependency of the package (a Spark runtime brings its own; see pyproject.toml),
so a Python without it, or with a Spark older than the Python data source API's, is named here
on import rather than failing on a missing `pyspark.sql.datasource`.
"""

_NEEDS = (
    "nats-spark's Spark formats need PySpark 4.0 or newer, {found}; on a plain machine "
    "install nats-spark with its spark extra (or pyspark>=4), on Databricks use Runtime 17.3 LTS "
    "or newer"
)

try:
    from pyspark import __version__ as _pyspark_version
except ImportError:
    raise ImportError(_NEEDS.format(found="which this Python lacks")) from None
if int(_pyspark_version.split(".")[0]) < 4:
    raise ImportError(_NEEDS.format(found=f"found {_pyspark_version}"))
