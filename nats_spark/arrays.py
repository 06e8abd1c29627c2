"""Arrow arrays from Python values, assembled from buffers (`array`, joined bytes).

Never by pyarrow's conversion of Python objects (`pa.array`, `pa.scalar`): its first use imports
pandas, when installed, about 0.3 CPU-s and ~29,000 objects in every Spark Python worker.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc

_INT64, _BINARY = pa.int64(), pa.binary()
TYPECODES = {pa.int32(): "i", _INT64: "q"}  # `array` type codes of the integer columns
# Values from which a column is worked by an Arrow kernel rather than in Python: a kernel call
# costs tens of microseconds whatever the size, more than a few values cost one by one.
ARROW_FROM = 256


def int_array(values: Iterable[int], kind: pa.DataType = _INT64) -> pa.Array:
    """An int32 or int64 column of `values` (none null)."""
    words = array(TYPECODES[kind], values)
    return pa.Array.from_buffers(kind, len(words), [None, pa.py_buffer(words)])


def bytes_array(values: Sequence[bytes], kind: pa.DataType = _BINARY) -> pa.Array:
    """A binary or string column of `values` (none null); a string column must be UTF-8, as
    pyarrow's own conversion requires."""
    column = pa.Array.from_buffers(
        kind, len(values), [None, _offsets(values), pa.py_buffer(b"".join(values))]
    )
    if kind == pa.string():
        column.validate(full=True)  # ArrowInvalid names the first row that is not UTF-8
    return column


def _offsets(values: Sequence[bytes]) -> pa.Buffer:
    """Where each of `values` starts in their join, and where the last ends (int32): summed by
    Arrow's kernel, or for a few values in Python, where the kernel's fixed cost is more."""
    if len(values) < ARROW_FROM:
        return pa.py_buffer(array("i", accumulate(map(len, values), initial=0)))
    lengths = array("i", (0,))
    lengths.fromlist(list(map(len, values)))  # through a list: array() steps an iterator slowly
    return pc.cumulative_sum(int_array(lengths, pa.int32())).buffers()[1]


def string_scalar(value: bytes) -> pa.Scalar:
    """A string scalar (UTF-8 `value`), for Arrow's kernels."""
    return bytes_array([value], pa.string())[0]
