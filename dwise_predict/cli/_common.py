"""Helpers shared by the subcommands: progress bars, tables, stub commands."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def progress(
    iterable: Iterable[T] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    quiet: bool = False,
    **kwargs: Any,
) -> Any:
    """A tqdm bar that turns itself off when stderr is not a terminal or ``quiet`` is set."""
    from tqdm.auto import tqdm

    disable = quiet or not sys.stderr.isatty()
    return tqdm(
        iterable, total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True, **kwargs
    )


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
