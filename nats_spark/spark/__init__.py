"""The `nats-pcg` Spark source: options, offsets, ledger, driver planning and executor reading.

PySpark is not a dependency of the package (a Spark runtime brings its own; see pyproject.toml),
so a Python without it, or with a Spark older than the Python data source API's, is named here
on import rather than failing on a missing `pyspark.sql.datasource`.
"""

_NEEDS = (
    "nats-spark's Spark formats need PySpark 4.0 or newer, {found}; on a plain machine "
    "pip install 'nats-spark[spark]', on Databricks use Runtime 17.0 or newer"
)

try:
    from pyspark import __version__ as _pyspark_version
except ImportError:
    raise ImportError(_NEEDS.format(found="which this Python lacks")) from None
if int(_pyspark_version.split(".")[0]) < 4:
    raise ImportError(_NEEDS.format(found=f"found {_pyspark_version}"))
