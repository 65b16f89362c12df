"""Helpers shared by the subcommands: progress bars."""

from __future__ import annotations

import sys
from collections.abc import Iterable
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
