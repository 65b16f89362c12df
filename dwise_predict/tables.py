"""Plain aligned text tables for the CLI, reports and benchmarks (no third-party dependency)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def format_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], floatfmt: str = ".3g"
) -> str:
    """A plain aligned text table (no third-party dependency)."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return format(v, floatfmt)
        return str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    right = [all(_numeric(r[i]) for r in cells) for i in range(len(headers))]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if rj else v.ljust(w) for v, w, rj in zip(vals, widths, right)
        ).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _numeric(s: str) -> bool:
    try:
        float(s.rstrip("x%"))
        return True
    except ValueError:
        return False
