"""Arrow arrays from Python values, assembled from buffers (`array`, joined bytes).

Never by pyarrow's conversion of Python objects (`pa.array`, `pa.scalar`): its first use imports
pandas, when installed, about 0.3 CPU-s and ~29,000 objects in every Spark Python worker.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

_INT64, _BINARY = pa.int64(), pa.binary()
TYPECODES = {pa.int32(): "i", _INT64: "q"}  # `array` type codes of the integer columns


def int_array(values: Iterable[int], kind: pa.DataType = _INT64) -> pa.Array:
    """An int32 or int64 column of `values` (none null)."""
    words = array(TYPECODES[kind], values)
    return pa.Array.from_buffers(kind, len(words), [None, pa.py_buffer(words)])


def bytes_array(values: Sequence[bytes], kind: pa.DataType = _BINARY) -> pa.Array:
    """A binary or string column of `values` (none null); a string column must be UTF-8, as
    pyarrow's own conversion requires."""
    lengths = array("i", (0,))
    lengths.fromlist(list(map(len, values)))  # through a list: array() steps an iterator slowly
    offsets = pc.cumulative_sum(int_array(lengths, pa.int32())).buffers()[1]
    column = pa.Array.from_buffers(
        kind, len(values), [None, offsets, pa.py_buffer(b"".join(values))]
    )
    if kind == pa.string():
        column.validate(full=True)  # ArrowInvalid names the first row that is not UTF-8
    return column


def string_scalar(value: bytes) -> pa.Scalar:
    """A string scalar (UTF-8 `value`), for Arrow's kernels."""
    return bytes_array([value], pa.string())[0]
