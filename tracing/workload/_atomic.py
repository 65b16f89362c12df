"""Whole-or-nothing file writes: data goes to a hidden temp file beside the target, then a rename.

``open(..., "xb")`` (not ``mkstemp``) so the file gets the user's umask permissions like any
other output, and an existing temp name is never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_temp(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to a new temp file in ``folder`` named after ``name``; return its path.

    The temp file is removed again if writing fails part-way.
    """
    tmp = folder / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        remove_quietly(tmp)
        raise
    return tmp


def remove_quietly(path: str | os.PathLike[str]) -> None:
    """Remove a file if it is there; never raise (used on error paths)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
