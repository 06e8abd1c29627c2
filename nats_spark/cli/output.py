"""How the commands print: tables, aligned fields, JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces."""
    lines = [list(header), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def fields(pairs: Iterable[tuple[str, Any]]) -> str:
    """`label: value` lines with the values aligned."""
    pairs = list(pairs)
    width = max(len(label) for label, _ in pairs) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in pairs)


def numbers(values: Iterable[int]) -> str:
    return ",".join(map(str, values)) or "-"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def limit(value: int) -> str:
    return str(value) if value > 0 else "unlimited"


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def dash(value: int | None) -> Any:
    return "-" if value is None else value
